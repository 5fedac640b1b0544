// Colour and tone operations (color_ops.cc): properties and small cases worked out by hand from
// torchvision's formulas. tests/python/test_vision_color_ops.py holds them against torchvision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "stoker/image/ops.h"
#include "stoker/errors.h"

namespace stoker::image::internal {

// color_ops.cc's test hook: true runs the baseline-ISA loops where the CPU has AVX2 + FMA.
void force_baseline_color_kernels(bool on);

namespace {

constexpr uint8_t kGuard = 0xA5;  // what the bytes past each row hold, to catch writes there

// An image whose rows are `pad` bytes longer than its pixels.
struct Image {
  std::vector<uint8_t> bytes;
  int height = 0, width = 0;
  size_t stride = 0;

  Image(int h, int w, size_t pad = 0)
      : bytes(static_cast<size_t>(h) * (3 * static_cast<size_t>(w) + pad), kGuard),
        height(h),
        width(w),
        stride(3 * static_cast<size_t>(w) + pad) {}

  RgbView view() { return {bytes.data(), height, width, stride}; }
  uint8_t* at(int y, int x) { return bytes.data() + y * stride + 3 * static_cast<size_t>(x); }
  void set(int y, int x, uint8_t r, uint8_t g, uint8_t b) {
    uint8_t* p = at(y, x);
    p[0] = r;
    p[1] = g;
    p[2] = b;
  }
  std::vector<uint8_t> pixels() const {  // packed, without the row padding
    std::vector<uint8_t> out;
    for (int y = 0; y < height; ++y) {
      const uint8_t* row = bytes.data() + y * stride;
      out.insert(out.end(), row, row + 3 * static_cast<size_t>(width));
    }
    return out;
  }
  bool guards_intact() const {
    for (int y = 0; y < height; ++y) {
      for (size_t i = 3 * static_cast<size_t>(width); i < stride; ++i) {
        if (bytes[y * stride + i] != kGuard) return false;
      }
    }
    return true;
  }
};

Image random_image(int h, int w, uint32_t seed, size_t pad = 0) {
  Image img(h, w, pad);
  std::mt19937 rng(seed);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      img.set(y, x, uint8_t(rng()), uint8_t(rng()), uint8_t(rng()));
    }
  }
  return img;
}

Image constant_image(int h, int w, uint8_t r, uint8_t g, uint8_t b) {
  Image img(h, w);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) img.set(y, x, r, g, b);
  }
  return img;
}

std::vector<uint8_t> px(std::initializer_list<int> v) { return {v.begin(), v.end()}; }

// Every operation, by name, with one set of parameters that changes most images.
struct NamedOp {
  std::string name;
  std::function<void(RgbView, OpScratch&)> run;
};

std::vector<NamedOp> all_ops() {
  return {
      {"brightness", [](RgbView v, OpScratch&) { adjust_brightness(v, 1.3); }},
      {"contrast", [](RgbView v, OpScratch&) { adjust_contrast(v, 0.6); }},
      {"saturation", [](RgbView v, OpScratch&) { adjust_saturation(v, 1.7); }},
      {"hue", [](RgbView v, OpScratch& s) { adjust_hue(v, -0.21, s); }},
      {"sharpness", [](RgbView v, OpScratch& s) { adjust_sharpness(v, 1.8, s); }},
      {"grayscale", [](RgbView v, OpScratch&) { rgb_to_grayscale(v); }},
      {"posterize", [](RgbView v, OpScratch&) { posterize(v, 3); }},
      {"solarize", [](RgbView v, OpScratch&) { solarize(v, 100); }},
      {"autocontrast", [](RgbView v, OpScratch&) { autocontrast(v); }},
      {"equalize", [](RgbView v, OpScratch&) { equalize(v); }},
      {"invert", [](RgbView v, OpScratch&) { invert(v); }},
      {"gaussian_blur", [](RgbView v, OpScratch& s) { gaussian_blur(v, 1, 1, 0.8, 0.8, s); }},
      {"gaussian_blur_5x3",
       [](RgbView v, OpScratch& s) {
         if (v.width > 2 && v.height > 1) gaussian_blur(v, 5, 3, 1.4, 0.6, s);
       }},
  };
}

// --- Per-value operations --------------------------------------------------------------------

TEST(ColorOpsBrightness, ZeroIsBlackOneIsIdentityAndProductsTruncate) {
  Image img = random_image(5, 7, 1);
  const auto before = img.pixels();
  adjust_brightness(img.view(), 1.0);
  EXPECT_EQ(img.pixels(), before);
  adjust_brightness(img.view(), 0.0);
  EXPECT_EQ(img.pixels(), std::vector<uint8_t>(before.size(), 0));

  Image small(1, 2);
  small.set(0, 0, 3, 100, 255);
  small.set(0, 1, 1, 128, 200);
  adjust_brightness(small.view(), 0.5);  // 1.5 -> 1, 127.5 -> 127: truncation, not rounding
  EXPECT_EQ(small.pixels(), px({1, 50, 127, 0, 64, 100}));
  adjust_brightness(small.view(), 2.5);  // saturates at 255
  EXPECT_EQ(small.pixels(), px({2, 125, 255, 0, 160, 250}));
}

TEST(ColorOpsContrast, BlendsWithTheMeanOfTheFlooredGrayscale) {
  // Lumas 18.149 and 124.18 floor to 18 and 124: mean 71.
  Image img(1, 2);
  img.set(0, 0, 10, 20, 30);
  img.set(0, 1, 200, 100, 50);
  Image flat = img;
  adjust_contrast(flat.view(), 0.0);
  EXPECT_EQ(flat.pixels(), std::vector<uint8_t>(6, 71));
  Image half = img;
  adjust_contrast(half.view(), 0.5);  // x / 2 + 35.5, truncated
  EXPECT_EQ(half.pixels(), px({40, 45, 50, 135, 85, 60}));
  Image same = img;
  adjust_contrast(same.view(), 1.0);
  EXPECT_EQ(same.pixels(), img.pixels());
  Image twice = img;
  adjust_contrast(twice.view(), 2.0);  // 2x - 71, clamped
  EXPECT_EQ(twice.pixels(), px({0, 0, 0, 255, 129, 29}));
}

TEST(ColorOpsPosterize, KeepsTheTopBits) {
  Image img(1, 2);
  img.set(0, 0, 0b10110111, 255, 0);
  img.set(0, 1, 127, 128, 1);
  Image eight = img;
  posterize(eight.view(), 8);
  EXPECT_EQ(eight.pixels(), img.pixels());
  Image three = img;
  posterize(three.view(), 3);
  EXPECT_EQ(three.pixels(), px({0b10100000, 0b11100000, 0, 0b01100000, 128, 0}));
  Image one = img;
  posterize(one.view(), 1);
  EXPECT_EQ(one.pixels(), px({128, 128, 0, 0, 128, 0}));
  Image zero = img;
  posterize(zero.view(), 0);
  EXPECT_EQ(zero.pixels(), std::vector<uint8_t>(6, 0));
}

TEST(ColorOpsSolarize, InvertsValuesAtOrAboveTheThresholdComparedInFloat32) {
  Image img(1, 2);
  img.set(0, 0, 0, 127, 128);
  img.set(0, 1, 129, 254, 255);
  Image all = img;
  solarize(all.view(), 0);
  EXPECT_EQ(all.pixels(), px({255, 128, 127, 126, 1, 0}));
  Image none = img;
  solarize(none.view(), 256);  // above 255 (torchvision rejects it): nothing reaches it
  EXPECT_EQ(none.pixels(), img.pixels());
  Image mid = img;
  solarize(mid.view(), 128);
  EXPECT_EQ(mid.pixels(), px({0, 127, 127, 126, 1, 0}));
  // torch compares in float32: 128.000001 rounds to 128, so 128 is inverted; 128.1 does not.
  Image rounded = img;
  solarize(rounded.view(), 128.000001);
  EXPECT_EQ(rounded.pixels(), mid.pixels());
  Image above = img;
  solarize(above.view(), 128.1);
  EXPECT_EQ(above.pixels(), px({0, 127, 128, 126, 1, 0}));
  Image last = img;
  solarize(last.view(), 255);
  EXPECT_EQ(last.pixels(), px({0, 127, 128, 129, 254, 0}));
}

TEST(ColorOpsInvert, TwiceIsIdentity) {
  Image img = random_image(9, 11, 2);
  const auto before = img.pixels();
  invert(img.view());
  for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(img.pixels()[i], 255 - before[i]);
  invert(img.view());
  EXPECT_EQ(img.pixels(), before);
}

TEST(ColorOpsAutocontrast, StretchesEachChannelAndKeepsFlatOnes) {
  Image img(1, 3);
  img.set(0, 0, 50, 7, 0);
  img.set(0, 1, 75, 7, 128);
  img.set(0, 2, 100, 7, 255);
  autocontrast(img.view());
  // red: (x - 50) / (50 * float(1 / 255)): 0, 127.49.. -> 127, and 254.99998 -> 254 (torch gives
  // 254 too: float(1 / 255) is above 1 / 255); green is flat (kept); blue spans 0..255 already.
  EXPECT_EQ(img.pixels(), px({0, 7, 0, 127, 7, 128, 254, 7, 255}));
}

TEST(ColorOpsEqualize, ConstantImageIsKept) {
  Image img = constant_image(6, 5, 9, 200, 0);
  equalize(img.view());
  EXPECT_EQ(img.pixels(), constant_image(6, 5, 9, 200, 0).pixels());
}

TEST(ColorOpsEqualize, FollowsPillowsStepScheme) {
  // 255 pixels of 10 and 255 of 200 in each channel: step = 255 // 255 = 1, so
  // lut[k] = cum[k - 1]: 10 -> 0 and 200 -> 255 (clamped from 255).
  Image img(2, 255);
  for (int x = 0; x < 255; ++x) {
    img.set(0, x, 10, 200, 10);
    img.set(1, x, 200, 10, 200);
  }
  equalize(img.view());
  for (int x = 0; x < 255; ++x) {
    ASSERT_EQ(img.at(0, x)[0], 0);
    ASSERT_EQ(img.at(0, x)[1], 255);
    ASSERT_EQ(img.at(1, x)[0], 255);
    ASSERT_EQ(img.at(1, x)[1], 0);
  }
  // Fewer than 255 pixels outside the largest value: step 0, the channel is kept.
  Image few(1, 3);
  few.set(0, 0, 1, 1, 1);
  few.set(0, 1, 2, 2, 2);
  few.set(0, 2, 3, 3, 3);
  const auto before = few.pixels();
  equalize(few.view());
  EXPECT_EQ(few.pixels(), before);
}

// --- Grayscale, saturation, hue ----------------------------------------------------------------

TEST(ColorOpsGrayscale, TruncatesTheFloat32Luma) {
  Image img(1, 3);
  img.set(0, 0, 255, 255, 255);  // 0.2989 + 0.587 + 0.114 = 0.9999: white becomes 254
  img.set(0, 1, 10, 20, 30);     // 18.149
  img.set(0, 2, 0, 0, 1);        // 0.114
  rgb_to_grayscale(img.view());
  EXPECT_EQ(img.pixels(), px({254, 254, 254, 18, 18, 18, 0, 0, 0}));
}

TEST(ColorOpsGrayscale, AddsWithFusedMultiplyAddsAsTorchDoes) {
  // torch's add_(g, alpha=0.587) is one fused multiply-add: for (20, 152, 7) the luma is exactly
  // 96.0 so, and 95.99999 with a separate multiply and add. 21 of the 16.7 million colours are
  // such cases.
  Image img(1, 2);
  img.set(0, 0, 20, 152, 7);
  img.set(0, 1, 40, 244, 244);  // 183.0, against 182.99998
  Image gray = img;
  rgb_to_grayscale(gray.view());
  EXPECT_EQ(gray.pixels(), px({96, 96, 96, 183, 183, 183}));
  adjust_saturation(img.view(), 0.0);
  EXPECT_EQ(img.pixels(), gray.pixels());
}

TEST(ColorOpsSaturation, ZeroIsGrayscaleOneIsIdentity) {
  const Image img = random_image(13, 17, 3);
  Image gray = img, zero = img, one = img;
  rgb_to_grayscale(gray.view());
  adjust_saturation(zero.view(), 0.0);
  EXPECT_EQ(zero.pixels(), gray.pixels());
  adjust_saturation(one.view(), 1.0);
  EXPECT_EQ(one.pixels(), img.pixels());

  Image two(1, 1);
  two.set(0, 0, 10, 20, 30);  // 2x - 18 (floored luma), clamped
  adjust_saturation(two.view(), 2.0);
  EXPECT_EQ(two.pixels(), px({2, 22, 42}));
}

TEST(ColorOpsHue, ZeroShiftIsIdentityWithinRoundingAndGraysAreKept) {
  OpScratch scratch;
  Image img = random_image(31, 29, 4);
  const auto before = img.pixels();
  adjust_hue(img.view(), 0.0, scratch);
  const auto after = img.pixels();
  for (size_t i = 0; i < before.size(); ++i) {
    ASSERT_LE(std::abs(int(after[i]) - int(before[i])), 1) << "at byte " << i;
  }
  Image grays(1, 256);
  for (int v = 0; v < 256; ++v) grays.set(0, v, v, v, v);
  const auto gray_before = grays.pixels();
  adjust_hue(grays.view(), 0.37, scratch);  // no saturation: the hue does not matter
  EXPECT_EQ(grays.pixels(), gray_before);
}

TEST(ColorOpsHue, HalfTurnMapsPrimariesToComplements) {
  OpScratch scratch;
  Image img(1, 3);
  img.set(0, 0, 255, 0, 0);
  img.set(0, 1, 0, 255, 0);
  img.set(0, 2, 0, 0, 255);
  adjust_hue(img.view(), 0.5, scratch);
  EXPECT_EQ(img.pixels(), px({0, 255, 255, 255, 0, 255, 255, 255, 0}));
  adjust_hue(img.view(), -0.5, scratch);
  EXPECT_EQ(img.pixels(), px({255, 0, 0, 0, 255, 0, 0, 0, 255}));
}

// --- Sharpness ---------------------------------------------------------------------------------

TEST(ColorOpsSharpness, BlendsWithTheRoundedSmoothedImageInsideTheBorder) {
  OpScratch scratch;
  Image img = constant_image(3, 3, 0, 0, 0);
  img.set(1, 1, 13, 26, 200);
  Image smooth = img;
  adjust_sharpness(smooth.view(), 0.0, scratch);  // centre: 5 * x / 13, rounded
  EXPECT_EQ(smooth.pixels()[12], 5);
  EXPECT_EQ(smooth.pixels()[13], 10);
  EXPECT_EQ(smooth.pixels()[14], 77);  // 76.92
  Image sharp = img;
  adjust_sharpness(sharp.view(), 2.0, scratch);  // x + (x - smoothed)
  EXPECT_EQ(sharp.pixels()[12], 21);
  EXPECT_EQ(sharp.pixels()[13], 42);
  EXPECT_EQ(sharp.pixels()[14], 255);  // 323, clamped
  for (size_t i = 0; i < 27; ++i) {
    if (i / 3 != 4) {
      EXPECT_EQ(sharp.pixels()[i], 0) << "border byte " << i;
    }
  }
}

TEST(ColorOpsSharpness, MatchesThePlainFormula) {
  // Inside the border: x + (1 - factor) * (round(conv3x3([[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13)) -
  // x), clamped and truncated; for these factors every step is exact in double.
  OpScratch scratch;
  for (double factor : {0.0, 0.5, 2.0}) {
    Image img = random_image(11, 14, 14);
    std::vector<uint8_t> expected = img.pixels();
    for (int y = 1; y + 1 < img.height; ++y) {
      for (int x = 1; x + 1 < img.width; ++x) {
        for (int c = 0; c < 3; ++c) {
          double s = 4.0 * img.at(y, x)[c];
          for (int dy = -1; dy <= 1; ++dy) {
            for (int dx = -1; dx <= 1; ++dx) s += img.at(y + dy, x + dx)[c];
          }
          const double blurred = std::nearbyint(s / 13);
          const double v = img.at(y, x)[c] + (1 - factor) * (blurred - img.at(y, x)[c]);
          expected[(y * img.width + x) * 3 + c] = uint8_t(std::clamp(v, 0.0, 255.0));
        }
      }
    }
    adjust_sharpness(img.view(), factor, scratch);
    EXPECT_EQ(img.pixels(), expected) << "factor " << factor;
  }
}

TEST(ColorOpsSharpness, FactorOneAndThinImagesAreKept) {
  OpScratch scratch;
  Image img = random_image(8, 9, 5);
  const auto before = img.pixels();
  adjust_sharpness(img.view(), 1.0, scratch);
  EXPECT_EQ(img.pixels(), before);
  for (auto [h, w] : {std::pair{2, 9}, std::pair{9, 2}, std::pair{1, 1}, std::pair{1, 40}}) {
    Image thin = random_image(h, w, 6);
    const auto thin_before = thin.pixels();
    adjust_sharpness(thin.view(), 0.0, scratch);  // no interior pixel
    EXPECT_EQ(thin.pixels(), thin_before) << h << "x" << w;
  }
}

// --- Gaussian blur ---------------------------------------------------------------------------

// torch's blur written plainly: the 2D kernel from the 1D formula in double, reflect padding by
// index, rounding to nearest. It differs from torch (and color_ops.cc) only in the last bits of
// the sums.
std::vector<double> reference_kernel(int size, double sigma) {
  std::vector<double> k(size);
  double total = 0;
  const double lim = (size - 1) / (2.0 * std::sqrt(2.0));
  for (int i = 0; i < size; ++i) {
    const double x = size == 1 ? 0.0 : -lim + 2 * lim * i / (size - 1);
    k[i] = std::exp(-(x / sigma) * (x / sigma));
    total += k[i];
  }
  for (double& v : k) v /= total;
  return k;
}

std::vector<double> reference_blur(Image& img, int kw, int kh, double sx, double sy) {
  const auto kx = reference_kernel(kw, sx), ky = reference_kernel(kh, sy);
  auto reflect = [](int i, int n) { return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i; };
  std::vector<double> out;
  for (int y = 0; y < img.height; ++y) {
    for (int x = 0; x < img.width; ++x) {
      for (int c = 0; c < 3; ++c) {
        double s = 0;
        for (int i = 0; i < kh; ++i) {
          for (int j = 0; j < kw; ++j) {
            s += ky[i] * kx[j] *
                 img.at(reflect(y + i - kh / 2, img.height), reflect(x + j - kw / 2, img.width))[c];
          }
        }
        out.push_back(s);
      }
    }
  }
  return out;
}

void expect_blur_matches_reference(int h, int w, int kw, int kh, double sx, double sy) {
  OpScratch scratch;
  Image img = random_image(h, w, 7 + h * 31 + w);
  const auto expected = reference_blur(img, kw, kh, sx, sy);
  gaussian_blur(img.view(), kw, kh, sx, sy, scratch);
  const auto got = img.pixels();
  for (size_t i = 0; i < got.size(); ++i) {
    // Exact where the sum is not within float error of k + 0.5.
    const double frac = expected[i] - std::floor(expected[i]);
    if (std::abs(frac - 0.5) < 1e-3) continue;
    ASSERT_EQ(got[i], std::lround(expected[i]))
        << h << "x" << w << " kernel " << kw << "x" << kh << " byte " << i;
  }
}

TEST(ColorOpsGaussianBlur, MatchesThePlainFormulaWithReflectPadding) {
  expect_blur_matches_reference(9, 12, 3, 3, 0.8, 0.8);
  expect_blur_matches_reference(9, 12, 7, 5, 2.0, 0.7);
  expect_blur_matches_reference(6, 7, 13, 11, 5.0, 3.0);  // radius 6 and 5: the most reflect allows
  expect_blur_matches_reference(16, 5, 1, 23, 0.3, 4.0);
  expect_blur_matches_reference(1, 20, 9, 1, 1.5, 1.0);  // one row
  expect_blur_matches_reference(20, 1, 1, 9, 1.0, 1.5);  // one column
}

TEST(ColorOpsGaussianBlur, ConstantStaysConstantAndOneByOneIsIdentity) {
  OpScratch scratch;
  for (uint8_t v : {0, 1, 128, 254, 255}) {
    Image img = constant_image(12, 14, v, 255 - v, 77);
    gaussian_blur(img.view(), 23, 9, 5.0, 0.1, scratch);
    EXPECT_EQ(img.pixels(), constant_image(12, 14, v, 255 - v, 77).pixels()) << int(v);
  }
  Image img = random_image(5, 6, 8);
  const auto before = img.pixels();
  gaussian_blur(img.view(), 1, 1, 3.0, 3.0, scratch);
  EXPECT_EQ(img.pixels(), before);
}

TEST(ColorOpsGaussianBlur, RejectsImagesReflectPaddingCannotCover) {
  // torch's reflect padding needs each padding below the side it mirrors: radius 2 needs 3 pixels.
  OpScratch scratch;
  Image narrow = random_image(8, 2, 9);
  const auto before = narrow.pixels();
  try {
    gaussian_blur(narrow.view(), 5, 1, 1.0, 1.0, scratch);
    FAIL() << "a 5-wide kernel on a 2-wide image must throw";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the image is 2x8"), std::string::npos) << e.what();
  }
  EXPECT_EQ(narrow.pixels(), before);
  Image flat = random_image(1, 8, 9);
  EXPECT_THROW(gaussian_blur(flat.view(), 3, 3, 1.0, 1.0, scratch), InvalidArgument);
  Image three = random_image(3, 3, 9);
  EXPECT_NO_THROW(gaussian_blur(three.view(), 5, 5, 1.0, 1.0, scratch));
  EXPECT_THROW(gaussian_blur(three.view(), 7, 5, 1.0, 1.0, scratch), InvalidArgument);
}

TEST(ColorOpsGaussianBlur, WarmScratchIsReused) {
  OpScratch scratch;
  Image img = random_image(40, 30, 10);
  gaussian_blur(img.view(), 9, 7, 2.0, 1.5, scratch);
  const float* data = scratch.f.data();
  const size_t capacity = scratch.f.capacity();
  gaussian_blur(img.view(), 9, 7, 2.0, 1.5, scratch);
  gaussian_blur(img.view(), 5, 3, 1.0, 1.0, scratch);  // smaller: fits
  EXPECT_EQ(scratch.f.data(), data);
  EXPECT_EQ(scratch.f.capacity(), capacity);
}

// --- Every operation -----------------------------------------------------------------------

TEST(ColorOpsLayout, StridedRowsGiveThePackedResultAndPaddingIsUntouched) {
  for (const auto& op : all_ops()) {
    for (auto [h, w] : {std::pair{17, 23}, std::pair{1, 40}, std::pair{40, 1}, std::pair{3, 3}}) {
      OpScratch scratch;
      Image packed = random_image(h, w, 11);
      Image strided = random_image(h, w, 11, 13);
      ASSERT_EQ(packed.pixels(), strided.pixels());
      op.run(packed.view(), scratch);
      op.run(strided.view(), scratch);
      EXPECT_EQ(strided.pixels(), packed.pixels()) << op.name << " " << h << "x" << w;
      EXPECT_TRUE(strided.guards_intact()) << op.name << " " << h << "x" << w;
    }
  }
}

TEST(ColorOpsLayout, EmptyImagesAreLeftAlone) {
  for (const auto& op : all_ops()) {
    OpScratch scratch;
    Image none(0, 5), zero_width(4, 0, 6);
    op.run(none.view(), scratch);
    op.run(zero_width.view(), scratch);
    EXPECT_TRUE(zero_width.guards_intact()) << op.name;
  }
}

TEST(ColorOpsDispatch, BaselineAndVectorKernelsAgreeBitForBit) {
  const std::vector<std::function<void(RgbView, OpScratch&)>> ops = {
      [](RgbView v, OpScratch&) { rgb_to_grayscale(v); },
      [](RgbView v, OpScratch&) { adjust_contrast(v, 0.37); },
      [](RgbView v, OpScratch&) { adjust_saturation(v, 0.0); },
      [](RgbView v, OpScratch&) { adjust_saturation(v, 1.37); },
      [](RgbView v, OpScratch&) { adjust_saturation(v, 1.0 - 1e-9); },
      [](RgbView v, OpScratch& s) { adjust_hue(v, 0.5, s); },
      [](RgbView v, OpScratch& s) { adjust_hue(v, -0.123, s); },
      [](RgbView v, OpScratch& s) { adjust_sharpness(v, 0.0, s); },
      [](RgbView v, OpScratch& s) { adjust_sharpness(v, 2.9, s); },
      [](RgbView v, OpScratch& s) { gaussian_blur(v, 11, 7, 3.0, 1.1, s); },
  };
  for (size_t i = 0; i < ops.size(); ++i) {
    OpScratch scratch;
    Image vector_isa = random_image(37, 45, 12);
    Image baseline = random_image(37, 45, 12);
    ops[i](vector_isa.view(), scratch);
    force_baseline_color_kernels(true);
    ops[i](baseline.view(), scratch);
    force_baseline_color_kernels(false);
    EXPECT_EQ(baseline.pixels(), vector_isa.pixels()) << "operation " << i;
  }
}

TEST(ColorOpsArguments, RejectsWhatTorchvisionRejects) {
  OpScratch scratch;
  Image img = random_image(4, 4, 13);
  const auto before = img.pixels();
  auto message = [&](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "(no exception)";
  };
  EXPECT_EQ(message([&] { adjust_brightness(img.view(), -0.5); }),
            "adjust_brightness: brightness_factor (-0.5) is not a finite non-negative number");
  EXPECT_THROW(adjust_contrast(img.view(), -1), InvalidArgument);
  EXPECT_THROW(adjust_saturation(img.view(), NAN), InvalidArgument);
  EXPECT_THROW(adjust_sharpness(img.view(), -1e-3, scratch), InvalidArgument);
  EXPECT_EQ(message([&] { adjust_hue(img.view(), 0.51, scratch); }),
            "adjust_hue: hue_factor (0.51) is not in [-0.5, 0.5]");
  EXPECT_THROW(adjust_hue(img.view(), -0.6, scratch), InvalidArgument);
  EXPECT_EQ(message([&] { posterize(img.view(), 9); }), "posterize: bits must be in [0, 8], got 9");
  EXPECT_THROW(posterize(img.view(), -1), InvalidArgument);
  EXPECT_EQ(message([&] { gaussian_blur(img.view(), 4, 3, 1.0, 1.0, scratch); }),
            "gaussian_blur: kernel_size should have odd and positive integers, got [4, 3]");
  EXPECT_THROW(gaussian_blur(img.view(), 3, -1, 1.0, 1.0, scratch), InvalidArgument);
  EXPECT_EQ(message([&] { gaussian_blur(img.view(), 3, 3, 0.0, 1.0, scratch); }),
            "gaussian_blur: sigma should have positive values, got [0, 1]");
  EXPECT_EQ(img.pixels(), before);
}

}  // namespace
}  // namespace stoker::image::internal
