#include "stoker/epoch_draws.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "stoker/errors.h"

namespace stoker {
namespace {

// Batch b of `plan` in the plain order, the long way: each position, then the permutation.
std::vector<uint64_t> by_hand(const BatchPlan& plan, const EpochOrder& order, uint64_t b) {
  std::vector<uint64_t> out;
  for (uint64_t s = 0; s < plan.batch_length(b); ++s)
    out.push_back(order[plan.global_position(b * plan.batch_size() + s)]);
  return out;
}

TEST(EpochDraws, PlainOrderIsThePlansPositionsPermuted) {
  for (uint64_t start : {0, 7}) {
    const BatchPlan plan(103, 8, false, 1, 3, start);
    const EpochDraws draws(103, true, 5, 2);
    EXPECT_FALSE(draws.keyed_by_cycle());
    for (uint64_t b = 0; b < plan.num_batches(); ++b) {
      const Draws d = draws.batch(plan, b, true);
      EXPECT_EQ(d.indices, by_hand(plan, EpochOrder(103, true, 5, 2), b));
      EXPECT_EQ(d.cycles, std::vector<uint64_t>(d.indices.size(), 2));  // keyed by the epoch
      EXPECT_TRUE(draws.batch(plan, b, false).cycles.empty());
    }
  }
}

TEST(EpochDraws, RepeatsKeyEachCopyByItsCycle) {
  const uint64_t n = 10, k = 3, epoch = 4;
  const BatchPlan plan(n * k, 4, false, 0, 1);
  const EpochDraws draws = EpochDraws::for_plan(plan, true, 9, epoch, k);
  EXPECT_TRUE(draws.keyed_by_cycle());
  const EpochOrder order(n, true, 9, epoch);
  for (uint64_t b = 0; b < plan.num_batches(); ++b) {
    const Draws d = draws.batch(plan, b, true);
    for (uint64_t s = 0; s < d.indices.size(); ++s) {
      const uint64_t p = b * 4 + s;
      EXPECT_EQ(d.indices[s], order[p / k]);
      EXPECT_EQ(d.cycles[s], epoch * k + p % k);
    }
  }
  EXPECT_THROW(EpochDraws::for_plan(BatchPlan(31, 4, false, 0, 1), true, 9, 0, 3), InvalidArgument);
  EXPECT_THROW(EpochDraws::for_plan(plan, true, 9, 0, 0), InvalidArgument);
}

TEST(EpochDraws, ABatchOutOfRangeIsRejected) {
  const BatchPlan plan(10, 4, false, 0, 1);
  EXPECT_THROW(EpochDraws(10, false, 0, 0).batch(plan, 3, false), InvalidArgument);
  EXPECT_THROW(check_batch(plan, 3), InvalidArgument);
  EXPECT_NO_THROW(check_batch(plan, 2));
}

// A row range of a batch (a worker's chunk) is that range of the whole batch, in every order.
void expect_ranges_match(const EpochDraws& draws, const BatchPlan& plan) {
  for (uint64_t b = 0; b < plan.num_batches(); ++b) {
    const Draws whole = draws.batch(plan, b, true);
    const uint64_t length = whole.indices.size();
    for (uint64_t begin = 0; begin < length; begin += 3) {
      const uint64_t n = std::min<uint64_t>(3, length - begin);
      std::vector<uint64_t> out(n), cycles(n);
      draws.draw(plan, b, out, cycles, begin);
      EXPECT_EQ(out, std::vector<uint64_t>(whole.indices.begin() + begin,
                                           whole.indices.begin() + begin + n));
      EXPECT_EQ(cycles, std::vector<uint64_t>(whole.cycles.begin() + begin,
                                              whole.cycles.begin() + begin + n));
    }
  }
}

std::shared_ptr<const ClassGroups> some_classes(uint64_t n) {
  std::vector<int64_t> labels(n);
  for (uint64_t i = 0; i < n; ++i) labels[i] = static_cast<int64_t>(i % 3 == 0 ? 0 : i % 5);
  return std::make_shared<ClassGroups>(labels);
}

TEST(EpochDraws, RowRangesMatchTheWholeBatchInEveryOrder) {
  const BatchPlan plan(60, 7, false, 1, 2);
  expect_ranges_match(EpochDraws(60, true, 3, 1), plan);
  expect_ranges_match(EpochDraws::for_plan(BatchPlan(60, 7, false, 1, 2), true, 3, 1, 2), plan);
  const std::vector<uint64_t> blocks = {20, 25, 15};
  expect_ranges_match(EpochDraws(60, true, 3, 1, 1, BlockOrder(blocks, 2, 2, 3, 1)), plan);
  const StratifiedPlan stratified(some_classes(60), {}, 3, 7, false, 1, 2);
  expect_ranges_match(EpochDraws(stratified.epoch(1)), plan);
  auto mixture = std::make_shared<const MixturePlan>(MixtureOrder{{20, 40}, {{0, {1, 3}}}}, 3, true,
                                                     1, 7, false, 1, 2);
  expect_ranges_match(EpochDraws(mixture), mixture->batches());
}

TEST(EpochDraws, AStridedViewOfAStratifiedOrderTakesItsBatches) {
  const StratifiedPlan stratified(some_classes(50), {}, 3, 4, false, 0, 1);
  const BatchPlan plan(50, 4, false, 0, 1);
  const EpochDraws draws(stratified.epoch(2));
  const BatchPlan view = plan.strided(1, 3);
  for (uint64_t j = 0; j < view.num_batches(); ++j)
    EXPECT_EQ(draws.batch(view, j, true).indices, draws.batch(plan, 1 + 3 * j, true).indices);
}

TEST(EpochDraws, BlockAtFollowsTheCopysOriginal) {
  const std::vector<uint64_t> blocks = {4, 6};
  const EpochDraws draws(10, true, 1, 0, 2, BlockOrder(blocks, 1, 1, 1, 0));
  for (uint64_t p = 0; p < 20; ++p) EXPECT_EQ(draws.block_at(p), draws.blocks()->block_at(p / 2));
}

TEST(CachedStratifiedPlan, DrawsAsItsPlanAcrossEpochsAndThreads) {
  auto classes = some_classes(200);
  const std::vector<double> weights = {1, 4, 1, 1, 2};
  CachedStratifiedPlan cached(classes, weights, 11, 16, false, 1, 2);
  const StratifiedPlan plan(classes, weights, 11, 16, false, 1, 2);
  const uint64_t batches = plan.num_batches();
  auto expected = [&](uint64_t epoch, uint64_t b) {
    std::vector<uint64_t> out(plan.batch_length(b)), cycles(out.size());
    plan.epoch(epoch).batch(b, out, cycles);
    return Draws{out, cycles};
  };
  for (uint64_t epoch : {0, 3, 0}) {  // back to an earlier epoch: the cache follows
    for (uint64_t b = 0; b < batches; ++b) {
      const Draws d = cached.batch(epoch, b, true), e = expected(epoch, b);
      EXPECT_EQ(d.indices, e.indices);
      EXPECT_EQ(d.cycles, e.cycles);
    }
  }
  EXPECT_THROW(cached.batch(0, batches, false), InvalidArgument);
  // Threads asking for different epochs at once each get their epoch's batches.
  std::vector<std::thread> threads;
  std::vector<int> wrong(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round)
        for (uint64_t b = 0; b < batches; ++b)
          wrong[t] += cached.batch(t, b, false).indices != expected(t, b).indices;
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace stoker
