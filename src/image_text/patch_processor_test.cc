#include "stoker/image_text/patch_processor.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "stoker/errors.h"

namespace stoker::image_text {
namespace {

// Hugging Face's smart_resize (transformers 5.24) on these sizes, default options and
// min_pixels = 4 * 28^2, max_pixels = 64 * 28^2.
TEST(PatchProcessor, SmartResizeIsHuggingFaces) {
  struct Case {
    int h, w;
    std::pair<int, int> def, small;
  };
  const std::vector<Case> cases = {
      {1, 1, {56, 56}, {56, 56}},
      {10, 300, {28, 308}, {28, 308}},
      {57, 43, {56, 56}, {56, 56}},
      {480, 640, {476, 644}, {168, 252}},
      {1080, 1920, {728, 1316}, {168, 280}},
      {4000, 3000, {1148, 840}, {252, 168}},
      {14, 2799, {28, 812}, {28, 812}},
      {100, 100, {112, 112}, {112, 112}},
      {42, 70, {56, 56}, {56, 56}},
  };
  const PatchProcessor def{PatchProcessorOptions{}};
  PatchProcessorOptions o;
  o.min_pixels = 4 * 28 * 28;
  o.max_pixels = 64 * 28 * 28;
  const PatchProcessor small{o};
  for (const Case& c : cases) {
    EXPECT_EQ(def.resized_size(c.h, c.w), c.def) << c.h << "x" << c.w;
    EXPECT_EQ(small.resized_size(c.h, c.w), c.small) << c.h << "x" << c.w;
  }
  const PatchGrid g = def.grid(480, 640);
  EXPECT_EQ(g.t, 1);
  EXPECT_EQ(g.h, 34);
  EXPECT_EQ(g.w, 46);
  EXPECT_EQ(def.image_tokens(480, 640), 34 * 46 / 4);
  EXPECT_EQ(def.patch_dim(), 3 * 2 * 14 * 14);
  EXPECT_EQ(small.max_patches(), 64 * 4);
}

// An image already at its processed size (no resampling): each patch row holds the pixels HF's
// reshape/transpose puts there, each value (v / 255 - mean) / std, repeated per temporal step.
TEST(PatchProcessor, PatchesAreInHuggingFacesOrder) {
  PatchProcessorOptions o;
  o.patch_size = 2;
  o.merge_size = 2;
  o.temporal_patch_size = 2;
  o.min_pixels = 4;
  o.max_pixels = 1 << 20;
  o.mean = {0.5f, 0.25f, 0.0f};
  o.std = {0.5f, 0.25f, 1.0f};
  const PatchProcessor proc(o);
  const int h = 8, w = 12;  // multiples of 4: grid 4 x 6, merge blocks 2 x 3
  std::mt19937 gen(3);
  std::vector<uint8_t> rgb(size_t(h) * w * 3);
  for (auto& v : rgb) v = uint8_t(gen());
  std::vector<float> out(size_t(4 * 6) * proc.patch_dim());
  std::vector<uint8_t> scratch;
  const PatchGrid g = proc.process(rgb, w, h, out, scratch);
  ASSERT_EQ(g.h, 4);
  ASSERT_EQ(g.w, 6);
  int r = 0;
  for (int bh = 0; bh < 2; ++bh)
    for (int bw = 0; bw < 3; ++bw)
      for (int mh = 0; mh < 2; ++mh)
        for (int mw = 0; mw < 2; ++mw, ++r) {
          int k = 0;
          for (int c = 0; c < 3; ++c)
            for (int t = 0; t < 2; ++t)
              for (int y = 0; y < 2; ++y)
                for (int x = 0; x < 2; ++x, ++k) {
                  const int yy = (bh * 2 + mh) * 2 + y, xx = (bw * 2 + mw) * 2 + x;
                  const float v = static_cast<float>(rgb[(yy * w + xx) * 3 + c] * (1.0 / 255.0));
                  ASSERT_EQ(out[r * proc.patch_dim() + k], (v - o.mean[c]) / o.std[c])
                      << "row " << r << " col " << k;
                }
        }
}

TEST(PatchProcessor, RefusesBadOptionsAndImages) {
  PatchProcessorOptions o;
  o.min_pixels = 100;
  o.max_pixels = 10;
  EXPECT_THROW(PatchProcessor{o}, InvalidArgument);
  o = {};
  o.patch_size = 0;
  EXPECT_THROW(PatchProcessor{o}, InvalidArgument);
  o = {};
  o.std[1] = 0;
  EXPECT_THROW(PatchProcessor{o}, InvalidArgument);
  const PatchProcessor p{PatchProcessorOptions{}};
  EXPECT_THROW(p.grid(1, 201), InvalidArgument);  // aspect ratio over 200
  EXPECT_NO_THROW(p.grid(1, 200));
  EXPECT_THROW(p.grid(0, 10), InvalidArgument);
}

}  // namespace
}  // namespace stoker::image_text
