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

TEST(BatchPlan, RejectsInvalidArguments) {
  EXPECT_THROW(BatchPlan(10, 0, false, 0, 1), InvalidArgument);
  EXPECT_THROW(BatchPlan(10, 2, false, 0, 0), InvalidArgument);
  EXPECT_THROW(BatchPlan(10, 2, false, 3, 3), InvalidArgument);
}

}  // namespace
}  // namespace stoker
