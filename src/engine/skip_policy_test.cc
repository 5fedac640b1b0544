#include "engine/skip_policy.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "stoker/random.h"

namespace stoker {
namespace {

// The candidates the rule tries, in order, when every one fails.
std::vector<uint64_t> tried(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t n) {
  std::vector<uint64_t> out;
  find_replacement(seed, epoch, index, n, [&](uint64_t c) {
    out.push_back(c);
    return false;
  });
  return out;
}

TEST(SkipPolicy, CandidatesDependOnlyOnSeedEpochIndex) {
  const std::vector<uint64_t> a = tried(7, 3, 11, 1000);
  EXPECT_EQ(a, tried(7, 3, 11, 1000));
  EXPECT_NE(a, tried(8, 3, 11, 1000));
  EXPECT_NE(a, tried(7, 4, 11, 1000));
  EXPECT_NE(a, tried(7, 3, 12, 1000));
  ASSERT_EQ(a.size(), size_t(kSkipAttempts));  // 1000 samples: none equal to 11 here
  for (int attempt = 1; attempt <= kSkipAttempts; ++attempt)
    EXPECT_EQ(a[attempt - 1], hash_key(7, 3, 11 * kSkipAttempts + attempt) % 1000);
}

TEST(SkipPolicy, PassesOverTheSampleItselfAndHasNoneForOneSample) {
  const std::vector<uint64_t> two = tried(1, 0, 0, 2);
  for (uint64_t c : two) EXPECT_EQ(c, 1u);
  EXPECT_LT(two.size(), size_t(kSkipAttempts));  // some of the 16 hit sample 0 and were passed over
  EXPECT_TRUE(tried(1, 0, 0, 1).empty());
}

TEST(SkipPolicy, StopsAtTheFirstCandidateThatReads) {
  const std::vector<uint64_t> all = tried(5, 2, 4, 1000);
  const std::set<uint64_t> unreadable{all[0], all[1]};
  int calls = 0;
  const uint64_t got = read_replacement(5, 2, 4, 1000, "p", [&](uint64_t c) {
    ++calls;
    if (unreadable.count(c)) throw IoError("cannot read");
  });
  EXPECT_EQ(got, all[2]);
  EXPECT_EQ(calls, 3);
}

TEST(SkipPolicy, NoReadableCandidateIsASampleErrorOfTheFailedSample) {
  try {
    read_replacement(5, 2, 4, 1000, "file-4", [](uint64_t) { throw IoError("no"); });
    FAIL() << "expected a SampleError";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.index(), 4u);
    EXPECT_EQ(e.path(), "file-4");
    EXPECT_EQ(SampleError::message_of(e.cause()),
              "on_error=\"skip\": no readable replacement found after 16 attempts");
    EXPECT_EQ(no_replacement_message(), SampleError::message_of(e.cause()));
  }
}

TEST(SkipPolicy, RecordsDescriptionsAndKeepsTheNewestListed) {
  SkippedSamples s;
  const auto cause = std::make_exception_ptr(IoError("bad bytes"));
  s.record(3, "a.jpg", cause);
  uint64_t count = 0;
  std::vector<std::string> listed;
  s.read(&count, &listed);
  EXPECT_EQ(count, 1u);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0], "sample 3 (a.jpg): bad bytes");
  for (uint64_t i = 0; i < kSkippedListed + 5; ++i) s.record(100 + i, "", cause);
  s.read(&count, &listed);
  EXPECT_EQ(count, kSkippedListed + 6);
  ASSERT_EQ(listed.size(), kSkippedListed);
  EXPECT_EQ(listed.front(), "sample 105: bad bytes");
  EXPECT_EQ(listed.back(), "sample " + std::to_string(100 + kSkippedListed + 4) + ": bad bytes");
}

TEST(SkipPolicy, CountAndListChangeTogether) {
  SkippedSamples s;
  const auto cause = std::make_exception_ptr(IoError("x"));
  std::thread writer([&] {
    for (uint64_t i = 0; i < 2000; ++i) s.record(i, "", cause);
  });
  for (int k = 0; k < 200; ++k) {
    uint64_t count = 0;
    std::vector<std::string> listed;
    s.read(&count, &listed);
    ASSERT_EQ(listed.size(), std::min<uint64_t>(count, kSkippedListed));
    if (count > 0) {
      ASSERT_EQ(listed.back(), "sample " + std::to_string(count - 1) + ": x");
    }
  }
  writer.join();
}

}  // namespace
}  // namespace stoker
