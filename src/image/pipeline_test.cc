#include "stoker/image/pipeline.h"

#include <gtest/gtest.h>
#include <png.h>

#include <cmath>
#include <cstring>
#include <set>
#include <thread>

#include "convert.h"
#include "stoker/errors.h"
#include "stoker/image/resize.h"
#include "test_images.h"

namespace stoker::image {
namespace {

using testing::encode_jpeg;
using testing::encode_png;
using testing::pattern_rgb;

// Reference: decode everything, then torchvision's steps one by one with resize_bilinear.
struct Img {
  int w, h;
  std::vector<uint8_t> rgb;
};

Img crop(const Img& in, int top, int left, int h, int w) {  // zero padding outside
  Img out{w, h, std::vector<uint8_t>(size_t(w) * h * 3, 0)};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      const int sy = y + top, sx = x + left;
      if (sy < 0 || sy >= in.h || sx < 0 || sx >= in.w) continue;
      std::memcpy(&out.rgb[(y * w + x) * 3], &in.rgb[(sy * in.w + sx) * 3], 3);
    }
  return out;
}

Img resize(const Img& in, int h, int w) {
  Img out{w, h, std::vector<uint8_t>(size_t(w) * h * 3)};
  resize_bilinear(in.rgb, in.w, in.h, {0, 0, float(in.w), float(in.h)}, w, h, out.rgb);
  return out;
}

Img decoded(std::span<const std::byte> f) {
  DecodedImage d = decode(f);
  return Img{d.width, d.height, std::move(d.rgb)};
}

std::vector<uint8_t> run_u8(const ImagePipeline& p, std::span<const std::byte> f, SampleRng rng) {
  std::vector<std::byte> out(p.output_bytes());
  ImageScratch scratch;
  p.run(f, rng, out.data(), scratch);
  std::vector<uint8_t> v(out.size());
  std::memcpy(v.data(), out.data(), out.size());
  return v;
}

const PipelineOptions kExact{.dct_min_ratio = 0};
const ToTensor kHwc8(DType::kUInt8, Layout::kHWC);

TEST(Pipeline, ResizeCenterCropEqualsStepByStep) {
  const int w = 301, h = 211;
  const auto rgb = pattern_rgb(w, h, 2);
  const auto jpeg = encode_jpeg(rgb.data(), w, h, 3, {.quality = 90, .subsample = true});
  const auto png = encode_png(rgb.data(), w * 3, w, h, PNG_COLOR_TYPE_RGB, 8);
  for (const auto* f : {&jpeg, &png}) {
    for (auto [size, c] : {std::pair{128, 112}, std::pair{256, 224}, std::pair{64, 80}}) {
      const ImagePipeline p({Resize(size), CenterCrop(c), kHwc8}, kExact);
      const Img full = decoded(*f);
      const auto [rh, rw] = resize_output_size(h, w, Resize(size));
      const Img r = resize(full, rh, rw);
      const CropBox b = center_crop_box(rh, rw, CenterCrop(c));
      EXPECT_EQ(run_u8(p, *f, SampleRng(0, 0, 0)), crop(r, b.top, b.left, c, c).rgb)
          << size << " " << c;
    }
  }
}

TEST(Pipeline, RandomResizedCropAndFlipEqualStepByStep) {
  const int w = 257, h = 190;
  const auto rgb = pattern_rgb(w, h, 4);
  const auto f = encode_jpeg(rgb.data(), w, h, 3, {.quality = 85, .subsample = true});
  const Img full = decoded(f);
  const RandomResizedCrop rrc(96, 64);
  const ImagePipeline p({rrc, RandomHorizontalFlip(0.5), kHwc8}, kExact);
  int flips = 0;
  for (uint64_t i = 0; i < 20; ++i) {
    SampleRng rng(7, 1, i);
    const CropBox b = random_resized_crop_params(h, w, rrc, rng);
    const bool flip = rng.bernoulli(0.5);
    flips += flip;
    Img expect = resize(crop(full, b.top, b.left, b.height, b.width), 96, 64);
    if (flip) {
      for (int y = 0; y < 96; ++y)
        for (int x = 0; x < 32; ++x)
          for (int c = 0; c < 3; ++c)
            std::swap(expect.rgb[(y * 64 + x) * 3 + c], expect.rgb[(y * 64 + 63 - x) * 3 + c]);
    }
    ASSERT_EQ(run_u8(p, f, SampleRng(7, 1, i)), expect.rgb) << "sample " << i;
  }
  EXPECT_GT(flips, 0);
  EXPECT_LT(flips, 20);
}

TEST(Pipeline, FlipBeforeACropMirrorsTheCrop) {
  const int w = 21, h = 9;
  const auto rgb = pattern_rgb(w, h, 6);
  const auto f = encode_png(rgb.data(), w * 3, w, h, PNG_COLOR_TYPE_RGB, 8);
  Img flipped{w, h, rgb};
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      std::memcpy(&flipped.rgb[(y * w + x) * 3], &rgb[(y * w + w - 1 - x) * 3], 3);
  // left = round((21 - 12) / 2) = round(4.5) = 4 in the flipped image.
  const Img expect = crop(flipped, 0, 4, 9, 12);
  const ImagePipeline p({RandomHorizontalFlip(1.0), CenterCrop(9, 12), kHwc8});
  EXPECT_EQ(run_u8(p, f, SampleRng(0, 0, 0)), expect.rgb);
}

TEST(Pipeline, DctScalingStaysClose) {
  const int w = 1024, h = 768;
  const auto rgb = pattern_rgb(w, h, 1);
  const auto f = encode_jpeg(rgb.data(), w, h, 3, {.quality = 90, .subsample = true});
  const std::vector<Transform> t = {Resize(128), CenterCrop(112), kHwc8};
  const auto exact = run_u8(ImagePipeline(t, kExact), f, SampleRng(0, 0, 0));
  const auto fast = run_u8(ImagePipeline(t), f, SampleRng(0, 0, 0));
  EXPECT_NE(exact, fast);  // 768 / 128 = 6: decoded at 1/4 size
  EXPECT_LT(testing::mean_abs_diff(exact, fast), 1.0);
}

// The default pipeline (DCT scaling whenever the crop is >= 2x the output) against a full-size
// decode followed by the same crop and resize: within 1.0 of 255 on average.
TEST(Pipeline, RandomResizedCropStaysWithinOneLevelOfFullDecodeCropResize) {
  const int w = 1100, h = 830;
  const auto rgb = pattern_rgb(w, h, 8);
  for (bool progressive : {false, true}) {
    const auto f = encode_jpeg(rgb.data(), w, h, 3,
                               {.quality = 90, .progressive = progressive, .subsample = true});
    const Img full = decoded(f);
    const RandomResizedCrop rrc(224, 224);
    const ImagePipeline p({rrc, kHwc8});
    double sum = 0;
    int scaled = 0;
    const int n = 40;
    for (uint64_t i = 0; i < n; ++i) {
      SampleRng params(3, 0, i);
      const CropBox b = random_resized_crop_params(h, w, rrc, params);
      const Img expect = resize(crop(full, b.top, b.left, b.height, b.width), 224, 224);
      const auto got = run_u8(p, f, SampleRng(3, 0, i));
      const double mad = testing::mean_abs_diff(got, expect.rgb);
      sum += mad;
      scaled += got != expect.rgb;
      EXPECT_LT(mad, 2.5) << "sample " << i;
    }
    EXPECT_LE(sum / n, 1.0) << "progressive " << progressive;
    EXPECT_GT(scaled, n / 4);  // most of these crops are >= 448 px: decoded at half size
  }
}

TEST(Pipeline, CenterCropLargerThanImagePadsWithZeros) {
  const auto rgb = pattern_rgb(20, 10);
  const auto f = encode_png(rgb.data(), 60, 20, 10, PNG_COLOR_TYPE_RGB, 8);
  const auto out = run_u8(ImagePipeline({CenterCrop(14, 24), kHwc8}), f, SampleRng(0, 0, 0));
  // top = round(-4 / 2) = -2, left = round(-4 / 2) = -2.
  const Img expect = crop(Img{20, 10, rgb}, -2, -2, 14, 24);
  EXPECT_EQ(out, expect.rgb);
  EXPECT_EQ(out[0], 0);
}

TEST(Pipeline, DtypesLayoutsAndNormalize) {
  const auto rgb = pattern_rgb(16, 12);
  const auto f = encode_png(rgb.data(), 48, 16, 12, PNG_COLOR_TYPE_RGB, 8);
  const std::array<float, 3> mean{0.485f, 0.456f, 0.406f}, stdev{0.229f, 0.224f, 0.225f};
  const auto hwc = run_u8(ImagePipeline({CenterCrop(12, 16), kHwc8}), f, SampleRng(0, 0, 0));
  ASSERT_EQ(hwc, rgb);
  const ImagePipeline chw8({CenterCrop(12, 16)});
  EXPECT_EQ(chw8.dtype(), DType::kUInt8);
  EXPECT_EQ(chw8.output_shape(), (std::array<int64_t, 3>{3, 12, 16}));
  const auto chw = run_u8(chw8, f, SampleRng(0, 0, 0));
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < 12 * 16; ++i) ASSERT_EQ(chw[c * 192 + i], hwc[i * 3 + c]);

  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const ImagePipeline p({CenterCrop(12, 16), ToTensor(dt), Normalize(mean, stdev)});
    EXPECT_EQ(p.output_bytes(), 3u * 12 * 16 * (dt == DType::kFloat32 ? 4 : 2));
    const auto out = run_u8(p, f, SampleRng(0, 0, 0));
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < 12 * 16; ++i) {
        const float expect = (hwc[i * 3 + c] / 255.0f - mean[c]) / stdev[c];
        const size_t at = size_t(c * 192 + i);
        if (dt == DType::kFloat32) {
          float v;
          std::memcpy(&v, &out[at * 4], 4);
          ASSERT_EQ(v, expect);
        } else {
          uint16_t v;
          std::memcpy(&v, &out[at * 2], 2);
          ASSERT_EQ(v, dt == DType::kFloat16 ? internal::float_to_half(expect)
                                             : internal::float_to_bf16(expect));
        }
      }
  }
  const auto plain = run_u8(ImagePipeline({CenterCrop(12, 16), ToTensor()}), f, SampleRng(0, 0, 0));
  float v;
  std::memcpy(&v, &plain[4 * 5], 4);
  EXPECT_EQ(v, hwc[5 * 3] / 255.0f);
}

TEST(Convert, HalfAndBfloat16RoundToNearestEven) {
  for (float f : {0.0f, 1.0f, -2.5f, 0.1f, 65504.0f, 65519.0f, 65520.0f, 1e-7f, 5.96e-8f, 2.98e-8f,
                  3.0e-8f, 6.1e-5f, 1.0f / 3.0f, 1e6f}) {
    EXPECT_EQ(internal::float_to_half(f), std::bit_cast<uint16_t>(static_cast<_Float16>(f))) << f;
  }
  EXPECT_EQ(internal::float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(internal::float_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie: even
  EXPECT_EQ(internal::float_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie: even
  EXPECT_EQ(internal::float_to_bf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
}

TEST(Pipeline, RejectsConfigurationsWithoutAFixedSizeOrInBadOrder) {
  EXPECT_THROW(ImagePipeline({Resize(256)}), InvalidArgument);
  EXPECT_THROW(ImagePipeline({RandomHorizontalFlip()}), InvalidArgument);
  EXPECT_NO_THROW(ImagePipeline({Resize(256, 200)}));
  EXPECT_NO_THROW(ImagePipeline({CenterCrop(300), Resize(256)}));  // known size, then Resize(int)
  EXPECT_THROW(ImagePipeline({ToTensor(), CenterCrop(8)}), InvalidArgument);
  EXPECT_THROW(ImagePipeline({CenterCrop(8), Normalize({0, 0, 0}, {1, 1, 1})}), InvalidArgument);
  EXPECT_THROW(
      ImagePipeline({CenterCrop(8), ToTensor(DType::kUInt8), Normalize({0, 0, 0}, {1, 1, 1})}),
      InvalidArgument);
  try {
    ImagePipeline({Resize(256)});
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("CenterCrop"), std::string::npos);
  }
  EXPECT_THROW(RandomResizedCrop(0, 5), InvalidArgument);
  EXPECT_THROW(RandomResizedCrop(5, 5, {0.5, 0.1}), InvalidArgument);
  EXPECT_THROW(RandomResizedCrop(5, 5, {0.1, 1.0}, {0.0, 1.0}), InvalidArgument);
  EXPECT_THROW(Resize(0), InvalidArgument);
  EXPECT_THROW(Resize(5, -1), InvalidArgument);
  EXPECT_THROW(CenterCrop(0), InvalidArgument);
  EXPECT_THROW(RandomHorizontalFlip(1.5), InvalidArgument);
  EXPECT_THROW(Normalize({0, 0, 0}, {1, 0, 1}), InvalidArgument);
}

TEST(Pipeline, BadInputIsDecodeError) {
  const ImagePipeline p({Resize(64), CenterCrop(56)});
  std::vector<std::byte> out(p.output_bytes());
  ImageScratch scratch;
  SampleRng rng(0, 0, 0);
  const std::string text = "not an image";
  EXPECT_THROW(p.run(std::as_bytes(std::span(text)), rng, out.data(), scratch), DecodeError);
  const auto rgb = pattern_rgb(64, 64);
  const auto f = encode_jpeg(rgb.data(), 64, 64, 3);
  EXPECT_THROW(p.run(std::span(f).first(f.size() / 2), rng, out.data(), scratch), DecodeError);
  // The scratch is still good afterwards.
  EXPECT_NO_THROW(p.run(f, rng, out.data(), scratch));
}

TEST(Pipeline, ConcurrentRunsAgreeWithSerialOnes) {
  const auto rgb = pattern_rgb(200, 150, 3);
  const auto f = encode_jpeg(rgb.data(), 200, 150, 3, {.quality = 80, .subsample = true});
  const ImagePipeline p({RandomResizedCrop(64, 64), RandomHorizontalFlip(), ToTensor()});
  std::vector<std::vector<uint8_t>> serial(16), parallel(16);
  for (int i = 0; i < 16; ++i) serial[i] = run_u8(p, f, SampleRng(1, 2, i));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = t; i < 16; i += 4) parallel[i] = run_u8(p, f, SampleRng(1, 2, i));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(serial, parallel);
}

// --- torchvision's parameter rules. ---

TEST(Transforms, RandomResizedCropParamsObeyTheRules) {
  const RandomResizedCrop t(224, 224);
  std::set<std::tuple<int, int, int, int>> seen;
  for (uint64_t i = 0; i < 2000; ++i) {
    SampleRng rng(3, 0, i);
    const CropBox b = random_resized_crop_params(375, 500, t, rng);
    ASSERT_GT(b.width, 0);
    ASSERT_GT(b.height, 0);
    ASSERT_GE(b.top, 0);
    ASSERT_GE(b.left, 0);
    ASSERT_LE(b.top + b.height, 375);
    ASSERT_LE(b.left + b.width, 500);
    // Area and aspect within the ranges, up to the rounding of w and h to integers.
    const double area = double(b.width) * b.height / (375.0 * 500.0);
    const double ratio = double(b.width) / b.height;
    const double slack_w = 0.5 / b.width, slack_h = 0.5 / b.height;
    ASSERT_LE(area, 1.0 + 1e-9);
    ASSERT_GE(area, 0.08 * (1 - slack_w) * (1 - slack_h) - 1e-9);
    ASSERT_GE(ratio, 0.75 * (1 - slack_w) / (1 + slack_h));
    ASSERT_LE(ratio, (4.0 / 3.0) * (1 + slack_w) / (1 - slack_h));
    SampleRng again(3, 0, i);
    const CropBox b2 = random_resized_crop_params(375, 500, t, again);
    ASSERT_EQ(std::tie(b.top, b.left, b.height, b.width),
              std::tie(b2.top, b2.left, b2.height, b2.width));
    seen.insert({b.top, b.left, b.height, b.width});
  }
  EXPECT_GT(seen.size(), 1900u);  // different keys, different crops
}

TEST(Transforms, RandomResizedCropFallsBackToTheClampedCentralCrop) {
  // An area of 100% at ratio 2 never fits a 100x100 image: the fallback clamps the ratio.
  SampleRng rng(0, 0, 0);
  const CropBox b =
      random_resized_crop_params(100, 100, RandomResizedCrop(8, 8, {1, 1}, {2, 3}), rng);
  EXPECT_EQ(b.width, 100);
  EXPECT_EQ(b.height, 50);
  EXPECT_EQ(b.top, 25);
  EXPECT_EQ(b.left, 0);
}

TEST(Transforms, ResizeAndCenterCropFollowTorchvision) {
  EXPECT_EQ(resize_output_size(375, 500, Resize(256)), (std::pair{256, 341}));
  EXPECT_EQ(resize_output_size(500, 375, Resize(256)), (std::pair{341, 256}));
  EXPECT_EQ(resize_output_size(427, 640, Resize(256)), (std::pair{256, 383}));
  EXPECT_EQ(resize_output_size(10, 20, Resize(3, 4)), (std::pair{3, 4}));
  // Python's round(): half to even.
  EXPECT_EQ(center_crop_box(227, 229, CenterCrop(224)).top, 2);   // round(1.5) = 2
  EXPECT_EQ(center_crop_box(229, 229, CenterCrop(224)).top, 2);   // round(2.5) = 2
  EXPECT_EQ(center_crop_box(225, 231, CenterCrop(224)).left, 4);  // round(3.5) = 4
  EXPECT_EQ(center_crop_box(225, 225, CenterCrop(224)).top, 0);   // round(0.5) = 0
}

}  // namespace
}  // namespace stoker::image
