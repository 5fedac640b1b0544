#include "stoker/image/decode_only.h"

#include <gtest/gtest.h>

#include <vector>

#include "stoker/errors.h"
#include "test_images.h"

namespace stoker::image {
namespace {

TEST(DecodeOnly, CountsWholePassesAndFailures) {
  const std::vector<uint8_t> rgb = testing::pattern_rgb(32, 24);
  std::vector<std::vector<std::byte>> files = {testing::encode_jpeg(rgb.data(), 32, 24, 3),
                                               testing::as_bytes({0xde, 0xad, 0xbe, 0xef})};
  const DecodeOnly r = decode_only(files, 2, 0.0);
  // At least one whole pass: every file tried once, the good one decoded, the bad one counted.
  EXPECT_GE(r.images, 1u);
  EXPECT_GE(r.failures, 1u);
  EXPECT_EQ(r.pixels, r.images * 32 * 24);
  EXPECT_GE(r.seconds, 0.0);
}

TEST(DecodeOnly, RefusesNoThreadsOrNoFiles) {
  EXPECT_THROW(decode_only({{std::byte{0}}}, 0, 0.0), InvalidArgument);
  EXPECT_THROW(decode_only({}, 1, 0.0), InvalidArgument);
}

}  // namespace
}  // namespace stoker::image
