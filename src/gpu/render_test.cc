// The GPU kernels' arithmetic (kernels.h, compiled here for the host) against the CPU path's.
#include "gpu/render.h"

#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>

#include "image/resample.h"
#include "image/test_images.h"
#include "stoker/image/pipeline.h"

namespace stoker::image::gpu {
namespace {

using image::internal::AxisCoeffs;
using image::internal::AxisSpec;
using image::internal::compute_coeffs;

// Every output pixel's first source pixel, count and fixed-point weights, as the CPU resampler
// computes them: on the GPU they are computed per pixel, in double, by k_coeffs.
void expect_same_coefficients(const AxisSpec& s) {
  AxisCoeffs c;
  compute_coeffs(s, c);
  StagedAxis a{0, s.in_size, s.in0, s.in1, s.full_out, s.out_offset, s.out_size};
  const internal::k::KAxis k = internal::kernel_axis(a);
  ASSERT_EQ(k.ksize, c.ksize);
  std::vector<int32_t> w(k.ksize);
  for (int i = 0; i < s.out_size; ++i) {
    int32_t first = -1, count = -1;
    internal::k::k_coeffs(k, i, &first, &count, w.data());
    ASSERT_EQ(count, c.count[i]) << i;
    if (count == 0) continue;
    ASSERT_EQ(first, c.first[i]) << i;
    for (int j = 0; j < k.ksize; ++j)
      ASSERT_EQ(w[j], c.k[static_cast<size_t>(i) * c.ksize + j]) << "pixel " << i << " tap " << j;
  }
  // The rows the vertical pass reads: the CPU resampler's [lo, hi).
  int32_t lo = 0, rows = 0;
  internal::vertical_rows(k, &lo, &rows);
  EXPECT_EQ(rows, c.hi - c.lo);
  if (rows > 0) {
    EXPECT_EQ(lo, c.lo);
  }
}

TEST(GpuKernels, CoefficientsAreTheCpuResamplersBitForBit) {
  // Downscales of every factor (wide filters), upscales, boxes with fractional edges, crops of
  // the output and padding on both sides: what plan_geometry can produce.
  std::mt19937 rng(12);
  for (int t = 0; t < 3000; ++t) {
    AxisSpec s;
    s.in_size = 1 + static_cast<int>(rng() % 3000);
    const float a = std::uniform_real_distribution<float>(0, float(s.in_size))(rng);
    const float b = std::uniform_real_distribution<float>(0, float(s.in_size))(rng);
    s.in0 = std::min(a, b);
    s.in1 = std::max(a, b) + (a == b ? 0.5f : 0.0f);
    s.full_out = 1 + static_cast<int>(rng() % 700);
    s.out_offset = static_cast<int>(rng() % 61) - 30;
    s.out_size = 1 + static_cast<int>(rng() % 300);
    if (t % 3 == 0) {  // the common case: the whole output of an integer box
      s.in0 = float(rng() % s.in_size);
      s.in1 = float(s.in0 + 1 + rng() % (s.in_size - int(s.in0)));
      s.out_offset = 0;
      s.out_size = s.full_out;
    }
    expect_same_coefficients(s);
    if (HasFatalFailure()) return;
  }
}

TEST(GpuKernels, CoefficientsOfTypicalImagenetGeometries) {
  // Resize(256) of 500x375 then CenterCrop(224); RandomResizedCrop boxes of 8% to 100%.
  expect_same_coefficients({500, 0.0f, 500.0f, 341, 58, 224});
  expect_same_coefficients({375, 0.0f, 375.0f, 256, 16, 224});
  expect_same_coefficients({143, 0.0f, 143.0f, 224, 0, 224});
  expect_same_coefficients({4000, 0.0f, 4000.0f, 224, 0, 224});
  expect_same_coefficients({1, 0.0f, 1.0f, 224, 0, 224});
}

}  // namespace
}  // namespace stoker::image::gpu
