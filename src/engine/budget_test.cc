#include "stoker/budget.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <vector>

#include "stoker/errors.h"

namespace stoker {
namespace {

// Long-tailed lengths, as SFT corpora have: log-normal, clipped to [16, 8192].
std::vector<double> skewed(uint64_t n, uint64_t seed = 1) {
  std::mt19937_64 rng(seed);
  std::lognormal_distribution<double> d(5.5, 1.0);
  std::vector<double> out(n);
  for (double& x : out) x = std::round(std::clamp(d(rng), 16.0, 8192.0));
  return out;
}

BudgetOptions tokens(double budget, BudgetRemainder rule = BudgetRemainder::kDrop) {
  BudgetOptions o;
  o.budget = budget;
  o.remainder = rule;
  return o;
}

struct Batch {
  std::vector<uint64_t> samples;
  uint64_t bucket;
};

// Every rank's batches of one epoch, step by step: batches[rank][step].
std::vector<std::vector<Batch>> all_ranks(const BudgetPlan& plan, uint64_t seed, uint64_t epoch,
                                          uint64_t world, std::vector<uint64_t> consumed = {}) {
  std::vector<std::vector<Batch>> out(world);
  for (uint64_t r = 0; r < world; ++r) {
    auto e = plan.epoch(seed, epoch, true, r, world, consumed);
    for (uint64_t b = 0; b < e->num_batches(); ++b) {
      auto s = e->batch(b);
      out[r].push_back({{s.begin(), s.end()}, e->bucket_of(b)});
    }
  }
  return out;
}

double batch_cost(const BudgetPlan& plan, const std::vector<uint64_t>& samples) {
  double sum = 0, longest = 0;
  for (uint64_t i : samples) {
    sum += plan.length(i);
    longest = std::max(longest, plan.length(i));
  }
  return plan.cost(samples.size(), sum, longest);
}

TEST(BudgetPlan, EveryBatchWithinItsBudgetEverySampleOnceAndEqualStepsOnEveryRank) {
  const auto lengths = skewed(20000);
  for (BudgetCost cost : {BudgetCost::kPadded, BudgetCost::kSum, BudgetCost::kQuadratic}) {
    BudgetOptions o = tokens(16384);
    o.cost = cost;
    o.max_batch_size = 200;
    const BudgetPlan plan(lengths, o);
    EXPECT_TRUE(plan.oversized().empty());
    for (uint64_t world : {1, 2, 3, 5, 8}) {
      const auto ranks = all_ranks(plan, 7, 2, world);
      std::vector<int> seen(lengths.size(), 0);
      for (uint64_t r = 0; r < world; ++r) {
        ASSERT_EQ(ranks[r].size(), ranks[0].size()) << "rank " << r << " of " << world;
        for (uint64_t s = 0; s < ranks[r].size(); ++s) {
          const Batch& b = ranks[r][s];
          ASSERT_FALSE(b.samples.empty());
          EXPECT_LE(batch_cost(plan, b.samples), o.budget);
          EXPECT_LE(b.samples.size(), o.max_batch_size);
          EXPECT_LE(b.samples.size(), plan.max_batch_size());
          EXPECT_EQ(b.bucket, ranks[0][s].bucket) << "a step's batches come from one bucket";
          for (uint64_t i : b.samples) ++seen[i];
        }
      }
      // kDrop: what no rank saw is exactly the dropped batches' samples.
      const auto e = plan.epoch(7, 2, true, 0, world);
      uint64_t missing = 0;
      for (int c : seen) {
        ASSERT_LE(c, 1);
        missing += c == 0;
      }
      EXPECT_EQ(missing, e->dropped_samples()) << "world " << world;
      EXPECT_LT(e->dropped_batches(), world * plan.num_buckets());
    }
  }
}

TEST(BudgetPlan, RepeatsMakeUpTheRemainderWithTheBucketsOwnBatches) {
  const auto lengths = skewed(3000, 3);
  const BudgetPlan plan(lengths, tokens(8192, BudgetRemainder::kRepeat));
  const uint64_t batches = plan.epoch(1, 0, true, 0, 1)->num_batches();
  int tried = 0;
  for (uint64_t world = 2; world <= 9; ++world) {
    if (batches % world == 0) continue;  // no remainder to make up
    ++tried;
    const auto ranks = all_ranks(plan, 1, 0, world);
    std::vector<int> seen(lengths.size(), 0);
    uint64_t repeated = 0;
    for (uint64_t r = 0; r < world; ++r) {
      ASSERT_EQ(ranks[r].size(), ranks[0].size());
      for (const Batch& b : ranks[r])
        for (uint64_t i : b.samples) ++seen[i];
      repeated += plan.epoch(1, 0, true, r, world)->repeated_batches();
    }
    uint64_t twice = 0;
    for (int c : seen) {
      ASSERT_GE(c, 1) << "every sample delivered";
      ASSERT_LE(c, 2);
      twice += c == 2;
    }
    EXPECT_GT(repeated, 0u);
    EXPECT_LT(repeated, world * plan.num_buckets());
    EXPECT_GT(twice, 0u);
  }
  EXPECT_GT(tried, 3);
}

TEST(BudgetPlan, DependsOnlyOnSeedEpochAndCounts) {
  const auto lengths = skewed(5000);
  const BudgetPlan plan(lengths, tokens(4096));
  const auto a = all_ranks(plan, 3, 1, 4), b = all_ranks(plan, 3, 1, 4);
  for (uint64_t r = 0; r < 4; ++r)
    for (uint64_t s = 0; s < a[r].size(); ++s) ASSERT_EQ(a[r][s].samples, b[r][s].samples);
  const auto c = all_ranks(plan, 3, 2, 4);
  EXPECT_NE(a[0][0].samples, c[0][0].samples) << "another epoch, other batches";
  // Unshuffled: the same whatever the seed and epoch.
  auto e1 = plan.epoch(1, 0, false, 0, 1), e2 = plan.epoch(9, 5, false, 0, 1);
  ASSERT_EQ(e1->num_batches(), e2->num_batches());
  for (uint64_t s = 0; s < e1->num_batches(); ++s) {
    auto x = e1->batch(s), y = e2->batch(s);
    ASSERT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
  }
}

TEST(BudgetPlan, PaddingIsSmallOnALongTailedCorpus) {
  const auto lengths = skewed(200000);
  const BudgetPlan plan(lengths, tokens(32768));
  auto e = plan.epoch(0, 0, true, 0, 1);
  double padded = 0, real = 0;
  for (uint64_t b = 0; b < e->num_batches(); ++b) {
    double longest = 0;
    auto s = e->batch(b);
    for (uint64_t i : s) {
      real += lengths[i];
      longest = std::max(longest, lengths[i]);
    }
    padded += longest * static_cast<double>(s.size());
  }
  EXPECT_LT((padded - real) / padded, 0.05);
}

// Resume: the counts after k steps plan exactly the rest, on any world size, nested.
TEST(BudgetPlan, AnEpochPlannedFromTheConsumedCountsHoldsExactlyTheBatchesLeft) {
  const auto lengths = skewed(12000, 5);
  for (auto rule : {BudgetRemainder::kDrop, BudgetRemainder::kRepeat}) {
    const BudgetPlan plan(lengths, tokens(8192, rule));
    const auto whole = all_ranks(plan, 4, 3, 1);  // one rank: every batch, none dropped
    std::map<std::vector<uint64_t>, int> all;
    for (const Batch& b : whole[0]) ++all[b.samples];
    // 4 ranks for 5 steps, then 3 ranks for 2 steps, then 6 ranks to the end.
    std::map<std::vector<uint64_t>, int> got;
    std::vector<uint64_t> consumed;
    uint64_t dropped = 0;
    for (auto [world, steps] : {std::pair<uint64_t, uint64_t>{4, 5}, {3, 2}, {6, ~0ull}}) {
      const auto ranks = all_ranks(plan, 4, 3, world, consumed);
      const uint64_t n = std::min<uint64_t>(steps, ranks[0].size());
      for (uint64_t r = 0; r < world; ++r)
        for (uint64_t s = 0; s < n; ++s) ++got[ranks[r][s].samples];
      auto e = plan.epoch(4, 3, true, 0, world, consumed);
      if (n == ranks[0].size()) dropped = e->dropped_batches();
      consumed = e->consumed_after(n);
    }
    uint64_t delivered_once = 0;
    for (const auto& [batch, count] : got) {
      ASSERT_EQ(all.count(batch), 1u) << "a batch of the epoch";
      delivered_once += count >= 1;
      if (rule == BudgetRemainder::kDrop) {
        ASSERT_EQ(count, 1);
      }
    }
    EXPECT_EQ(delivered_once + dropped, all.size());
    if (rule == BudgetRemainder::kRepeat) {
      EXPECT_EQ(delivered_once, all.size());
    }
  }
}

TEST(BudgetPlan, TheSamePlanResumesWithTheSameCountsAndWorldSize) {
  const BudgetPlan plan(skewed(4000), tokens(4096));
  const std::vector<uint64_t> start = plan.epoch(2, 1, true, 0, 2)->consumed_after(3);
  auto a = plan.epoch(2, 1, true, 1, 2, start), b = plan.epoch(2, 1, true, 1, 2, start);
  ASSERT_EQ(a->num_batches(), b->num_batches());
  for (uint64_t s = 0; s < a->num_batches(); ++s) {
    auto x = a->batch(s), y = b->batch(s);
    ASSERT_TRUE(std::equal(x.begin(), x.end(), y.begin(), y.end()));
  }
}

TEST(BudgetPlan, OversizedSamplesAreListedAndInNoBatch) {
  std::vector<double> lengths = {10, 5000, 20, 30, 9000, 40};
  const BudgetPlan plan(lengths, tokens(4096));
  EXPECT_EQ(plan.oversized(), (std::vector<uint64_t>{1, 4}));
  auto e = plan.epoch(0, 0, true, 0, 1);
  for (uint64_t b = 0; b < e->num_batches(); ++b)
    for (uint64_t i : e->batch(b)) EXPECT_TRUE(i != 1 && i != 4);
}

TEST(BudgetPlan, BucketsAsGivenAndAuto) {
  BudgetOptions o = tokens(1000);
  o.bucket_bounds = {50, 100};
  const BudgetPlan given({10, 60, 100, 99, 49, 500}, o);
  ASSERT_EQ(given.num_buckets(), 3u);
  EXPECT_EQ(std::vector<uint64_t>(given.bucket(0).begin(), given.bucket(0).end()),
            (std::vector<uint64_t>{0, 4}));
  EXPECT_EQ(std::vector<uint64_t>(given.bucket(1).begin(), given.bucket(1).end()),
            (std::vector<uint64_t>{1, 3}));
  EXPECT_EQ(std::vector<uint64_t>(given.bucket(2).begin(), given.bucket(2).end()),
            (std::vector<uint64_t>{2, 5}));
  const BudgetPlan autob(skewed(300000), tokens(65536));
  EXPECT_EQ(autob.num_buckets(), kAutoBuckets);
  for (size_t b = 1; b < autob.bucket_bounds().size(); ++b)
    EXPECT_GT(autob.bucket_bounds()[b], autob.bucket_bounds()[b - 1]);
  EXPECT_EQ(BudgetPlan(skewed(100), tokens(4096)).num_buckets(), 1u) << "few samples: one bucket";
  o.bucket_bounds = {5, 3};
  EXPECT_THROW(BudgetPlan({1, 2}, o), InvalidArgument);
  EXPECT_THROW(BudgetPlan({1, 2}, tokens(0)), InvalidArgument);
  EXPECT_THROW(BudgetPlan({1, -2}, tokens(10)), InvalidArgument);
}

TEST(BudgetPlan, GivenBucketsNeverShareABatchWhateverTheLengths) {
  // Images in aspect-ratio buckets: equal areas (lengths) in different buckets must not mix.
  std::vector<double> lengths;
  std::vector<uint32_t> bucket_of;
  for (uint32_t i = 0; i < 997; ++i) {
    bucket_of.push_back((i * 7) % 5);
    lengths.push_back(bucket_of.back() % 2 ? 4096 : 8192);
  }
  BudgetOptions o = tokens(8 * 8192.0);
  o.bucket_of = bucket_of;
  const BudgetPlan plan(lengths, o);
  ASSERT_EQ(plan.num_buckets(), 5u);
  EXPECT_TRUE(plan.bucket_bounds().empty());
  for (uint64_t world : {1, 3}) {
    std::vector<int> seen(lengths.size(), 0);
    for (const auto& rank : all_ranks(plan, 4, 1, world)) {
      for (const Batch& b : rank) {
        for (uint64_t i : b.samples) {
          EXPECT_EQ(bucket_of[i], b.bucket) << "sample " << i;
          ++seen[i];
        }
        EXPECT_LE(batch_cost(plan, b.samples), o.budget);
      }
    }
    if (world == 1) {
      for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "sample " << i;
    }
  }
  BudgetOptions bad = o;
  bad.bucket_bounds = {5000};
  EXPECT_THROW(BudgetPlan(lengths, bad), InvalidArgument);
  bad = o;
  bad.bucket_of.pop_back();
  EXPECT_THROW(BudgetPlan(lengths, bad), InvalidArgument);
}

TEST(BudgetPlan, MaxPaddedElementsBoundsEveryBatch) {
  const auto lengths = skewed(20000, 9);
  std::vector<uint64_t> elements(lengths.size());
  for (size_t i = 0; i < lengths.size(); ++i) elements[i] = static_cast<uint64_t>(lengths[i]);
  for (BudgetCost cost : {BudgetCost::kPadded, BudgetCost::kSum}) {
    BudgetOptions o = tokens(8192);
    o.cost = cost;
    const BudgetPlan plan(lengths, o);
    const uint64_t bound = plan.max_padded_elements(elements, 8);
    if (cost == BudgetCost::kPadded) {
      EXPECT_LE(bound, 8192u + 8 * plan.max_batch_size());
    }
    uint64_t most = 0;
    for (uint64_t epoch = 0; epoch < 4; ++epoch) {
      auto e = plan.epoch(1, epoch, true, 0, 1);
      for (uint64_t b = 0; b < e->num_batches(); ++b) {
        uint64_t longest = 0;
        auto s = e->batch(b);
        for (uint64_t i : s) longest = std::max(longest, elements[i]);
        most = std::max(most, s.size() * ((longest + 7) / 8 * 8));
      }
    }
    EXPECT_LE(most, bound);
    if (cost == BudgetCost::kPadded) {  // a sum's bound is the worst mix, which sorting avoids
      EXPECT_GT(most, bound / 2) << "a bound, not a gross overestimate";
    }
  }
}

}  // namespace
}  // namespace stoker
