// The order in which an epoch visits samples, how it is split across ranks, and how each rank's
// share is cut into batches.
//
// EpochOrder is a permutation of [0, n) that depends only on (seed, epoch): position -> sample in
// O(1) time and O(1) memory (a keyed Feistel network with cycle-walking), so no n-element array is
// ever built and resuming at any position costs nothing.
//
// BatchPlan follows torch's DistributedSampler: the global order is split round-robin, rank r takes
// global positions r, r + world_size, r + 2 * world_size, ...; every rank gets the same number of
// samples, by wrapping around to the start of the order (drop_last=false) or by dropping the tail
// (drop_last=true). Each rank's samples are then cut into batches of batch_size; with drop_last the
// final partial batch is dropped, otherwise it is kept short.
//
// Elastic resume: a plan may begin at a global position `start` > 0, when a job (of any world
// size) already consumed positions [0, start) of this epoch's order. The positions left, start ..
// n - 1, are split as above among this job's ranks: rank r takes start + r, start + r +
// world_size, ...; padding wraps to the start of the epoch's order (position p >= n is p mod n),
// as DistributedSampler pads. Because the ranks of a job deliver their batches in step, what a job
// has consumed after b batches on every rank is again a prefix of the order, [0,
// position_after(b)): the start of the plan that resumes the epoch with any world size, nested to
// any depth. With the same rank and world size, the plan from position_after(b) yields exactly
// batches b, b + 1, ... of this one (padding included), so resuming never changes a batch.
//
// A strided plan (strided(first, step)) is a view whose batch j is this plan's batch first + j *
// step: one of `step` producers that share a rank's epoch (Ray offload actors) takes every
// step-th batch, and each of them iterates its view as an ordinary plan.
//
// Repeated augmentation (DeiT's RASampler; EngineOptions::repeats = k): an epoch has n * k
// global positions, split into ranks and batches by a BatchPlan of n * k samples; position p
// holds copy p % k of the sample at position p / k of the epoch's order, so a sample's copies
// sit at k consecutive positions (with torchrun's ranks, on different ranks), and copy r of an
// epoch-e sample draws its randomness from cycle e * k + r in place of the epoch. k = 1 is the
// plain order, keyed by the epoch.
//
// Thread safety: both types are immutable values, safe to share.
#pragma once

#include <cstdint>
#include <span>

namespace stoker {

// A position of an epoch with `repeats` copies of every sample: the position in the order it
// copies, and the cycle that keys the copy's randomness.
struct RepeatedPosition {
  uint64_t position;
  uint64_t cycle;
};
// REQUIRES: repeats >= 1.
constexpr RepeatedPosition repeated_position(uint64_t global_position, uint64_t repeats,
                                             uint64_t epoch) {
  return {global_position / repeats, epoch * repeats + global_position % repeats};
}

class EpochOrder {
 public:
  // REQUIRES: nothing; n may be 0.
  EpochOrder(uint64_t n, bool shuffle, uint64_t seed, uint64_t epoch);

  uint64_t size() const { return n_; }
  // The sample at `position`. REQUIRES: position < size().
  uint64_t operator[](uint64_t position) const;
  // out[i] = (*this)[positions[i]] for every i. The permutations run side by side, so the CPU
  // overlaps them: ~3x faster than one operator[] after another. `out` may be `positions`.
  // REQUIRES: out.size() == positions.size(); every position < size().
  void map(std::span<const uint64_t> positions, std::span<uint64_t> out) const;

 private:
  uint64_t permute(uint64_t x) const;  // a bijection on [0, 2^(2 * half_bits_))

  static constexpr int kRounds = 6;
  uint64_t n_;
  bool shuffle_;
  int half_bits_ = 0;
  uint64_t half_mask_ = 0;
  uint64_t round_keys_[kRounds] = {};
};

class BatchPlan {
 public:
  // REQUIRES: batch_size >= 1, world_size >= 1, rank < world_size, start <= num_samples
  // (InvalidArgument otherwise). start = num_samples leaves nothing: zero batches.
  BatchPlan(uint64_t num_samples, uint64_t batch_size, bool drop_last, uint64_t rank,
            uint64_t world_size, uint64_t start = 0);

  uint64_t num_samples() const { return n_; }  // the epoch's samples, consumed or not
  uint64_t batch_size() const { return batch_size_; }
  uint64_t start() const { return start_; }
  // Samples of this plan's batches together (for a rank's whole plan: its share of the epoch,
  // padding included).
  uint64_t samples_per_rank() const { return samples_; }
  uint64_t num_batches() const { return num_batches_; }
  // Samples in batch b (batch_size, or fewer for a final partial batch). REQUIRES: b <
  // num_batches().
  uint64_t batch_length(uint64_t b) const;
  // Position in the global order of the plan's k-th sample (k = b * batch_size + s for sample s
  // of batch b), already wrapped into [0, n). REQUIRES: k < num_batches() * batch_size() and
  // k % batch_size() < batch_length(k / batch_size()).
  uint64_t global_position(uint64_t k) const;

  // The global position of batch b's first sample before it is wrapped into [0, n): start() +
  // rank + (the unstrided batch number) * batch_size * world_size. It is distinct for every batch
  // of every rank of a plan (padding included, where the wrapped positions repeat), and the same
  // for the same batch of the same plan, however iterated: the key of a batch's own randomness
  // (batch_transform.h). REQUIRES: b < num_batches().
  uint64_t first_position(uint64_t b) const {
    return start_ + rank_ + unstrided_batch(b) * batch_size_ * world_size_;
  }

  // The global position up to which the epoch is consumed once every rank of this job has
  // delivered its first `batches` batches: start() + batches * batch_size * world_size, or
  // num_samples() when that is the whole plan (nothing is left: its padding or dropped tail are
  // part of the finished epoch). REQUIRES: batches <= num_batches(), an unstrided plan
  // (InvalidArgument otherwise).
  uint64_t position_after(uint64_t batches) const;

  // The view whose batch j is this plan's batch first + j * step (no batch when first >=
  // num_batches()). Views compose. REQUIRES: step >= 1 (InvalidArgument otherwise).
  BatchPlan strided(uint64_t first, uint64_t step) const;
  bool is_strided() const { return first_ != 0 || step_ != 1; }
  // The unstrided plan's number of this view's batch b.
  uint64_t unstrided_batch(uint64_t b) const { return first_ + b * step_; }

 private:
  uint64_t n_, batch_size_, rank_, world_size_, start_;
  uint64_t per_rank_ = 0;          // the rank's samples in the unstrided plan
  uint64_t all_batches_ = 0;       // batches of the unstrided plan
  uint64_t first_ = 0, step_ = 1;  // this view's batch j is the unstrided plan's first_ + j * step_
  uint64_t num_batches_ = 0, samples_ = 0;  // of this view
};

}  // namespace stoker
