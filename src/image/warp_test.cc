// Geometric operations of ops.h (warp.cc) against exact expectations: identities, index
// permutations, shifted copies and hand-written padded rows. tests/python/
// test_vision_warp_ops.py holds them against torchvision itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "stoker/image/ops.h"
#include "stoker/errors.h"

namespace stoker::image::internal {
namespace warp_testing {
void use_portable_fma(bool on);  // warp.cc: the copy of the warp for CPUs without fma
}  // namespace warp_testing
namespace {

// An image with a row stride of its own choosing; the bytes past each row hold a sentinel that
// no operation may touch.
struct Image {
  static constexpr uint8_t kSentinel = 0xA5;
  int height, width;
  size_t stride;
  std::vector<uint8_t> bytes;

  Image(int h, int w, size_t extra = 0)
      : height(h), width(w), stride(3 * size_t(w) + extra), bytes(stride * h, kSentinel) {}
  RgbView view() { return {bytes.data(), height, width, stride}; }
  uint8_t* at(int x, int y) { return bytes.data() + y * stride + 3 * size_t(x); }
  const uint8_t* at(int x, int y) const { return bytes.data() + y * stride + 3 * size_t(x); }
  std::array<uint8_t, 3> pixel(int x, int y) const {
    const uint8_t* p = at(x, y);
    return {p[0], p[1], p[2]};
  }
  bool sentinels_intact() const {
    for (int y = 0; y < height; ++y) {
      for (size_t i = 3 * size_t(width); i < stride; ++i) {
        if (bytes[y * stride + i] != kSentinel) return false;
      }
    }
    return true;
  }
};

Image random_image(int h, int w, uint32_t seed, size_t extra = 0) {
  Image img(h, w, extra);
  std::mt19937 rng(seed);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < 3 * w; ++x) img.at(0, y)[x] = uint8_t(rng());
  }
  return img;
}

// The first pixel where a and b differ, or "" when they are equal.
std::string first_difference(const Image& a, const Image& b) {
  if (a.height != b.height || a.width != b.width) return "sizes differ";
  for (int y = 0; y < a.height; ++y) {
    for (int x = 0; x < a.width; ++x) {
      if (a.pixel(x, y) != b.pixel(x, y)) {
        return "pixel (" + std::to_string(x) + ", " + std::to_string(y) + ")";
      }
    }
  }
  return "";
}

constexpr Interpolation kBoth[] = {Interpolation::kNearest, Interpolation::kBilinear};
const Fill kFills[] = {std::nullopt, std::array<float, 3>{0, 0, 0},
                       std::array<float, 3>{12, 130.5f, 255}};

struct Size {
  int height, width;
};
constexpr Size kSizes[] = {{1, 1}, {1, 7}, {6, 1}, {2, 2}, {7, 7}, {8, 8}, {9, 14}, {33, 20}};

TEST(WarpAffine, IdentityGivesTheInput) {
  for (Size s : kSizes) {
    const Image src = random_image(s.height, s.width, 7 * s.height + s.width);
    for (Interpolation interpolation : kBoth) {
      for (const Fill& fill : kFills) {
        Image dst(s.height, s.width);
        Image in = src;
        affine(in.view(), dst.view(), 0.0, {0, 0}, 1.0, {0, 0}, interpolation, fill);
        EXPECT_EQ(first_difference(dst, src), "")
            << s.height << "x" << s.width << " bilinear "
            << (interpolation == Interpolation::kBilinear) << " fill " << fill.has_value();
        rotate(in.view(), dst.view(), 0.0, interpolation, fill,
               std::array<double, 2>{s.width * 0.5, s.height * 0.5});  // not the fast path
        EXPECT_EQ(first_difference(dst, src), "") << s.height << "x" << s.width;
      }
    }
  }
}

// torchvision rotates about the centre of the pixel grid: a quarter turn of a square image is
// an exact permutation of its pixels, with or without the fast path (an explicit centre skips it).
TEST(WarpRotate, QuarterTurnsOfASquareArePermutations) {
  for (int n : {1, 2, 5, 8, 31}) {
    Image src = random_image(n, n, 100 + n);
    // Counter-clockwise by 90 degrees: out(x, y) = in(n - 1 - y, x).
    auto expected = [&](double angle) {
      Image e(n, n);
      for (int y = 0; y < n; ++y) {
        for (int x = 0; x < n; ++x) {
          int sx = x, sy = y;
          if (angle == 90) sx = n - 1 - y, sy = x;
          if (angle == 180) sx = n - 1 - x, sy = n - 1 - y;
          if (angle == 270) sx = y, sy = n - 1 - x;
          std::memcpy(e.at(x, y), src.at(sx, sy), 3);
        }
      }
      return e;
    };
    for (double angle : {90.0, 180.0, 270.0, -90.0, 450.0}) {
      const double turn = angle < 0 ? angle + 360 : angle > 360 ? angle - 360 : angle;
      const Image want = expected(turn);
      for (Interpolation interpolation : kBoth) {
        for (const Fill& fill : kFills) {
          Image dst(n, n);
          rotate(src.view(), dst.view(), angle, interpolation, fill);
          EXPECT_EQ(first_difference(dst, want), "") << "fast path, n " << n << " angle " << angle;
          rotate(src.view(), dst.view(), angle, interpolation, fill,
                 std::array<double, 2>{n * 0.5, n * 0.5});
          EXPECT_EQ(first_difference(dst, want), "") << "warped, n " << n << " angle " << angle;
          // affine's angle turns the other way.
          affine(src.view(), dst.view(), -angle, {0, 0}, 1.0, {0, 0}, interpolation, fill);
          EXPECT_EQ(first_difference(dst, want), "") << "affine, n " << n << " angle " << angle;
        }
      }
    }
  }
}

TEST(WarpRotate, HalfTurnOfAnyImageIsAPermutation) {
  for (Size s : kSizes) {
    Image src = random_image(s.height, s.width, 3 * s.width + s.height);
    Image want(s.height, s.width);
    for (int y = 0; y < s.height; ++y) {
      for (int x = 0; x < s.width; ++x) {
        std::memcpy(want.at(x, y), src.at(s.width - 1 - x, s.height - 1 - y), 3);
      }
    }
    for (Interpolation interpolation : kBoth) {
      Image dst(s.height, s.width);
      rotate(src.view(), dst.view(), 180.0, interpolation, std::nullopt);
      EXPECT_EQ(first_difference(dst, want), "") << s.height << "x" << s.width;
      affine(src.view(), dst.view(), 180.0, {0, 0}, 1.0, {0, 0}, interpolation, std::nullopt);
      EXPECT_EQ(first_difference(dst, want), "") << s.height << "x" << s.width;
    }
  }
}

// An integer translation is a shifted copy; what comes in from outside is the fill rounded half
// to even (130.5 -> 130, 77.5 -> 78), or 0 without one.
TEST(WarpAffine, IntegerTranslationIsAShiftedCopyWithFill) {
  const Fill fills[] = {std::nullopt, std::array<float, 3>{10.4f, 130.5f, 77.5f}};
  const std::array<uint8_t, 3> outside[] = {{0, 0, 0}, {10, 130, 78}};
  for (Size s : {Size{9, 14}, Size{8, 8}, Size{1, 5}}) {
    Image src = random_image(s.height, s.width, 11);
    for (std::array<double, 2> t : {std::array<double, 2>{3, 2}, {-5, 1}, {0, -4}, {20, 0}}) {
      for (Interpolation interpolation : kBoth) {
        for (int f = 0; f < 2; ++f) {
          Image dst(s.height, s.width);
          affine(src.view(), dst.view(), 0.0, t, 1.0, {0, 0}, interpolation, fills[f]);
          for (int y = 0; y < s.height; ++y) {
            for (int x = 0; x < s.width; ++x) {
              const int sx = x - int(t[0]), sy = y - int(t[1]);
              const bool in = sx >= 0 && sx < s.width && sy >= 0 && sy < s.height;
              ASSERT_EQ(dst.pixel(x, y), in ? src.pixel(sx, sy) : outside[f])
                  << "at (" << x << ", " << y << ") translate " << t[0] << "," << t[1]
                  << " bilinear " << (interpolation == Interpolation::kBilinear) << " fill " << f;
            }
          }
        }
      }
    }
  }
}

// torchvision's fill goes through a mask channel that is sampled like the image: with bilinear,
// a pixel half outside keeps half the image's weight, and the fill blends in by the mask again.
// fill=None (zero padding, no mask) and fill=0 therefore differ at the border.
TEST(WarpAffine, BilinearFillBlendsThroughTheMask) {
  Image src(4, 6);
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 6; ++x) src.at(x, y)[0] = src.at(x, y)[1] = src.at(x, y)[2] = 200;
  }
  Image none(4, 6), zero(4, 6), grey(4, 6);
  const std::array<double, 2> half = {0.5, 0};
  affine(src.view(), none.view(), 0, half, 1, {0, 0}, Interpolation::kBilinear, std::nullopt);
  affine(src.view(), zero.view(), 0, half, 1, {0, 0}, Interpolation::kBilinear,
         std::array<float, 3>{0, 0, 0});
  affine(src.view(), grey.view(), 0, half, 1, {0, 0}, Interpolation::kBilinear,
         std::array<float, 3>{100, 100, 100});
  for (int y = 0; y < 4; ++y) {
    // Column 0 samples x = -0.5: half of it lies outside.
    EXPECT_EQ(none.pixel(0, y), (std::array<uint8_t, 3>{100, 100, 100}));  // 200 * 0.5
    EXPECT_EQ(zero.pixel(0, y), (std::array<uint8_t, 3>{50, 50, 50}));     // (100 - 0) * .5 + 0
    EXPECT_EQ(grey.pixel(0, y), (std::array<uint8_t, 3>{100, 100, 100}));  // (100 - 100) * .5 + 100
    for (int x = 1; x < 6; ++x) {
      EXPECT_EQ(none.pixel(x, y), (std::array<uint8_t, 3>{200, 200, 200}));
      EXPECT_EQ(zero.pixel(x, y), (std::array<uint8_t, 3>{200, 200, 200}));
    }
  }
}

// The shears of the auto-augment policies turn about center=[0, 0], the top-left corner of the
// image (the corner of pixel (0, 0), not its centre): row y moves by (y + 0.5) * tan(shear), here
// 2 * y + 1 pixels.
TEST(WarpAffine, ShearAboutTheCornerMovesRowsByTheirIndex) {
  Image src = random_image(6, 15, 5);
  Image dst(6, 15);
  const double shear = -std::atan(2.0) * 180 / std::numbers::pi;
  for (Interpolation interpolation : kBoth) {
    affine(src.view(), dst.view(), 0, {0, 0}, 1, {shear, 0}, interpolation, std::nullopt,
           std::array<double, 2>{0, 0});
    for (int y = 0; y < 6; ++y) {
      for (int x = 0; x < 15; ++x) {
        const int sx = x - 2 * y - 1;
        const std::array<uint8_t, 3> want = sx >= 0 ? src.pixel(sx, y) : std::array<uint8_t, 3>{};
        ASSERT_EQ(dst.pixel(x, y), want) << "at (" << x << ", " << y << ")";
      }
    }
  }
}

TEST(WarpAffine, RowStridesLargerThanTheRowAreRespected) {
  for (Size s : {Size{9, 14}, Size{1, 1}, Size{5, 300}}) {
    const Image packed = random_image(s.height, s.width, 21);
    Image strided(s.height, s.width, /*extra=*/37);
    for (int y = 0; y < s.height; ++y) std::memcpy(strided.at(0, y), packed.at(0, y), 3 * s.width);
    for (Interpolation interpolation : kBoth) {
      for (const Fill& fill : kFills) {
        Image want(s.height, s.width), got(s.height, s.width, /*extra=*/5);
        Image in = packed;
        affine(in.view(), want.view(), 23.0, {1.5, -2}, 1.1, {7, -3}, interpolation, fill);
        affine(strided.view(), got.view(), 23.0, {1.5, -2}, 1.1, {7, -3}, interpolation, fill);
        EXPECT_EQ(first_difference(got, want), "");
        EXPECT_TRUE(got.sentinels_intact());
        rotate(in.view(), want.view(), 33.0, interpolation, fill);
        rotate(strided.view(), got.view(), 33.0, interpolation, fill);
        EXPECT_EQ(first_difference(got, want), "");
        EXPECT_TRUE(got.sentinels_intact());
      }
    }
  }
}

// A 1-pixel image turns and scales into itself; translated away, it is the fill.
TEST(WarpAffine, OnePixelImage) {
  Image src(1, 1);
  src.at(0, 0)[0] = 9, src.at(0, 0)[1] = 99, src.at(0, 0)[2] = 199;
  for (Interpolation interpolation : kBoth) {
    for (const Fill& fill : kFills) {
      Image dst(1, 1);
      affine(src.view(), dst.view(), 37, {0, 0}, 1.7, {10, 20}, interpolation, fill);
      EXPECT_EQ(dst.pixel(0, 0), src.pixel(0, 0));
      rotate(src.view(), dst.view(), 123, interpolation, fill);
      EXPECT_EQ(dst.pixel(0, 0), src.pixel(0, 0));
      affine(src.view(), dst.view(), 0, {1, 0}, 1, {0, 0}, interpolation, fill);
      const std::array<uint8_t, 3> outside =
          fill ? std::array<uint8_t, 3>{uint8_t((*fill)[0]), uint8_t(std::nearbyint((*fill)[1])),
                                        uint8_t((*fill)[2])}
               : std::array<uint8_t, 3>{0, 0, 0};
      EXPECT_EQ(dst.pixel(0, 0), outside);
    }
  }
}

// The warp has two copies, one with the fma instruction (chosen where the CPU has it) and one
// that computes the fused multiply-adds in double; they must agree.
TEST(WarpAffine, PortableAndFmaCopiesAgree) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int trial = 0; trial < 200; ++trial) {
    const int h = 1 + int(rng() % 70), w = 1 + int(rng() % 70);
    Image src = random_image(h, w, trial);
    Image fast(h, w), portable(h, w);
    const double angle = 180 * u(rng), scale = 1 + 0.5 * u(rng);
    const std::array<double, 2> t = {20 * u(rng), 20 * u(rng)}, shear = {40 * u(rng), 20 * u(rng)};
    const Interpolation interpolation = kBoth[trial % 2];
    const Fill& fill = kFills[trial % 3];
    const auto center =
        trial % 4 == 0 ? std::optional<std::array<double, 2>>({0, 0}) : std::nullopt;
    affine(src.view(), fast.view(), angle, t, scale, shear, interpolation, fill, center);
    warp_testing::use_portable_fma(true);
    affine(src.view(), portable.view(), angle, t, scale, shear, interpolation, fill, center);
    warp_testing::use_portable_fma(false);
    EXPECT_EQ(first_difference(portable, fast), "") << "trial " << trial;
  }
}

TEST(WarpAffine, RejectsAWrongDestinationOrScale) {
  Image src(4, 5), small(4, 4);
  Image dst(4, 5);
  EXPECT_THROW(affine(src.view(), small.view(), 0, {0, 0}, 1, {0, 0}, Interpolation::kNearest,
                      std::nullopt),
               InvalidArgument);
  EXPECT_THROW(rotate(src.view(), small.view(), 10, Interpolation::kNearest, std::nullopt),
               InvalidArgument);
  EXPECT_THROW(affine(src.view(), dst.view(), 0, {0, 0}, 0.0, {0, 0}, Interpolation::kNearest,
                      std::nullopt),
               InvalidArgument);
}

// --- pad -------------------------------------------------------------------------------------

// One row of a 1 x 4 image padded left by 3 and right by 2 (or 3 for symmetric): the rows
// torchvision gives (torch.nn.functional.pad for reflect and edge, _pad_symmetric).
TEST(WarpPad, ModesAlongARow) {
  Image src(1, 4);
  for (int x = 0; x < 4; ++x) {
    src.at(x, 0)[0] = uint8_t(10 + x), src.at(x, 0)[1] = 0, src.at(x, 0)[2] = uint8_t(x);
  }
  struct Case {
    PadMode mode;
    int left, right;
    std::vector<int> want;  // channel 0
  };
  const Case cases[] = {
      {PadMode::kConstant, 3, 2, {7, 7, 7, 10, 11, 12, 13, 7, 7}},
      {PadMode::kEdge, 3, 2, {10, 10, 10, 10, 11, 12, 13, 13, 13}},
      {PadMode::kEdge, 6, 0, {10, 10, 10, 10, 10, 10, 10, 11, 12, 13}},
      {PadMode::kReflect, 3, 2, {13, 12, 11, 10, 11, 12, 13, 12, 11}},
      {PadMode::kSymmetric, 3, 4, {12, 11, 10, 10, 11, 12, 13, 13, 12, 11, 10}},
      {PadMode::kSymmetric, 4, 0, {13, 12, 11, 10, 10, 11, 12, 13}},
  };
  for (const Case& c : cases) {
    Image dst(1, c.left + 4 + c.right, /*extra=*/4);
    pad(src.view(), dst.view(), c.left, 0, c.right, 0, c.mode, {7, 8, 9});
    std::vector<int> got;
    for (int x = 0; x < dst.width; ++x) got.push_back(dst.pixel(x, 0)[0]);
    EXPECT_EQ(got, c.want) << "mode " << int(c.mode);
    // The other channels come from the same pixels (or the fill's own channel).
    for (int x = 0; x < dst.width; ++x) {
      const bool filled = c.mode == PadMode::kConstant && (x < c.left || x >= c.left + 4);
      EXPECT_EQ(dst.pixel(x, 0)[1], filled ? 8 : 0);
      EXPECT_EQ(dst.pixel(x, 0)[2], filled ? 9 : dst.pixel(x, 0)[0] - 10);
    }
    EXPECT_TRUE(dst.sentinels_intact());
  }
}

// A 3 x 2 image padded on all sides: rows and columns follow the same rules.
TEST(WarpPad, ModesInTwoDimensions) {
  // Pixel (x, y) holds 10 * y + x in every channel.
  Image src(3, 2, /*extra=*/7);
  for (int y = 0; y < 3; ++y) {
    for (int x = 0; x < 2; ++x) std::memset(src.at(x, y), 10 * y + x, 3);
  }
  struct Case {
    PadMode mode;
    int left, top, right, bottom;
    std::vector<std::vector<int>> want;
  };
  const Case cases[] = {
      {PadMode::kConstant,
       1, 1, 0, 2,
       {{5, 5, 5}, {5, 0, 1}, {5, 10, 11}, {5, 20, 21}, {5, 5, 5}, {5, 5, 5}}},
      {PadMode::kEdge,
       0, 2, 1, 1,
       {{0, 1, 1}, {0, 1, 1}, {0, 1, 1}, {10, 11, 11}, {20, 21, 21}, {20, 21, 21}}},
      {PadMode::kReflect,
       1, 2, 1, 1,
       {{21, 20, 21, 20},
        {11, 10, 11, 10},
        {1, 0, 1, 0},
        {11, 10, 11, 10},
        {21, 20, 21, 20},
        {11, 10, 11, 10}}},
      {PadMode::kSymmetric,
       2, 3, 1, 1,
       {{21, 20, 20, 21, 21},
        {11, 10, 10, 11, 11},
        {1, 0, 0, 1, 1},
        {1, 0, 0, 1, 1},
        {11, 10, 10, 11, 11},
        {21, 20, 20, 21, 21},
        {21, 20, 20, 21, 21}}},
  };
  for (const Case& c : cases) {
    Image dst(c.top + 3 + c.bottom, c.left + 2 + c.right, /*extra=*/3);
    pad(src.view(), dst.view(), c.left, c.top, c.right, c.bottom, c.mode, {5, 5, 5});
    std::vector<std::vector<int>> got(dst.height);
    for (int y = 0; y < dst.height; ++y) {
      for (int x = 0; x < dst.width; ++x) {
        got[y].push_back(dst.pixel(x, y)[0]);
        EXPECT_EQ(dst.pixel(x, y)[1], dst.pixel(x, y)[0]);
        EXPECT_EQ(dst.pixel(x, y)[2], dst.pixel(x, y)[0]);
      }
    }
    EXPECT_EQ(got, c.want) << "mode " << int(c.mode);
    EXPECT_TRUE(dst.sentinels_intact());
  }
}

TEST(WarpPad, OnePixelImage) {
  Image src(1, 1);
  std::memset(src.at(0, 0), 42, 3);
  for (PadMode mode : {PadMode::kEdge, PadMode::kSymmetric, PadMode::kConstant}) {
    Image dst(3, 3);
    pad(src.view(), dst.view(), 1, 1, 1, 1, mode, {1, 2, 3});
    for (int y = 0; y < 3; ++y) {
      for (int x = 0; x < 3; ++x) {
        const bool centre = x == 1 && y == 1;
        const std::array<uint8_t, 3> want =
            centre || mode != PadMode::kConstant ? std::array<uint8_t, 3>{42, 42, 42}
                                                 : std::array<uint8_t, 3>{1, 2, 3};
        EXPECT_EQ(dst.pixel(x, y), want);
      }
    }
  }
  Image same(1, 1);
  pad(src.view(), same.view(), 0, 0, 0, 0, PadMode::kReflect, {0, 0, 0});
  EXPECT_EQ(same.pixel(0, 0), src.pixel(0, 0));
}

TEST(WarpPad, RejectsPaddingsTorchRejects) {
  Image src(3, 4);
  auto try_pad = [&](int l, int t, int r, int b, PadMode mode) {
    Image dst(std::max(1, 3 + t + b), std::max(1, 4 + l + r));
    pad(src.view(), dst.view(), l, t, r, b, mode, {0, 0, 0});
  };
  EXPECT_NO_THROW(try_pad(3, 2, 3, 2, PadMode::kReflect));
  EXPECT_THROW(try_pad(4, 0, 0, 0, PadMode::kReflect), InvalidArgument);
  EXPECT_THROW(try_pad(0, 0, 0, 3, PadMode::kReflect), InvalidArgument);
  EXPECT_NO_THROW(try_pad(4, 3, 4, 3, PadMode::kSymmetric));
  EXPECT_THROW(try_pad(0, 0, 5, 0, PadMode::kSymmetric), InvalidArgument);
  EXPECT_THROW(try_pad(0, 4, 0, 0, PadMode::kSymmetric), InvalidArgument);
  EXPECT_NO_THROW(try_pad(9, 9, 9, 9, PadMode::kEdge));
  EXPECT_THROW(try_pad(-1, 0, 0, 0, PadMode::kConstant), InvalidArgument);
  Image wrong(3, 5);
  EXPECT_THROW(pad(src.view(), wrong.view(), 1, 0, 1, 0, PadMode::kConstant, {0, 0, 0}),
               InvalidArgument);
}

}  // namespace
}  // namespace stoker::image::internal
