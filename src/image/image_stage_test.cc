// The image stage of ImagePipeline: transforms after the fused prefix, their static sizes, the
// output tensor's random erasing, RandomApply, vertical flips, antialias=false and run_image().
// The kernels' pixels are held against torchvision in tests/python/test_vision_*_ops.py.
#include <gtest/gtest.h>
#include <png.h>

#include <atomic>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include "image_stage.h"
#include "stoker/image/ops.h"
#include "stoker/errors.h"
#include "stoker/image/decode.h"
#include "stoker/image/pipeline.h"
#include "test_images.h"

namespace stoker::image {
namespace {

using testing::encode_png;
using testing::pattern_rgb;

const PipelineOptions kExact{.dct_min_ratio = 0};

// A lossless test image (PNG), so that expected pixels come from the pattern itself.
struct Picture {
  int w, h;
  std::vector<uint8_t> rgb;
  std::vector<std::byte> png;
};

Picture picture(int w, int h, int seed = 0) {
  Picture p{w, h, pattern_rgb(w, h, seed), {}};
  p.png = encode_png(p.rgb.data(), size_t(w) * 3, w, h, PNG_COLOR_TYPE_RGB, 8);
  return p;
}

std::vector<uint8_t> run(const ImagePipeline& p, std::span<const std::byte> f, uint64_t index) {
  std::vector<std::byte> out(p.output_bytes());
  ImageScratch scratch;
  SampleRng rng(7, 0, index);
  p.run(f, rng, out.data(), scratch);
  std::vector<uint8_t> v(out.size());
  std::memcpy(v.data(), out.data(), out.size());
  return v;
}

// CHW uint8 of an HWC crop of the picture.
std::vector<uint8_t> chw_crop(const Picture& p, int top, int left, int h, int w) {
  std::vector<uint8_t> out(size_t(3) * h * w);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        out[(size_t(c) * h + y) * w + x] = p.rgb[((size_t(top) + y) * p.w + left + x) * 3 + c];
  return out;
}

TEST(ImageStage, SizesAreKnownWhereTorchvisionsAreFixed) {
  using internal::size_after;
  const std::vector<Transform> a = {CenterCrop(30, 40), Pad(1, 2, 3, 4)};
  EXPECT_EQ(size_after(a, std::nullopt), (std::pair{36, 44}));
  const std::vector<Transform> b = {Pad(1, 1, 1, 1), RandomCrop(8, 9)};
  EXPECT_EQ(size_after(b, std::nullopt), (std::pair{8, 9}));
  const std::vector<Transform> c = {ColorJitter({{0.5, 1.5}}, {}, {}, {})};
  EXPECT_EQ(size_after(c, std::nullopt), std::nullopt);
  EXPECT_EQ(size_after(c, std::pair{5, 6}), (std::pair{5, 6}));
  // A size change under RandomApply depends on the draw.
  const std::vector<Transform> d = {CenterCrop(10), RandomApply(0.5, 1), Pad(1, 1, 1, 1)};
  EXPECT_EQ(size_after(d, std::nullopt), std::nullopt);
  const std::vector<Transform> e = {CenterCrop(10), RandomApply(0.5, 1), RandomGrayscale(1)};
  EXPECT_EQ(size_after(e, std::nullopt), (std::pair{10, 10}));
}

TEST(ImageStage, ListsAreCheckedAtConstruction) {
  auto rejects = [](std::vector<Transform> ts, const char* what) {
    try {
      ImagePipeline p(std::move(ts));
      ADD_FAILURE() << "accepted: " << what;
    } catch (const InvalidArgument& e) {
      SCOPED_TRACE(e.what());
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos);
    }
  };
  rejects({CenterCrop(8), ToTensor(), RandomGrayscale(1)}, "before ToTensor");
  rejects({CenterCrop(8), RandomApply(0.5, 2), RandomGrayscale(1)}, "covers more");
  rejects({CenterCrop(8), RandomApply(0.5, 1), ToTensor()}, "only cover");
  rejects({RandomGrayscale(1)}, "output size depends");
  rejects({CenterCrop(8), RandomApply(0.5, 1), CenterCrop(4)}, "RandomApply");
  EXPECT_NO_THROW(ImagePipeline({CenterCrop(8), ToTensor(), RandomErasing(), Normalize(
                                                                                {0, 0, 0},
                                                                                {1, 1, 1})}));
  EXPECT_THROW(RandomErasing(1.5), InvalidArgument);
  EXPECT_THROW(GaussianBlur(4, 3, {1, 1}), InvalidArgument);
  EXPECT_THROW(ColorJitter({}, {}, {}, {{-0.6, 0.1}}), InvalidArgument);
  EXPECT_THROW(RandAugment(2, 31, 31), InvalidArgument);
  EXPECT_THROW(Pad(-1, 0, 0, 0), InvalidArgument);
}

TEST(ImageStage, VerticalFlipReversesRowsInBothPaths) {
  const Picture p = picture(20, 16);
  const ImagePipeline plain({CenterCrop(12, 10)}, kExact);
  const ImagePipeline flipped({CenterCrop(12, 10), RandomVerticalFlip(1.0)}, kExact);
  // Through the image stage too: an identity image transform first.
  const ImagePipeline staged({RandomGrayscale(0.0), CenterCrop(12, 10), RandomVerticalFlip(1.0)},
                             kExact);
  const auto a = run(plain, p.png, 0), b = run(flipped, p.png, 0), c = run(staged, p.png, 0);
  EXPECT_EQ(a, chw_crop(p, 2, 5, 12, 10));
  for (int ch = 0; ch < 3; ++ch)
    for (int y = 0; y < 12; ++y)
      EXPECT_EQ(0, std::memcmp(&b[(size_t(ch) * 12 + y) * 10], &a[(size_t(ch) * 12 + 11 - y) * 10],
                               10));
  EXPECT_EQ(b, c);
}

TEST(ImageStage, PadAndRandomCropFollowTorchvisionsRules) {
  const Picture p = picture(9, 7);
  // Constant padding then a crop of the padded image's full size: the padded image itself.
  const ImagePipeline pad({Pad(1, 2, 3, 4, {5, 6, 7}), CenterCrop(13, 13)}, kExact);
  const auto out = run(pad, p.png, 0);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(out[(size_t(c) * 13 + 0) * 13 + 0], 5 + c);  // top-left corner: fill
    EXPECT_EQ(out[(size_t(c) * 13 + 2) * 13 + 1], p.rgb[c]);  // the image's first pixel
  }
  // RandomCrop of the padded size: no offset to draw, the same pixels.
  const ImagePipeline crop({RandomCrop(13, 13, Pad(1, 2, 3, 4, {5, 6, 7}))}, kExact);
  EXPECT_EQ(run(crop, p.png, 3), out);
  // Offsets are uniform over every place the crop fits. (Outputs as strings: GCC 12 warns
  // falsely about a set of vectors.)
  const ImagePipeline small({RandomCrop(5, 5)}, kExact);
  const auto key = [](const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); };
  std::set<std::string> seen;
  for (uint64_t i = 0; i < 400; ++i) seen.insert(key(run(small, p.png, i)));
  EXPECT_EQ(seen.size(), size_t(3 * 5));  // (7 - 5 + 1) x (9 - 5 + 1) places
  for (int top = 0; top <= 2; ++top)
    for (int left = 0; left <= 4; ++left)
      EXPECT_TRUE(seen.count(key(chw_crop(p, top, left, 5, 5))));
  // Larger than the image: an error naming both sizes, unless pad_if_needed.
  const ImagePipeline big({RandomCrop(10, 10)}, kExact);
  try {
    run(big, p.png, 0);
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("10x10 is larger than the image 7x9"),
              std::string::npos)
        << e.what();
  }
  const ImagePipeline padded({RandomCrop(10, 10, Pad(0, 0, 0, 0), true)}, kExact);
  EXPECT_EQ(run(padded, p.png, 0).size(), size_t(3 * 10 * 10));
}

TEST(ImageStage, RandomApplyDrawsOnceAndSkipsItsTransforms) {
  const Picture p = picture(16, 16);
  const ImagePipeline plain({CenterCrop(8)}, kExact);
  const ImagePipeline never({CenterCrop(8), RandomApply(0.0, 1), RandomGrayscale(1.0)}, kExact);
  const ImagePipeline always({CenterCrop(8), RandomApply(1.0, 1), RandomGrayscale(1.0)}, kExact);
  const auto a = run(plain, p.png, 0);
  EXPECT_EQ(run(never, p.png, 0), a);
  const auto g = run(always, p.png, 0);
  EXPECT_NE(g, a);
  for (int i = 0; i < 64; ++i) {  // every channel the same: grayscale
    EXPECT_EQ(g[i], g[64 + i]);
    EXPECT_EQ(g[i], g[128 + i]);
  }
  // p = 0.5: both outcomes over samples.
  const ImagePipeline half({CenterCrop(8), RandomApply(0.5, 1), RandomGrayscale(1.0)}, kExact);
  int gray = 0;
  for (uint64_t i = 0; i < 200; ++i) gray += run(half, p.png, i) == g;
  EXPECT_GT(gray, 70);
  EXPECT_LT(gray, 130);
}

TEST(ImageStage, ErasingOnTheOutputTensor) {
  const Picture p = picture(40, 40);
  const ImagePipeline erase(
      {CenterCrop(32), ToTensor(DType::kUInt8), RandomErasing(1.0, {0.25, 0.25}, {1, 1},
                                                               {7, 8, 9})},
      kExact);
  std::set<std::pair<int, int>> corners;
  for (uint64_t i = 0; i < 20; ++i) {
    const auto out = run(erase, p.png, i);
    int erased = 0, top = 99, left = 99, bottom = -1, right = -1;
    for (int y = 0; y < 32; ++y)
      for (int x = 0; x < 32; ++x)
        if (out[y * 32 + x] == 7 && out[1024 + y * 32 + x] == 8 && out[2048 + y * 32 + x] == 9) {
          ++erased;
          top = std::min(top, y);
          left = std::min(left, x);
          bottom = std::max(bottom, y);
          right = std::max(right, x);
        }
    // round(sqrt(0.25 * 32 * 32)) = 16 on each side, anywhere it fits
    EXPECT_EQ(erased, 16 * 16);
    EXPECT_EQ(bottom - top + 1, 16);
    EXPECT_EQ(right - left + 1, 16);
    corners.insert({top, left});
  }
  EXPECT_GT(corners.size(), size_t(10));
  // After Normalize, in normalized units; before it, normalized with the rest.
  const ImagePipeline f32({CenterCrop(32), ToTensor(), Normalize({0.5f, 0.5f, 0.5f}, {2, 2, 2}),
                           RandomErasing(1.0, {0.25, 0.25}, {1, 1}, {3, 3, 3})},
                          kExact);
  const ImagePipeline before({CenterCrop(32), ToTensor(),
                              RandomErasing(1.0, {0.25, 0.25}, {1, 1}, {6.5f, 6.5f, 6.5f}),
                              Normalize({0.5f, 0.5f, 0.5f}, {2, 2, 2})},
                             kExact);
  for (const ImagePipeline* pl : {&f32, &before}) {
    const auto out = run(*pl, p.png, 1);
    int threes = 0;
    for (size_t i = 0; i < out.size() / 4; ++i) {
      float v;
      std::memcpy(&v, &out[i * 4], 4);
      threes += v == 3.0f;
    }
    EXPECT_EQ(threes, 3 * 16 * 16);
  }
}

TEST(ImageStage, UnscaledToDtypeKeepsTheValues) {
  const Picture p = picture(8, 8);
  const auto out =
      run(ImagePipeline({CenterCrop(8), ToTensor(DType::kFloat32, Layout::kCHW, false)}, kExact),
          p.png, 0);
  const auto u8 = chw_crop(p, 0, 0, 8, 8);
  for (size_t i = 0; i < u8.size(); ++i) {
    float v;
    std::memcpy(&v, &out[i * 4], 4);
    EXPECT_EQ(v, float(u8[i]));
  }
}

TEST(ImageStage, AntialiasFalseIsPlainBilinearWhenDownscaling) {
  const Picture p = picture(64, 64);
  const ImagePipeline aa({Resize(16, 16)}, kExact);
  const ImagePipeline plain({Resize(16, 16, false)}, kExact);
  const auto a = run(aa, p.png, 0), b = run(plain, p.png, 0);
  EXPECT_NE(a, b);
  // Plain bilinear at exactly 4x: each output pixel averages the two source pixels around its
  // centre (4x + 1.5, rounded as the fixed-point resample rounds), per axis.
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x)
      for (int c = 0; c < 1; ++c) {
        const auto at = [&](int yy, int xx) { return int(p.rgb[(size_t(yy) * 64 + xx) * 3 + c]); };
        const double want = (at(4 * y + 1, 4 * x + 1) + at(4 * y + 1, 4 * x + 2) +
                             at(4 * y + 2, 4 * x + 1) + at(4 * y + 2, 4 * x + 2)) /
                            4.0;
        EXPECT_NEAR(b[(size_t(c) * 16 + y) * 16 + x], want, 1.0) << x << "," << y;
      }
  // Upscaling: the same filter either way.
  EXPECT_EQ(run(ImagePipeline({Resize(100, 100)}, kExact), p.png, 0),
            run(ImagePipeline({Resize(100, 100, false)}, kExact), p.png, 0));
}

TEST(ImageStage, RunImageGivesAnyOutputSize) {
  PipelineOptions any = kExact;
  any.any_size = true;
  const ImagePipeline p({Pad(1, 1, 1, 1)}, any);
  EXPECT_EQ(p.height(), 0);
  for (int w : {5, 9}) {
    const Picture pic = picture(w, 6);
    ImageScratch scratch;
    SampleRng rng(0, 0, 0);
    const ImageView v = p.run_image(pic.png, rng, scratch);
    EXPECT_EQ(v.width, w + 2);
    EXPECT_EQ(v.height, 8);
    EXPECT_EQ(0, std::memcmp(v.data + v.stride + 3, pic.rgb.data(), size_t(w) * 3));
  }
  EXPECT_THROW(ImagePipeline({Pad(1, 1, 1, 1), ToTensor()}, any), InvalidArgument);
}

TEST(ImageStage, SameOutputOnEveryThread) {
  const Picture p = picture(96, 80, 3);
  const ImagePipeline pl({RandomResizedCrop(48, 48), RandomHorizontalFlip(),
                          RandomCrop(40, 40, Pad(2, 2, 2, 2), false), RandomVerticalFlip(),
                          ToTensor(DType::kUInt8)},
                         kExact);
  std::vector<std::vector<uint8_t>> want;
  for (uint64_t i = 0; i < 16; ++i) want.push_back(run(pl, p.png, i));
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (uint64_t i = 0; i < 16; ++i) mismatches += run(pl, p.png, i) != want[i];
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace stoker::image
