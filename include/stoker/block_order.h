// A shuffled epoch order that keeps locality, for sources whose samples live in blocks that cost
// much more to open than to read from once open (Parquet row groups, which must be decompressed
// whole; remote shards, each a request).
//
// The samples [0, n) are cut into consecutive blocks (Source::blocks() or Source::shards(): their
// sizes). The order is made for `stripes` = S ranks (the world size the epoch is arranged for;
// ranks take global positions by striding, rank r of S the positions p with p % S == r, order.h).
// In epoch e:
// - the blocks are permuted (a keyed Feistel permutation of the block numbers, from (seed, e));
// - the permuted blocks are taken `window * S` at a time (a window; the last may hold fewer), and
//   window w's blocks are dealt to S groups: group g gets the window's permuted blocks
//   [g * window, (g + 1) * window) (groups of the last window may hold fewer, or none);
// - the window's positions [a_w, a_{w+1}) hold its samples. Class c of the window is its positions
//   p with p % S == c (the GLOBAL position: class c is what rank c of an S-rank job reads); n_c of
//   them, and m_g samples in group g. Each group's samples are permuted (a keyed permutation from
//   (seed, e, w, g)). Class c's j-th position (in increasing order) holds, for j < min(m_c, n_c),
//   group c's j-th permuted sample; the positions left over (j >= m_c, when m_c < n_c: the
//   deficit) take the overflow pool in order: the pool is every group's permuted samples past its
//   class's size ([n_g, m_g), when m_g > n_g), concatenated by group, then permuted (keyed from
//   (seed, e, w)). Deficit positions are numbered by class, then by j.
// The windows' sizes match the groups' totals, so this is a bijection: an epoch visits every
// sample exactly once. With blocks of equal size, a full window has n_c = m_c for every class:
// rank c of an S-rank job reads exactly group c's `window` blocks, not window * S; sizes that
// differ a little move a few overflow samples a window to other ranks (in a last window that is
// partly filled, ranks whose groups are short read the others' overflow). The blocks' runs are
// still windows, so a reader that keeps the blocks of two windows decodes each block once an
// epoch. window * S >= the number of blocks gives one window.
//
// S = 1 is the unstriped order: one group per window, the window's samples permuted (the order of
// every release before stripes existed, bit for bit). A job of another world size W than S reads
// the same order, each sample once, only with less locality (a rank's positions then cross
// several classes, so it reads from several groups a window); an elastic resume keeps the S its
// epoch started with (python/stoker/_state.py), later epochs take the new world size.
//
// Cost: position -> sample is O(log blocks + log S); an epoch's order keeps O(blocks + S) numbers
// (the permuted blocks and their runs; per window and group a permutation and two prefix counts,
// blocks / window + S of them), never a per-sample array. The order depends only on (block sizes,
// window, S, seed, epoch), so resume state stays (epoch, position) with S, ranks split positions as
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
  // REQUIRES: every size >= 1, window >= 1, stripes >= 1 (InvalidArgument otherwise); no blocks
  // is an empty order.
  BlockOrder(std::span<const uint64_t> block_sizes, uint64_t window, uint64_t stripes,
             uint64_t seed, uint64_t epoch);
  // The unstriped order (stripes = 1).
  BlockOrder(std::span<const uint64_t> block_sizes, uint64_t window, uint64_t seed, uint64_t epoch)
      : BlockOrder(block_sizes, window, 1, seed, epoch) {}

  uint64_t size() const { return slot_start_.back(); }
  uint64_t num_blocks() const { return block_first_.size(); }
  uint64_t window() const { return window_; }
  uint64_t stripes() const { return stripes_; }

  // The sample at `position`. REQUIRES: position < size().
  uint64_t operator[](uint64_t position) const;
  // out[i] = (*this)[positions[i]]. `out` may be `positions`. REQUIRES: equal sizes.
  void map(std::span<const uint64_t> positions, std::span<uint64_t> out) const;

  // The block of the sample at `position`. REQUIRES: position < size().
  uint64_t block_at(uint64_t position) const;
  // The block that holds `sample`. REQUIRES: sample < size().
  uint64_t block_of_sample(uint64_t sample) const;

  // The distinct blocks that positions start + rank, start + rank + world_size, ... (those below
  // size(): one rank's share of an epoch resumed at `start`, without BatchPlan's padding) read,
  // in order of first use: what a fetcher of remote blocks downloads, in this order. Cost: one
  // block_at per position, O((size() - start) / world_size * log blocks) time, O(blocks) memory:
  // a walk over the rank's epoch, to be made once an epoch (or resume), not per batch.
  // REQUIRES: world_size >= 1 (InvalidArgument otherwise).
  std::vector<uint64_t> blocks_in_order(uint64_t start, uint64_t rank, uint64_t world_size) const;

 private:
  struct Slot {
    uint64_t slot;    // in the permuted sequence
    uint64_t offset;  // of the sample in its block
  };
  Slot locate(uint64_t position) const;
  // The slot of the i-th sample of group g of window w (before the group's permutation).
  Slot group_sample(uint64_t w, uint64_t g, uint64_t i) const;
  uint64_t group_first_slot(uint64_t w, uint64_t g) const;
  // Positions of class c in window w.
  uint64_t class_size(uint64_t w, uint64_t c) const;

  uint64_t window_ = 1;
  uint64_t stripes_ = 1;
  std::vector<uint64_t> block_first_;  // first sample of each block, by block number
  std::vector<uint64_t> slot_block_;   // the block at each slot of the permuted sequence
  std::vector<uint64_t> slot_start_;   // first position of each slot; back() = n
  std::vector<uint64_t> window_slot_;  // first slot of each window; back() = number of slots
  // Per window w and group g, at w * stripes_ + g: the group's permutation of its samples.
  std::vector<EpochOrder> group_perm_;
  // stripes_ > 1 only. Per window, at w * (stripes_ + 1) + c: the deficit positions of classes
  // before c, and the excess samples of groups before c (so [c + 1] - [c] is class c's deficit,
  // resp. group c's excess; each ends with the window's pool size).
  std::vector<uint64_t> deficit_before_;
  std::vector<uint64_t> excess_before_;
  std::vector<EpochOrder> pool_perm_;  // per window: the permutation of its overflow pool
};

}  // namespace stoker
