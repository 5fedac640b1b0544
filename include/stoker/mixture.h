// Weighted mixtures: batches drawn from several sources in given proportions, each source walked
// through an exactly-once order of its own.
//
// The sources lie end to end (MixtureSource, include/stoker/sources/mixture.h): source c's local
// sample j is global sample offset_c + j, offset_c = n_0 + ... + n_{c-1}, N = n_0 + ... + n_{C-1}.
//
// Epochs. A mixture epoch has exactly the batches of a plain BatchPlan over N samples (same
// num_batches(), batch_length(), padding and drop_last rule), so len(loader) is that of the sources
// concatenated; rank r's batch b is row g = b * world_size + r of the epoch, and the rows of one
// step (batch b of every rank) are consecutive. A mixture epoch is a number of batches, not a pass
// over every source: each source counts its own epochs (below).
//
// Count rule. A row of length L holds source c exactly floor(L * w_c) or ceil(L * w_c) times
// (w normalized to sum 1; a source of weight 0 is not drawn), the counts summing to L. The floors
// are given first; the L - sum(floor) extras go, one each, to the sources with a fractional
// share whose accumulated deficit (target - allocated, over this plan's rows since its start or
// the latest phase change) is largest, ties broken by a seeded order of the sources per epoch.
// Cumulative counts over a phase then stay within one sample of their target (tested, not
// proven in general). Weights are kept to 32 bits of precision relative to the largest.
//
// Streams. Source c's draws form a stream that runs across mixture epochs: stream position p is
// sample EpochOrder(n_c, shuffle, mixture_source_seed(seed, c), k)[j], (k, j) = divmod(p, n_c).
// k is the source's own epoch: every sample of a source is drawn once before any is drawn again,
// and k keys the draw's randomness (SampleKey{mixture_source_seed(seed, c), k, j}), so that the
// repeats of a sample are augmented anew. A row's draws of source c are the next positions of its
// stream after those of the rows before it (all ranks' rows); a seeded shuffle of the row then
// mixes the sources (shuffle=false: sources in order, ties in source order, no randomness).
//
// Schedules. Weights are phases (first_step, weights): the phase in force at step s is the last
// one whose first_step <= s (the first phase also covers the steps before it). Batch b of a plan
// is step first_step + b, so every rank uses the same weights at a step.
//
// Resume. A plan starts at (position, first_step, bases): the epoch's global position (as
// BatchPlan's start: samples consumed by earlier plans of this epoch), the step of its first
// batch and each stream's position. draws_after(b) is each stream's position once every rank
// has delivered b batches: with position_after(b) and first_step + b, the start of a plan that
// continues every stream exactly where it stopped, with any world size and any weights. Rows
// depend only on the plan's inputs: a plan resumed at batch b of the same inputs yields the same
// batches; one started at the save point (a new world size or schedule) lays out its rows anew.
//
// Memory: O(C) per plan, plus a cache of each source's draws and deficit every kCheckpointRows
// rows, 16 * C bytes each, filled as rows are asked for (a batch replays < kCheckpointRows rows:
// O(kCheckpointRows * C + L) time). No per-sample array exists.
//
// Thread safety: MixturePlan is immutable but for its checkpoint cache, which a mutex guards;
// safe to share between threads.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "stoker/order.h"

namespace stoker {

// From step first_step on, draw the sources in proportion to `weights` (one per source).
struct MixturePhase {
  uint64_t first_step = 0;
  std::vector<double> weights;
};

// What every epoch's plan of a mixture shares: the sources' sizes and the schedule.
// REQUIRES (checked by MixturePlan, InvalidArgument): at least one source, fewer than 2^20;
// phases in strictly increasing first_step, at least one; each phase's weights finite, >= 0,
// summing to > 0, and 0 for an empty source.
struct MixtureOrder {
  std::vector<uint64_t> sizes;
  std::vector<MixturePhase> schedule;
};

// Where a plan starts (see Resume above). Empty bases: every stream at 0.
struct MixtureStart {
  uint64_t position = 0;
  uint64_t first_step = 0;
  std::vector<uint64_t> bases;
};

// The seed of source c's stream permutations and of its samples' randomness.
uint64_t mixture_source_seed(uint64_t seed, uint64_t source);

class MixturePlan {
 public:
  static constexpr uint64_t kCheckpointRows = 32;

  // Rank `rank`'s batches of mixture epoch `epoch` (which keys the ties and the row shuffle).
  // REQUIRES (InvalidArgument otherwise): a valid order (above); bases empty or one per source;
  // what BatchPlan(N, batch_size, drop_last, rank, world_size, start.position) requires.
  MixturePlan(MixtureOrder order, uint64_t seed, bool shuffle, uint64_t epoch, uint64_t batch_size,
              bool drop_last, uint64_t rank, uint64_t world_size, MixtureStart start = {});
  MixturePlan(const MixturePlan&) = delete;
  MixturePlan& operator=(const MixturePlan&) = delete;

  // Where epoch `epoch` starts when every epoch before it ran whole with this order and world
  // size: position 0, first_step = epoch * num_batches, the streams where epoch - 1 left them.
  // O(epoch * rows * C) time.
  static MixtureStart epoch_start(const MixtureOrder& order, uint64_t seed, bool shuffle,
                                  uint64_t epoch, uint64_t batch_size, bool drop_last,
                                  uint64_t world_size);

  const MixtureOrder& order() const { return order_; }
  uint64_t num_sources() const { return order_.sizes.size(); }
  uint64_t seed() const { return seed_; }
  bool shuffle() const { return shuffle_; }
  uint64_t epoch() const { return epoch_; }
  const MixtureStart& start() const { return start_; }
  // The plain plan whose batches this one fills (num_batches, batch_length, position_after).
  const BatchPlan& batches() const { return plan_; }
  uint64_t num_batches() const { return plan_.num_batches(); }
  // The weights in force at step `step`, as given.
  const std::vector<double>& weights_at(uint64_t step) const;

  // The global samples of this rank's batch b, in batch order, and, when `cycles` is not empty,
  // each draw's cycle k (its source's own epoch), which keys its randomness.
  // REQUIRES: b < num_batches(), out.size() == batches().batch_length(b), cycles empty or of
  // out's size (InvalidArgument otherwise).
  void batch(uint64_t b, std::span<uint64_t> out, std::span<uint64_t> cycles = {}) const;
  // How many samples of each source this rank's batch b holds. REQUIRES: b < num_batches().
  std::vector<uint64_t> batch_counts(uint64_t b) const;
  // Each stream's position once every rank has delivered its first `batches` batches.
  // REQUIRES: batches <= num_batches() (InvalidArgument otherwise).
  std::vector<uint64_t> draws_after(uint64_t batches) const;
  // Each stream's position at the end of the epoch: draws_after(num_batches()).
  std::vector<uint64_t> epoch_end() const { return draws_after(num_batches()); }

  struct Phase;
  struct Cursor;

 private:
  // The state before row `row` (its draws and deficits), from the nearest checkpoint.
  Cursor cursor_at(uint64_t row) const;
  // Row `row`'s counts into `counts`; moves `cursor` past it. REQUIRES: cursor at `row`.
  void advance(Cursor& cursor, std::vector<uint64_t>& counts) const;
  size_t phase_at(uint64_t row) const;

  MixtureOrder order_;
  uint64_t seed_, epoch_;
  bool shuffle_;
  uint64_t rank_, world_;
  MixtureStart start_;
  BatchPlan plan_;
  uint64_t rows_ = 0;                   // num_batches() * world_size
  std::vector<uint64_t> offsets_;       // per source: its first global sample
  std::vector<uint64_t> stream_seeds_;  // per source
  std::vector<uint32_t> tie_rank_;      // per source: its place in the epoch's tie order
  std::vector<std::shared_ptr<const Phase>> phases_;  // quantized schedule

  mutable std::mutex mu_;
  // Checkpoint i: the draws (since the plan's start) and deficits before row i * kCheckpointRows,
  // C of each, flattened. Guarded by mu_.
  mutable std::vector<uint64_t> checkpoint_draws_;
  mutable std::vector<int64_t> checkpoint_deficits_;
};

}  // namespace stoker
