// Which samples are in batch b: the engine's one answer, for every order it has.
//
// A BatchPlan (order.h) says which global positions a rank's batch b holds; an epoch's order says
// which sample each position draws, and the draw's cycle, which keys its randomness in place of
// the epoch. EpochDraws is that order for one epoch, whatever its kind:
// - the plain order (EpochOrder) of n samples, each `repeats` times at consecutive positions
//   (order.h, repeated_position): copy r of an epoch-e sample has cycle e * repeats + r, so
//   without repeats the cycle is the epoch;
// - the block-local order (BlockOrder) of a source in blocks or shards, with repeats as above;
// - an order that lays out whole batches: a StratifiedEpoch (the cycle is the draw's cycle through
//   its class), a MixturePlan (a source's own epoch) or a BudgetEpoch (batches of unequal lengths
//   under a budget, budget.h: the cycle is the epoch; the plan of such an iteration has one
//   "position" a batch, and batch_length() says how many samples each holds).
// draw() is the routine every caller shares: the Engine's iterators (a worker's chunk of a batch),
// Engine::epoch_indices and block_schedule, and the Python fronts through the bindings
// (BatchPlan.indices / repeated_draws, StratifiedPlan.batch_draws, MixturePlan.batch_draws), which
// is how a Python dataset, the Ray offload producer and a resumed epoch visit exactly the samples
// the native loader visits.
//
// CachedStratifiedPlan keeps the draws of the epoch last asked for, so that a front asking for an
// epoch's batches one at a time makes the epoch's O(classes) state once.
//
// Thread safety: EpochDraws is immutable after construction, safe to share. CachedStratifiedPlan
// is safe to use from any thread (one lock around its cache).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "stoker/block_order.h"
#include "stoker/budget.h"
#include "stoker/mixture.h"
#include "stoker/order.h"
#include "stoker/stratified_order.h"

namespace stoker {

// Throws InvalidArgument unless b < plan.num_batches(): the check of every front that asks for a
// batch by number.
void check_batch(const BatchPlan& plan, uint64_t b);
// Throws InvalidArgument unless start_batch <= plan.num_batches(): where an iteration may start
// (at num_batches(), it yields nothing).
void check_start_batch(const BatchPlan& plan, uint64_t start_batch);

// One batch's draws: the samples in batch order and, where asked for, the cycle of each.
struct Draws {
  std::vector<uint64_t> indices;
  std::vector<uint64_t> cycles;  // empty when not asked for
};

class EpochDraws {
 public:
  // The plain order of `num_samples` samples, each `repeats` times, or with `blocks` the
  // block-local one (blocks->size() == num_samples). REQUIRES: repeats >= 1.
  EpochDraws(uint64_t num_samples, bool shuffle, uint64_t seed, uint64_t epoch,
             uint64_t repeats = 1, std::optional<BlockOrder> blocks = std::nullopt);
  // The plain order whose positions are those of `plan`: plan.num_samples() / repeats samples,
  // each `repeats` times. Throws InvalidArgument when repeats is 0 or does not divide
  // plan.num_samples().
  static EpochDraws for_plan(const BatchPlan& plan, bool shuffle, uint64_t seed, uint64_t epoch,
                             uint64_t repeats = 1);
  // An order of whole batches: a stratified epoch, laid out on the plan it was made by (or a
  // strided view of it), or a mixture's, laid out on MixturePlan::batches(). REQUIRES: not null.
  explicit EpochDraws(StratifiedEpoch stratified);
  explicit EpochDraws(std::shared_ptr<const MixturePlan> mixture);
  // A budget's epoch: batch b is budget->batch(b), on the plan budget_plan(*budget) lays out.
  explicit EpochDraws(std::shared_ptr<const BudgetEpoch> budget);
  // The plan of a budget's epoch: one position a batch (a batch's own key, first_position(b) = b).
  static BatchPlan budget_plan(const BudgetEpoch& budget);

  uint64_t epoch() const { return epoch_; }
  uint64_t repeats() const { return repeats_; }
  // Whether batches are laid out whole (stratified, mixture), not mapped from global positions.
  bool whole_batches() const { return stratified_ || mixture_ || budget_; }
  // Samples in batch b of `plan`: plan.batch_length(b), or the budget's batch's length.
  // REQUIRES: b < plan.num_batches().
  uint64_t batch_length(const BatchPlan& plan, uint64_t b) const {
    return budget_ ? budget_->batch(b).size() : plan.batch_length(b);
  }
  const BudgetEpoch* budget() const { return budget_.get(); }
  // Whether a draw's randomness is keyed by its cycle rather than the epoch (they differ).
  bool keyed_by_cycle() const { return whole_batches() || repeats_ > 1; }
  const BlockOrder* blocks() const { return blocks_ ? &*blocks_ : nullptr; }
  const MixturePlan* mixture() const { return mixture_.get(); }

  // Rows [begin, begin + out.size()) of batch b of `plan`: their samples and, when `cycles` is not
  // empty, the cycle of each draw. `plan` covers num_samples * repeats positions (a plain or
  // block order), or is the plan the whole-batch order was laid on (see the constructors).
  // REQUIRES: b < plan.num_batches(), begin + out.size() <= plan.batch_length(b), cycles empty or
  // of out's size.
  void draw(const BatchPlan& plan, uint64_t b, std::span<uint64_t> out,
            std::span<uint64_t> cycles = {}, uint64_t begin = 0) const;
  // Batch b whole, with its cycles if `with_cycles`. Throws InvalidArgument when b is out of
  // range (check_batch).
  Draws batch(const BatchPlan& plan, uint64_t b, bool with_cycles) const;
  // The block (shard) that global position p reads. REQUIRES: blocks(), p < its positions.
  uint64_t block_at(uint64_t p) const;

 private:
  // The whole batch b of an order of whole batches.
  void whole_batch(const BatchPlan& plan, uint64_t b, std::span<uint64_t> out,
                   std::span<uint64_t> cycles) const;

  EpochOrder order_;
  std::optional<BlockOrder> blocks_;
  std::optional<StratifiedEpoch> stratified_;
  std::shared_ptr<const MixturePlan> mixture_;
  std::shared_ptr<const BudgetEpoch> budget_;
  uint64_t epoch_ = 0;
  uint64_t repeats_ = 1;
};

class CachedStratifiedPlan {
 public:
  // As StratifiedPlan's constructor (InvalidArgument for what it rejects).
  CachedStratifiedPlan(std::shared_ptr<const ClassGroups> classes, std::vector<double> weights,
                       uint64_t seed, uint64_t batch_size, bool drop_last, uint64_t rank,
                       uint64_t world_size);

  const StratifiedPlan& plan() const { return plan_; }
  // Batch b of `epoch` (EpochDraws::batch): InvalidArgument when b is out of range.
  Draws batch(uint64_t epoch, uint64_t b, bool with_cycles);

 private:
  const StratifiedPlan plan_;
  const BatchPlan batches_;  // the rank's batches that plan_ lays out (same num_batches)
  std::mutex mu_;
  std::optional<EpochDraws> epoch_;  // guarded by mu_; the epoch last asked for
};

}  // namespace stoker
