// Batches by a budget: tokens, seconds or pixels per batch instead of a number of samples.
//
// Samples of unequal lengths batched by count waste most of a step on padding, or run out of
// memory on the longest batch. A BudgetPlan forms an epoch's batches so that each batch's cost
// stays within a budget, and gives every rank the same number of batches, each step's batches
// from one bucket of similar lengths (so that the ranks' steps cost about the same).
//
// The plan, from the samples' lengths (in the budget's unit, known without reading a sample:
// token counts from an index, durations from a header) and the options:
// - Buckets. A sample belongs to the first bucket whose upper bound exceeds its length (the last
//   bucket is open). Bounds are given, or chosen from the lengths ("auto": kAutoBuckets buckets,
//   each holding about the same total length). Or the buckets are given, one a sample
//   (bucket_of: images in aspect-ratio buckets, whose batches must not mix shapes): bucket j
//   holds the samples given j, and there are no bounds.
// - Cost. A batch of B samples whose longest has length L costs B * L (kPadded: the padded
//   batch), the sum of its lengths (kSum), or B * (L + L * L / q) (kQuadratic: attention's cost,
//   q = quadratic_length). A batch never costs more than the budget and never holds more than
//   max_batch_size samples. A sample whose cost alone exceeds the budget is oversized: it is in
//   no batch, and oversized() lists it (a front raises an error naming it, or counts it skipped).
// - An epoch (epoch()). Each bucket's samples are permuted by (seed, epoch, bucket) (not with
//   shuffle = false), cut into windows of kSortWindow samples, each window sorted by length (ties
//   by index; up and down in turn, so that lengths change smoothly from one window to the next),
//   and filled greedily into batches in that order; runs of kBatchRun consecutive batches are
//   then permuted by (seed, epoch, bucket), but for the run holding the bucket's last batch (the
//   one partly filled), which stays last. So batches hold neighbours in length (little padding),
//   a step's batches are neighbours too (about the same cost on every rank), and both differ from
//   epoch to epoch. Every sample that is not oversized is in exactly one batch.
// - Steps and ranks. A step gives each of world_size ranks one batch, all from one bucket: rank r
//   takes the bucket's next batches c + r (c: the bucket's batches consumed before the step). A
//   bucket with b batches left has b / world_size whole steps; its last b % world_size batches
//   are dropped (kDrop: their samples wait for the next epoch, counted in dropped_batches()), or
//   made up to a whole step by repeating the bucket's first batches (kRepeat: counted in
//   repeated_batches()). The buckets' steps are interleaved by a seeded shuffle of the epoch's
//   step list (with shuffle = false: bucket after bucket). Every rank thus has the same number of
//   batches, known when the epoch is planned.
// - Resume. What a job has consumed after k steps is, in every bucket, a prefix of that bucket's
//   batches: consumed_after(k), one count per bucket. An epoch planned from such counts (any
//   world size) holds exactly the batches left, so a resume is exact mid-epoch and elastic across
//   world sizes, nested to any depth, and its state is O(buckets). With the counts and world size
//   that planned an epoch, the plan is the same batches in the same steps.
//
// Everything depends only on (lengths, options, seed, epoch, consumed counts, world size): never
// on threads, workers or timing.
//
// Thread safety: BudgetPlan and BudgetEpoch are immutable after construction, safe to share.
// Errors: InvalidArgument for options or arguments outside what is stated.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace stoker {

enum class BudgetCost { kPadded, kSum, kQuadratic };
enum class BudgetRemainder { kDrop, kRepeat };

struct BudgetOptions {
  double budget = 0;  // > 0, in the lengths' unit (kQuadratic: the same unit)
  BudgetCost cost = BudgetCost::kPadded;
  // kQuadratic's q (> 0); 0 = the longest length.
  double quadratic_length = 0;
  // Ascending upper bounds of the buckets but the last (which is open); empty = auto.
  std::vector<double> bucket_bounds;
  // Each sample's bucket, given (empty: by length, as above). REQUIRES: one a sample, and no
  // bucket_bounds with it.
  std::vector<uint32_t> bucket_of;
  uint64_t max_batch_size = 0;  // 0 = no limit but the budget
  BudgetRemainder remainder = BudgetRemainder::kDrop;
};

// Buckets chosen when none are given, at most (fewer when there are few distinct lengths).
inline constexpr uint64_t kAutoBuckets = 32;
// Samples sorted together by length within a bucket's epoch order.
inline constexpr uint64_t kSortWindow = 4096;
// Consecutive batches of a bucket kept together when its batches are permuted.
inline constexpr uint64_t kBatchRun = 32;

class BudgetEpoch;

class BudgetPlan {
 public:
  // REQUIRES: every length finite and >= 0; options as stated above (InvalidArgument).
  BudgetPlan(std::vector<double> lengths, BudgetOptions options);

  uint64_t num_samples() const { return lengths_.size(); }
  const BudgetOptions& options() const { return options_; }
  double length(uint64_t i) const { return lengths_[i]; }
  // The buckets' upper bounds (all but the last bucket's), as given or chosen; empty where the
  // buckets were given (bucket_of).
  const std::vector<double>& bucket_bounds() const { return bounds_; }
  uint64_t num_buckets() const { return buckets_.size(); }
  // The samples of bucket j, ascending. REQUIRES: j < num_buckets().
  std::span<const uint64_t> bucket(uint64_t j) const { return buckets_[j]; }
  // Samples whose cost alone exceeds the budget, ascending: in no batch.
  const std::vector<uint64_t>& oversized() const { return oversized_; }
  // The cost of a batch of `count` samples whose lengths sum to `sum` and whose longest is `max`.
  double cost(uint64_t count, double sum, double max) const;
  // The most samples any batch of any epoch can hold.
  uint64_t max_batch_size() const { return max_batch_size_; }
  // The most padded elements (count * the longest of `element_lengths` in the batch, rounded up
  // to `multiple`) any batch of any epoch can have, where element_lengths[i] is sample i's
  // length in the unit of a field's first dimension (a token count, audio frames). REQUIRES:
  // element_lengths.size() == num_samples(), multiple >= 1.
  uint64_t max_padded_elements(std::span<const uint64_t> element_lengths, uint64_t multiple) const;

  // The epoch's batches of `rank` of `world_size`, from the point where the buckets' first
  // `consumed` batches were delivered (empty: the epoch's start). REQUIRES: rank < world_size,
  // consumed empty or of num_buckets() counts (InvalidArgument otherwise; a count past a
  // bucket's batches is read as the whole bucket).
  std::shared_ptr<const BudgetEpoch> epoch(uint64_t seed, uint64_t epoch, bool shuffle,
                                           uint64_t rank, uint64_t world_size,
                                           std::vector<uint64_t> consumed = {}) const;

 private:
  std::vector<double> lengths_;
  BudgetOptions options_;
  std::vector<double> bounds_;
  std::vector<std::vector<uint64_t>> buckets_;
  std::vector<uint64_t> oversized_;
  uint64_t max_batch_size_ = 0;
};

// One rank's batches of one epoch (BudgetPlan::epoch).
class BudgetEpoch {
 public:
  uint64_t epoch() const { return epoch_; }
  uint64_t rank() const { return rank_; }
  uint64_t world_size() const { return world_size_; }
  // Batches of this rank, one a step: the same for every rank.
  uint64_t num_batches() const { return steps_.size(); }
  // The samples of batch (step) b, in batch order. REQUIRES: b < num_batches().
  std::span<const uint64_t> batch(uint64_t b) const;
  // The bucket of step b. REQUIRES: b < num_batches().
  uint64_t bucket_of(uint64_t b) const;
  // The consumed counts the epoch was planned from, and after its first `steps` steps on every
  // rank: what a state saves. REQUIRES: steps <= num_batches().
  const std::vector<uint64_t>& consumed() const { return consumed_; }
  std::vector<uint64_t> consumed_after(uint64_t steps) const;
  // Every batch of step b, rank by rank (world_size() lists of samples): a step's cost spread.
  std::vector<std::span<const uint64_t>> step(uint64_t b) const;
  // Batches this rank repeats (kRepeat) or the plan dropped for every rank (kDrop) this epoch.
  uint64_t repeated_batches() const { return repeated_; }
  uint64_t dropped_batches() const { return dropped_; }
  // Samples in the dropped batches (kDrop), over all ranks.
  uint64_t dropped_samples() const { return dropped_samples_; }
  // This rank's batches together: the sum of their samples' lengths, and of each batch's count
  // times its longest length (the padded size): 1 - real / padded is the padding's share.
  double real_length() const { return real_; }
  double padded_length() const { return padded_; }
  // The ranks' cost spread of a step, (most - least) / most of its batches' costs: the mean and
  // the largest over the epoch's steps (0 with one rank).
  double mean_cost_spread() const { return spread_mean_; }
  double max_cost_spread() const { return spread_max_; }

 private:
  friend class BudgetPlan;
  struct Step {
    uint64_t bucket;
    uint64_t first;  // the bucket's batch rank 0 takes (before wrapping)
  };
  // A bucket's batches: sample ranges of `order`.
  struct BucketBatches {
    std::vector<uint64_t> order;   // the bucket's samples in epoch order
    std::vector<uint64_t> starts;  // batch k is order[starts[k] .. starts[k + 1])
    uint64_t size() const { return starts.empty() ? 0 : starts.size() - 1; }
  };
  std::span<const uint64_t> bucket_batch(uint64_t bucket, uint64_t k) const;

  uint64_t epoch_ = 0, rank_ = 0, world_size_ = 1;
  std::vector<BucketBatches> buckets_;
  std::vector<Step> steps_;
  std::vector<uint64_t> consumed_;
  uint64_t repeated_ = 0, dropped_ = 0, dropped_samples_ = 0;
  double real_ = 0, padded_ = 0, spread_mean_ = 0, spread_max_ = 0;
};

}  // namespace stoker
