#include "stoker/random.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <set>
#include <utility>

namespace stoker {
namespace {

TEST(ExpandMt19937State, DeterministicPerKeyAndDistinctAcrossKeys) {
  std::array<uint32_t, 624> a{}, b{}, c{};
  expand_mt19937_state(42, a.data());
  expand_mt19937_state(42, b.data());
  expand_mt19937_state(43, c.data());
  EXPECT_EQ(a, b);
  int same = 0;
  for (int i = 0; i < 624; ++i) same += a[i] == c[i];
  EXPECT_LE(same, 2);  // neighbouring keys share no structure
  std::set<uint32_t> distinct(a.begin(), a.end());
  EXPECT_GE(distinct.size(), 620u);  // no repeated words within one state
}

TEST(ExpandMt19937State, NeverAllZeroAndOddLengthsFilled) {
  std::array<uint32_t, 5> s{};
  expand_mt19937_state(0, s.data(), 5);
  EXPECT_NE(s[0] & 0x80000000u, 0u);
  EXPECT_NE(s[4], 0u);
}

TEST(BetaSampler, NormalGammaAndBetaMomentsMatchTheirDistributions) {
  const int n = 100000;
  SampleRng rng(9, 1, 2);
  double s = 0, s2 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = sample_normal(rng);
    s += z;
    s2 += z * z;
  }
  EXPECT_NEAR(s / n, 0.0, 0.015);
  EXPECT_NEAR(s2 / n, 1.0, 0.02);
  // Gamma(k): mean k, variance k; below 1 through the boost, above through Marsaglia-Tsang.
  for (double shape : {0.05, 0.3, 1.0, 2.5, 9.0}) {
    double m = 0, m2 = 0;
    for (int i = 0; i < n; ++i) {
      const double g = std::exp(sample_log_gamma(rng, shape));
      m += g;
      m2 += g * g;
    }
    m /= n;
    EXPECT_NEAR(m, shape, 0.02 * std::max(shape, 0.5)) << shape;
    EXPECT_NEAR(m2 / n - m * m, shape, 0.05 * std::max(shape, 0.5)) << shape;
  }
  // Beta(a, b): mean a / (a + b), variance ab / ((a + b)^2 (a + b + 1)).
  for (auto [a, b] : {std::pair{0.2, 0.2}, {0.8, 0.8}, {2.0, 5.0}, {0.5, 3.0}}) {
    double m = 0, m2 = 0;
    for (int i = 0; i < n; ++i) {
      const double x = sample_beta(rng, a, b);
      ASSERT_GE(x, 0.0);
      ASSERT_LE(x, 1.0);
      m += x;
      m2 += x * x;
    }
    m /= n;
    EXPECT_NEAR(m, a / (a + b), 0.005) << a << " " << b;
    EXPECT_NEAR(m2 / n - m * m, a * b / ((a + b) * (a + b) * (a + b + 1)), 0.004) << a << " " << b;
  }
}

TEST(BetaSampler, SmallShapesNeitherUnderflowNorStick) {
  // Beta(0.01, 0.01) puts nearly all its mass at 0 and 1; the logs keep both ends reachable
  // and never produce NaN (X and Y alone underflow to 0 here).
  SampleRng rng(1, 2, 3);
  int low = 0, high = 0;
  for (int i = 0; i < 10000; ++i) {
    const double x = sample_beta(rng, 0.01, 0.01);
    ASSERT_FALSE(std::isnan(x));
    low += x < 0.01;
    high += x > 0.99;
  }
  EXPECT_GT(low, 4500);
  EXPECT_GT(high, 4500);
}

TEST(BetaSampler, DrawsDependOnlyOnTheKey) {
  SampleRng a(5, 6, 7), b(5, 6, 7), c(5, 6, 8);
  for (int i = 0; i < 50; ++i) {
    const double x = sample_beta(a, 0.8, 0.8);
    EXPECT_EQ(x, sample_beta(b, 0.8, 0.8));
    EXPECT_NE(x, sample_beta(c, 0.8, 0.8));
  }
}

}  // namespace
}  // namespace stoker
