#include "halve.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace stoker::image::internal {
namespace {

// Pixel (x, y) channel c of the halved picture, straight from its definition.
int expected(const std::vector<uint8_t>& src, size_t stride, int w, int h, int x, int y, int c) {
  int sum = 0, n = 0;
  for (int dy = 0; dy < 2; ++dy)
    for (int dx = 0; dx < 2; ++dx)
      if (2 * x + dx < w && 2 * y + dy < h) {
        sum += src[(2 * y + dy) * stride + 3 * (2 * x + dx) + c];
        ++n;
      }
  return n == 4 ? (sum + 2) / 4 : n == 2 ? (sum + 1) / 2 : sum;
}

TEST(Halve, EachPixelIsTheRoundedMeanOfTheBlockItCoversOnEveryPath) {
  std::mt19937 gen(7);
  for (int w = 1; w <= 70; ++w) {
    for (int h = 1; h <= 5; ++h) {
      // Rows with slack between them, but none after the last (ASan sees a read past it).
      const size_t stride = 3 * w + 5;
      std::vector<uint8_t> src(stride * (h - 1) + 3 * w);
      for (auto& b : src) b = static_cast<uint8_t>(gen());
      const int ow = (w + 1) / 2, oh = (h + 1) / 2;
      const size_t out_stride = 3 * ow + 3;
      for (const bool portable : {false, true}) {
        std::vector<uint8_t> out(out_stride * oh, 0xAB);
        halve_rgb8(src.data(), stride, w, h, out.data(), out_stride, portable);
        for (int y = 0; y < oh; ++y) {
          for (int x = 0; x < ow; ++x)
            for (int c = 0; c < 3; ++c)
              ASSERT_EQ(out[y * out_stride + 3 * x + c], expected(src, stride, w, h, x, y, c))
                  << w << "x" << h << " at " << x << "," << y << " portable " << portable;
          for (size_t i = 3 * ow; i < out_stride; ++i)
            ASSERT_EQ(out[y * out_stride + i], 0xAB) << "wrote past row " << y << " of " << w;
        }
      }
    }
  }
}

}  // namespace
}  // namespace stoker::image::internal
