#include "stoker/random.h"

#include <gtest/gtest.h>

#include <array>
#include <set>

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

}  // namespace
}  // namespace stoker
