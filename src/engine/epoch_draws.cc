#include "stoker/epoch_draws.h"

#include <algorithm>
#include <string>
#include <utility>

#include "stoker/errors.h"

namespace stoker {

void check_batch(const BatchPlan& plan, uint64_t b) {
  if (b >= plan.num_batches())
    throw InvalidArgument("batch " + std::to_string(b) + " is out of range: the plan has " +
                          std::to_string(plan.num_batches()) + " batches");
}

void check_start_batch(const BatchPlan& plan, uint64_t start_batch) {
  if (start_batch > plan.num_batches())
    throw InvalidArgument("start batch " + std::to_string(start_batch) + " is past the end (" +
                          std::to_string(plan.num_batches()) + " batches per epoch)");
}

EpochDraws::EpochDraws(uint64_t num_samples, bool shuffle, uint64_t seed, uint64_t epoch,
                       uint64_t repeats, std::optional<BlockOrder> blocks)
    : order_(num_samples, shuffle, seed, epoch),
      blocks_(std::move(blocks)),
      epoch_(epoch),
      repeats_(repeats) {}

EpochDraws EpochDraws::for_plan(const BatchPlan& plan, bool shuffle, uint64_t seed, uint64_t epoch,
                                uint64_t repeats) {
  if (repeats < 1 || plan.num_samples() % repeats != 0)
    throw InvalidArgument("the plan's " + std::to_string(plan.num_samples()) +
                          " positions are not repeats=" + std::to_string(repeats) +
                          " copies of a dataset");
  return EpochDraws(plan.num_samples() / repeats, shuffle, seed, epoch, repeats);
}

// A whole-batch order maps no positions: its EpochOrder is an empty placeholder.
EpochDraws::EpochDraws(StratifiedEpoch stratified)
    : order_(0, false, 0, 0), stratified_(std::move(stratified)), epoch_(stratified_->epoch()) {}

EpochDraws::EpochDraws(std::shared_ptr<const MixturePlan> mixture)
    : order_(0, false, 0, 0), mixture_(std::move(mixture)), epoch_(mixture_->epoch()) {}

EpochDraws::EpochDraws(std::shared_ptr<const BudgetEpoch> budget)
    : order_(0, false, 0, 0), budget_(std::move(budget)), epoch_(budget_->epoch()) {}

BatchPlan EpochDraws::budget_plan(const BudgetEpoch& budget) {
  return BatchPlan(budget.num_batches(), 1, false, 0, 1);
}

void EpochDraws::whole_batch(const BatchPlan& plan, uint64_t b, std::span<uint64_t> out,
                             std::span<uint64_t> cycles) const {
  // A stratified order is laid out on the unstrided plan's batches; a strided view (producers
  // sharing a rank's epoch) names them by its own numbers.
  if (stratified_) return stratified_->batch(plan.unstrided_batch(b), out, cycles);
  if (budget_) {
    const std::span<const uint64_t> s = budget_->batch(plan.unstrided_batch(b));
    std::copy(s.begin(), s.end(), out.begin());
    std::fill(cycles.begin(), cycles.end(), epoch_);
    return;
  }
  mixture_->batch(b, out, cycles);
}

void EpochDraws::draw(const BatchPlan& plan, uint64_t b, std::span<uint64_t> out,
                      std::span<uint64_t> cycles, uint64_t begin) const {
  if (whole_batches()) {
    const uint64_t length = batch_length(plan, b);
    if (begin == 0 && out.size() == length) return whole_batch(plan, b, out, cycles);
    // A row range of a whole-batch order: the layout makes rows a batch at a time.
    std::vector<uint64_t> all(length), all_cycles(cycles.empty() ? 0 : length);
    whole_batch(plan, b, all, all_cycles);
    std::copy_n(all.begin() + begin, out.size(), out.begin());
    if (!cycles.empty()) std::copy_n(all_cycles.begin() + begin, cycles.size(), cycles.begin());
    return;
  }
  const uint64_t first = b * plan.batch_size() + begin;
  for (uint64_t s = 0; s < out.size(); ++s) out[s] = plan.global_position(first + s);
  // Positions to the order's positions (a copy's original) and the copy's cycle, then to samples.
  if (repeats_ > 1) {
    for (size_t i = 0; i < out.size(); ++i) {
      const RepeatedPosition r = repeated_position(out[i], repeats_, epoch_);
      if (!cycles.empty()) cycles[i] = r.cycle;
      out[i] = r.position;
    }
  } else if (!cycles.empty()) {
    std::fill(cycles.begin(), cycles.end(), epoch_);
  }
  if (blocks_) return blocks_->map(out, out);
  order_.map(out, out);
}

Draws EpochDraws::batch(const BatchPlan& plan, uint64_t b, bool with_cycles) const {
  check_batch(plan, b);
  Draws d;
  d.indices.resize(batch_length(plan, b));
  if (with_cycles) d.cycles.resize(d.indices.size());
  draw(plan, b, d.indices, d.cycles);
  return d;
}

uint64_t EpochDraws::block_at(uint64_t p) const {
  return blocks_->block_at(repeats_ > 1 ? repeated_position(p, repeats_, epoch_).position : p);
}

CachedStratifiedPlan::CachedStratifiedPlan(std::shared_ptr<const ClassGroups> classes,
                                           std::vector<double> weights, uint64_t seed,
                                           uint64_t batch_size, bool drop_last, uint64_t rank,
                                           uint64_t world_size)
    : plan_(std::move(classes), std::move(weights), seed, batch_size, drop_last, rank, world_size),
      batches_(plan_.classes().num_samples(), batch_size, drop_last, rank, world_size) {}

Draws CachedStratifiedPlan::batch(uint64_t epoch, uint64_t b, bool with_cycles) {
  std::optional<EpochDraws> draws;
  {
    std::lock_guard lock(mu_);
    if (!epoch_ || epoch_->epoch() != epoch) epoch_.emplace(plan_.epoch(epoch));
    draws = epoch_;  // shares the epoch's state: the draw runs outside the lock
  }
  return draws->batch(batches_, b, with_cycles);
}

}  // namespace stoker
