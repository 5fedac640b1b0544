#include "stoker/order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "stoker/errors.h"

namespace stoker {
namespace {

std::vector<uint64_t> materialize(const EpochOrder& o) {
  std::vector<uint64_t> v(o.size());
  for (uint64_t i = 0; i < o.size(); ++i) v[i] = o[i];
  return v;
}

TEST(EpochOrder, IsAPermutationForEverySize) {
  for (uint64_t n = 0; n < 300; ++n) {
    auto v = materialize(EpochOrder(n, true, 7, 3));
    std::sort(v.begin(), v.end());
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], i) << "n=" << n;
  }
  for (uint64_t n : {1000u, 4096u, 4097u, 99991u}) {
    auto v = materialize(EpochOrder(n, true, 1, 0));
    std::sort(v.begin(), v.end());
    for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(v[i], i) << "n=" << n;
  }
}

TEST(EpochOrder, MapGivesWhatIndexingGives) {
  for (uint64_t n : {1u, 2u, 3u, 17u, 256u, 1000u, 99991u, 1000003u}) {
    for (bool shuffle : {false, true}) {
      const EpochOrder o(n, shuffle, 11, 2);
      std::vector<uint64_t> positions;
      for (uint64_t k = 0; k < std::min<uint64_t>(n, 700); ++k) positions.push_back(k * 7919 % n);
      std::vector<uint64_t> out(positions.size());
      o.map(positions, out);
      for (size_t i = 0; i < positions.size(); ++i) ASSERT_EQ(out[i], o[positions[i]]) << n;
      o.map(positions, positions);  // in place
      EXPECT_EQ(positions, out);
    }
  }
  std::vector<uint64_t> two(2), one(1);
  EXPECT_THROW(EpochOrder(10, true, 1, 1).map(two, one), InvalidArgument);
}

TEST(EpochOrder, SequentialWithoutShuffle) {
  EpochOrder o(10, false, 5, 9);
  for (uint64_t i = 0; i < 10; ++i) EXPECT_EQ(o[i], i);
}

TEST(EpochOrder, DependsOnSeedAndEpochOnly) {
  const auto a = materialize(EpochOrder(1000, true, 42, 1));
  EXPECT_EQ(a, materialize(EpochOrder(1000, true, 42, 1)));
  EXPECT_NE(a, materialize(EpochOrder(1000, true, 42, 2)));
  EXPECT_NE(a, materialize(EpochOrder(1000, true, 43, 1)));
  std::vector<uint64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(a, identity);
}

TEST(EpochOrder, HugeSizesNeedNoArray) {
  const uint64_t n = 1'000'000'000'000ULL;
  EpochOrder o(n, true, 3, 0);
  std::set<uint64_t> seen;
  for (uint64_t i = 0; i < 20000; ++i) {
    const uint64_t x = o[i];
    ASSERT_LT(x, n);
    seen.insert(x);
  }
  EXPECT_EQ(seen.size(), 20000u);
}

TEST(EpochOrder, FirstPositionIsRoughlyUniform) {
  // Over many epochs every sample should come first about equally often.
  const uint64_t n = 8, epochs = 16000;
  std::vector<int> first(n, 0);
  for (uint64_t e = 0; e < epochs; ++e) ++first[EpochOrder(n, true, 11, e)[0]];
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_GT(first[i], 1700) << i;  // expectation 2000, sd ~42
    EXPECT_LT(first[i], 2300) << i;
  }
}

// torch's DistributedSampler + BatchSampler, written out plainly.
std::vector<std::vector<uint64_t>> reference_batches(uint64_t n, uint64_t b, bool drop_last,
                                                     uint64_t rank, uint64_t world) {
  std::vector<uint64_t> indices(n);
  std::iota(indices.begin(), indices.end(), 0);
  uint64_t per_rank;
  if (drop_last) {
    per_rank = n / world;
    indices.resize(per_rank * world);
  } else {
    per_rank = (n + world - 1) / world;
    for (uint64_t i = 0; indices.size() < per_rank * world; ++i) indices.push_back(i % n);
  }
  std::vector<uint64_t> mine;
  for (uint64_t i = rank; i < indices.size(); i += world) mine.push_back(indices[i]);
  std::vector<std::vector<uint64_t>> batches;
  for (uint64_t i = 0; i < mine.size(); i += b) {
    if (drop_last && i + b > mine.size()) break;
    batches.emplace_back(mine.begin() + i, mine.begin() + std::min<uint64_t>(i + b, mine.size()));
  }
  return batches;
}

TEST(BatchPlan, MatchesDistributedSamplerForRandomConfigurations) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 2000; ++trial) {
    const uint64_t n = rng() % 60, b = 1 + rng() % 9, world = 1 + rng() % 5, rank = rng() % world;
    const bool drop_last = rng() % 2;
    BatchPlan plan(n, b, drop_last, rank, world);
    const auto ref = reference_batches(n, b, drop_last, rank, world);
    ASSERT_EQ(plan.num_batches(), ref.size()) << n << " " << b << " " << world << " " << rank;
    for (uint64_t k = 0; k < ref.size(); ++k) {
      ASSERT_EQ(plan.batch_length(k), ref[k].size());
      for (uint64_t s = 0; s < ref[k].size(); ++s)
        ASSERT_EQ(plan.global_position(k * b + s), ref[k][s]);
    }
  }
}

// The batches of a plan that starts at global position `start`, written out plainly: the
// positions left, [start, n), then padding from the start of the epoch's order (0, 1, ... mod n),
// split round-robin, cut into batches.
std::vector<std::vector<uint64_t>> reference_resumed(uint64_t n, uint64_t b, bool drop_last,
                                                     uint64_t rank, uint64_t world,
                                                     uint64_t start) {
  std::vector<uint64_t> left;
  for (uint64_t p = start; p < n; ++p) left.push_back(p);
  const uint64_t m = left.size();
  const uint64_t per_rank = drop_last ? m / world : (m + world - 1) / world;
  if (drop_last) left.resize(per_rank * world);
  for (uint64_t i = 0; left.size() < per_rank * world; ++i) left.push_back(i % n);
  std::vector<uint64_t> mine;
  for (uint64_t i = rank; i < left.size(); i += world) mine.push_back(left[i]);
  std::vector<std::vector<uint64_t>> batches;
  for (uint64_t i = 0; i < mine.size(); i += b) {
    if (drop_last && i + b > mine.size()) break;
    batches.emplace_back(mine.begin() + i, mine.begin() + std::min<uint64_t>(i + b, mine.size()));
  }
  return batches;
}

std::vector<std::vector<uint64_t>> plan_batches(const BatchPlan& plan) {
  std::vector<std::vector<uint64_t>> out(plan.num_batches());
  for (uint64_t k = 0; k < plan.num_batches(); ++k)
    for (uint64_t s = 0; s < plan.batch_length(k); ++s)
      out[k].push_back(plan.global_position(k * plan.batch_size() + s));
  return out;
}

TEST(BatchPlan, StartedPlanSplitsWhatIsLeft) {
  std::mt19937_64 rng(2);
  for (int trial = 0; trial < 3000; ++trial) {
    const uint64_t n = rng() % 60, b = 1 + rng() % 9, world = 1 + rng() % 6, rank = rng() % world;
    const uint64_t start = rng() % (n + 1);
    const bool drop_last = rng() % 2;
    const BatchPlan plan(n, b, drop_last, rank, world, start);
    const auto ref = reference_resumed(n, b, drop_last, rank, world, start);
    ASSERT_EQ(plan_batches(plan), ref) << n << " " << b << " " << world << " " << start;
    uint64_t samples = 0;
    for (const auto& batch : ref) samples += batch.size();
    ASSERT_EQ(plan.samples_per_rank(), samples);
  }
}

TEST(BatchPlan, ResumingWithTheSameWorldSizeChangesNoBatch) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 1000; ++trial) {
    const uint64_t n = 1 + rng() % 80, b = 1 + rng() % 7, world = 1 + rng() % 5;
    const uint64_t rank = rng() % world, start = rng() % n;
    const bool drop_last = rng() % 2;
    const BatchPlan plan(n, b, drop_last, rank, world, start);
    const auto all = plan_batches(plan);
    for (uint64_t done = 0; done <= plan.num_batches(); ++done) {
      const uint64_t at = plan.position_after(done);
      const auto rest = plan_batches(BatchPlan(n, b, drop_last, rank, world, at));
      ASSERT_EQ(rest, std::vector(all.begin() + done, all.end()))
          << n << " " << b << " " << world << " " << start << " " << done;
    }
  }
}

// Jobs of random world sizes take turns at one epoch: each resumes from the position the one
// before reached (after a random number of batches on every rank), the last one finishes it.
// What they delivered together: every position once, plus fewer than the last world size of
// padding repeats (drop_last=false); no repeat and only the last plan's dropped tail missing
// (drop_last=true).
TEST(BatchPlan, NestedElasticResumesAccountForEverySample) {
  std::mt19937_64 rng(4);
  for (int trial = 0; trial < 1500; ++trial) {
    const uint64_t n = 1 + rng() % 120, b = 1 + rng() % 6;
    const bool drop_last = rng() % 2;
    const int jobs = 1 + static_cast<int>(rng() % 5);
    std::vector<uint64_t> count(n, 0);
    uint64_t at = 0, last_world = 1, last_start = 0, last_covered = 0;
    for (int job = 0; job < jobs && at < n; ++job) {
      const uint64_t world = 1 + rng() % 6;
      std::vector<BatchPlan> ranks;
      for (uint64_t r = 0; r < world; ++r) ranks.emplace_back(n, b, drop_last, r, world, at);
      const uint64_t batches = ranks[0].num_batches();
      for (const BatchPlan& p : ranks) ASSERT_EQ(p.num_batches(), batches);
      const bool last = job == jobs - 1;
      const uint64_t done = last ? batches : rng() % (batches + 1);
      for (const BatchPlan& p : ranks)
        for (uint64_t k = 0; k < done; ++k)
          for (uint64_t s = 0; s < p.batch_length(k); ++s) ++count[p.global_position(k * b + s)];
      for (const BatchPlan& p : ranks)
        ASSERT_EQ(p.position_after(done), ranks[0].position_after(done));
      last_world = world;
      last_start = at;
      last_covered = batches * b * world;
      at = ranks[0].position_after(done);
    }
    ASSERT_EQ(at, n) << "the epoch was not finished";
    uint64_t repeats = 0;
    for (uint64_t p = 0; p < n; ++p) {
      if (drop_last) {
        ASSERT_EQ(count[p], p < last_start + last_covered ? 1u : 0u) << trial << " position " << p;
      } else {
        ASSERT_GE(count[p], 1u) << trial << " position " << p;
        repeats += count[p] - 1;
      }
    }
    ASSERT_LT(repeats, last_world) << trial;
  }
}

TEST(BatchPlan, StridedViewTakesEveryStepthBatch) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 1000; ++trial) {
    const uint64_t n = 1 + rng() % 90, b = 1 + rng() % 7, world = 1 + rng() % 4;
    const BatchPlan plan(n, b, rng() % 2, rng() % world, world, rng() % n);
    const auto all = plan_batches(plan);
    const uint64_t step = 1 + rng() % 5, first = rng() % (plan.num_batches() + 2);
    const BatchPlan view = plan.strided(first, step);
    std::vector<std::vector<uint64_t>> expected;
    uint64_t samples = 0;
    for (uint64_t k = first; k < all.size(); k += step) {
      expected.push_back(all[k]);
      samples += all[k].size();
    }
    ASSERT_EQ(plan_batches(view), expected);
    ASSERT_EQ(view.samples_per_rank(), samples);
    ASSERT_TRUE(view.is_strided() || (first == 0 && step == 1));
    // Views compose: every second batch of the view is every (2 * step)-th of the plan.
    std::vector<std::vector<uint64_t>> halves;
    for (uint64_t k = 1; k < expected.size(); k += 2) halves.push_back(expected[k]);
    ASSERT_EQ(plan_batches(view.strided(1, 2)), halves);
  }
}

TEST(BatchPlan, RejectsInvalidArguments) {
  EXPECT_THROW(BatchPlan(10, 0, false, 0, 1), InvalidArgument);
  EXPECT_THROW(BatchPlan(10, 2, false, 0, 0), InvalidArgument);
  EXPECT_THROW(BatchPlan(10, 2, false, 3, 3), InvalidArgument);
  EXPECT_THROW(BatchPlan(10, 2, false, 0, 1, 11), InvalidArgument);
  EXPECT_EQ(BatchPlan(10, 2, false, 0, 1, 10).num_batches(), 0u);
  const BatchPlan plan(10, 2, false, 0, 2);
  EXPECT_THROW(plan.strided(0, 0), InvalidArgument);
  EXPECT_THROW(plan.strided(1, 2).position_after(0), InvalidArgument);
  EXPECT_THROW(plan.position_after(plan.num_batches() + 1), InvalidArgument);
  EXPECT_EQ(plan.position_after(plan.num_batches()), 10u);
  EXPECT_EQ(plan.position_after(1), 4u);
}

}  // namespace
}  // namespace stoker
