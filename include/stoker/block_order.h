// A shuffled epoch order that keeps locality, for sources whose samples live in blocks that cost
// much more to open than to read from once open (Parquet row groups, which must be decompressed
// whole; remote shards).
//
// The samples [0, n) are cut into consecutive blocks (Source::blocks(): their sizes). In epoch e:
// - the blocks are permuted (a keyed Feistel permutation of the block numbers, from (seed, e));
// - the permuted blocks are taken `window` at a time (the last window may hold fewer);
// - the samples of each window are permuted (a keyed permutation of the window's samples, from
//   (seed, e, window number)).
// So an epoch visits every sample exactly once, and every block is read within one window's run
// of positions: a reader that keeps the blocks of two windows (the one being read and the next,
// which workers ahead of the consumer start on) decodes each block once per epoch. window >= the
// number of blocks gives one window: a full permutation of the samples.
//
// Cost: position -> sample is O(log blocks); an epoch's order keeps O(blocks) numbers (the
// permuted blocks and their runs), never a per-sample array. The order depends only on (block
// sizes, window, seed, epoch), so resume state stays (epoch, position), ranks split positions as
// with EpochOrder (order.h), and the batches are the same whatever the worker count.
//
// Thread safety: immutable after construction, safe to share.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "stoker/order.h"

namespace stoker {

class BlockOrder {
 public:
  // REQUIRES: every size >= 1, window >= 1 (InvalidArgument otherwise); no blocks is an empty
  // order.
  BlockOrder(std::span<const uint64_t> block_sizes, uint64_t window, uint64_t seed,
             uint64_t epoch);

  uint64_t size() const { return slot_start_.back(); }
  // The sample at `position`. REQUIRES: position < size().
  uint64_t operator[](uint64_t position) const;
  // out[i] = (*this)[positions[i]]. `out` may be `positions`. REQUIRES: equal sizes.
  void map(std::span<const uint64_t> positions, std::span<uint64_t> out) const;

 private:
  std::vector<uint64_t> block_first_;   // first sample of each block, by block number
  std::vector<uint64_t> slot_block_;    // the block at each slot of the permuted sequence
  std::vector<uint64_t> slot_start_;    // first position of each slot; back() = n
  std::vector<uint64_t> window_slot_;   // first slot of each window; back() = number of slots
  std::vector<EpochOrder> window_perm_;  // each window's permutation of its samples
};

}  // namespace stoker
