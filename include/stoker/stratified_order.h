// Class-stratified epoch orders: every batch holds each class in proportion.
//
// ClassGroups groups the samples of each class once, from their labels. StratifiedPlan lays out a
// rank's batches so that every batch of every rank holds each class c within one sample of its
// share, batch_length * share_c (the count is that number rounded down or up):
// - without weights, share_c = n_c / n (the class's share of the dataset) and every sample is
//   visited exactly once per epoch; with drop_last the dropped tail holds each class within one
//   sample of its share too, and which samples it drops changes from epoch to epoch;
// - with class weights, share_c = w_c / sum(w): the epoch has as many draws as the plain order
//   (so the same num_batches()), a class drawn more than it has samples is repeated and one drawn
//   less is subsampled. Each class draws from its own stream, which runs on across epochs: cycle
//   k of class c is a fresh permutation of its samples, so every sample of a class is drawn once
//   before any is drawn again, and every sample of a subsampled class is reached within
//   ceil(n_c / draws_c) consecutive epochs. A class's draws per epoch are fixed (class_draws()).
//   A batch that holds the end of a class's cycle and the start of the next may hold one of its
//   samples twice (always, when a batch draws more of a class than the class has); each draw's
//   randomness is keyed by its cycle (StratifiedEpoch::batch), so repeats are augmented anew.
//
// Batches, ranks and counts are those of BatchPlan (same num_batches(), batch_length()): rank r's
// batch b is row b * world_size + r of the epoch, so ranks get disjoint samples and equal batch
// counts. Under drop_last=false, when world_size does not divide n, the < world_size padded
// slots repeat samples (as DistributedSampler does) and count in the proportions like any slot.
//
// How a row is filled, in O(1) per sample: the rows of equal length form a block of R rows
// (the full batches, then the final partial batches). In a block, class c has T_c slots in
// total, floor(T_c / R) in every row; the remaining e_c = T_c mod R (< R) are written as one run,
// the classes in a random order per epoch, down the columns of an R x X matrix of extras, whose
// entry k falls on offset k mod R of its column. A run shorter than R never takes one offset
// twice, and offsets map to rows one to one (through a transposed grid about sqrt(R) wide,
// which spreads a run's rows over the epoch), so no row gets two extras of a class, and how many
// extras a class had before row i is a formula. A class's slots take its stream's positions in
// row order; position p of class c in epoch e is sample members_c[perm_{c,k}(j)] with
// (k, j) = divmod(e * draws_c + p, n_c) and perm a keyed Feistel permutation (as EpochOrder's)
// tweaked by (class, cycle). A seeded shuffle then mixes the row.
// The blocks' totals T_c: without weights, the tail (dropped, or the final partial batches) takes
// each class's share of it, rounded by systematic sampling with a random class order per epoch
// (a class rounds up with probability equal to its fraction); with weights, every block's extras
// are rounded the same way once, with the seed, so that draws per epoch are fixed.
//
// Memory: ClassGroups keeps the samples grouped by class, 4 bytes a sample (8 when there are
// 2^32 samples or more), plus 16 bytes a class; no per-sample array exists per epoch. A
// StratifiedEpoch keeps about 150 bytes a class (per-class counts, runs and stream positions).
//
// Thread safety: all three types are immutable after construction, safe to share.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace stoker {

class ClassGroups {
 public:
  // labels[i] is the class of sample i; any int64 values. REQUIRES: fewer than 2^32 classes.
  explicit ClassGroups(std::span<const int64_t> labels);

  uint64_t num_samples() const { return num_samples_; }
  uint32_t num_classes() const { return static_cast<uint32_t>(labels_.size()); }
  // The label value of class c; classes are numbered in ascending order of their labels.
  int64_t label(uint32_t c) const { return labels_[c]; }
  // Samples of class c.
  uint64_t count(uint32_t c) const { return starts_[c + 1] - starts_[c]; }
  // The k-th sample of class c, samples in ascending order. REQUIRES: k < count(c).
  uint64_t member(uint32_t c, uint64_t k) const { return grouped(start(c) + k); }
  // The samples grouped by class (class 0's, then class 1's, ...): where class c starts, and the
  // sample at position k. REQUIRES: c < num_classes(), k < num_samples().
  uint64_t start(uint32_t c) const { return starts_[c]; }
  uint64_t grouped(uint64_t k) const { return wide_.empty() ? narrow_[k] : wide_[k]; }
  // Bytes this object holds.
  uint64_t memory_bytes() const;

 private:
  uint64_t num_samples_ = 0;
  std::vector<int64_t> labels_;   // per class, ascending
  std::vector<uint64_t> starts_;  // per class + 1: where its members start
  std::vector<uint32_t> narrow_;  // members, grouped by class, when num_samples < 2^32
  std::vector<uint64_t> wide_;    // members otherwise
};

class StratifiedEpoch;

class StratifiedPlan {
 public:
  // `weights`: empty for the dataset's proportions, else one weight per class of `classes`
  // (finite, >= 0, not all 0); a class of weight 0 is never drawn. Weights are kept to 32 bits of
  // precision relative to the largest.
  // REQUIRES (InvalidArgument otherwise): classes not null; batch_size >= 1, world_size >= 1,
  // rank < world_size; valid weights.
  StratifiedPlan(std::shared_ptr<const ClassGroups> classes, std::vector<double> weights,
                 uint64_t seed, uint64_t batch_size, bool drop_last, uint64_t rank,
                 uint64_t world_size);
  ~StratifiedPlan();

  // As BatchPlan's for the same arguments.
  uint64_t num_batches() const;
  uint64_t batch_length(uint64_t b) const;

  const ClassGroups& classes() const;
  // Draws of class c per epoch over all ranks: count(c) without weights (the dropped tail
  // included), else the fixed number its weight gives.
  uint64_t class_draws(uint32_t c) const;

  // The order of epoch `epoch`: O(classes) time and memory to make.
  StratifiedEpoch epoch(uint64_t epoch) const;

  struct Layout;

 private:
  std::shared_ptr<const Layout> layout_;
};

class StratifiedEpoch {
 public:
  uint64_t epoch() const { return epoch_; }
  // The samples of this rank's batch b, in batch order, and, when `cycles` is not empty, the
  // cycle of each draw: the number of times its class's stream had gone through all of its
  // samples before it. A sample is drawn once a cycle, so (cycle, sample) names one draw: it
  // keys the draw's randomness (augmentation), so that the repeats of an oversampled sample
  // differ. Without weights the cycle is the epoch (a later one for a padded repeat).
  // REQUIRES: b < num_batches(), out.size() == batch_length(b), cycles empty or of out's size
  // (InvalidArgument otherwise).
  void batch(uint64_t b, std::span<uint64_t> out, std::span<uint64_t> cycles = {}) const;

  struct Block;
  struct Stream;
  struct Data;

 private:
  friend class StratifiedPlan;
  StratifiedEpoch(std::shared_ptr<const StratifiedPlan::Layout> layout, uint64_t epoch);

  std::shared_ptr<const StratifiedPlan::Layout> layout_;
  uint64_t epoch_;
  std::shared_ptr<const Data> data_;
};

}  // namespace stoker
