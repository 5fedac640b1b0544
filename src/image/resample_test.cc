#include "resample.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "stoker/errors.h"
#include "stoker/image/resize.h"

namespace stoker::image {
namespace {

// A plain transcription of Pillow's bilinear and bicubic 8-bit resample, written independently
// of resample.cc: whole-image passes, one channel at a time.
struct RefCoeffs {
  std::vector<int> xmin, n;
  std::vector<std::vector<int>> k;
};

// Pillow's bicubic_filter, a = -0.5.
double ref_cubic(double x) {
  x = std::fabs(x);
  if (x < 1) return 1.5 * x * x * x - 2.5 * x * x + 1;
  if (x < 2) return -0.5 * x * x * x + 2.5 * x * x - 4 * x + 2;
  return 0;
}

RefCoeffs ref_coeffs(int in_size, float in0, float in1, int out_size, bool cubic = false) {
  RefCoeffs c;
  const double scale = double(in1 - in0) / out_size;
  const double fs = scale < 1.0 ? 1.0 : scale;
  const double support = (cubic ? 2 : 1) * fs;
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    int lo = int(center - support + 0.5);
    if (lo < 0) lo = 0;
    int hi = int(center + support + 0.5);
    if (hi > in_size) hi = in_size;
    std::vector<double> w;
    double sum = 0;
    for (int x = lo; x < hi; ++x) {
      double t = std::fabs((x - center + 0.5) / fs);
      w.push_back(cubic ? ref_cubic(t) : t < 1 ? 1 - t : 0);
      sum += w.back();
    }
    std::vector<int> k;
    for (double v : w) {
      v = sum != 0 ? v / sum : v;
      k.push_back(int(v < 0 ? -0.5 + v * (1 << 22) : 0.5 + v * (1 << 22)));
    }
    c.xmin.push_back(lo);
    c.n.push_back(hi - lo);
    c.k.push_back(k);
  }
  return c;
}

uint8_t ref_clip(int s) {
  s >>= 22;
  return s < 0 ? 0 : s > 255 ? 255 : uint8_t(s);
}

std::vector<uint8_t> reference_resize(const std::vector<uint8_t>& src, int w, int h, ResizeBox b,
                                      int ow, int oh, bool cubic = false) {
  const RefCoeffs ch = ref_coeffs(w, b.x0, b.x1, ow, cubic),
                  cv = ref_coeffs(h, b.y0, b.y1, oh, cubic);
  // Pillow 13 runs the vertical pass first when both run and the height loses more than twice
  // the pixels the width loses; Stoker follows it for bicubic.
  const bool need_h = ow != w || b.x0 != 0 || b.x1 != ow,
             need_v = oh != h || b.y0 != 0 || b.y1 != oh;
  if (cubic && need_h && need_v && h - oh > 0 && h - oh > 2 * (w - ow)) {
    std::vector<uint8_t> tmp(size_t(w) * oh * 3), out(size_t(ow) * oh * 3);
    for (int y = 0; y < oh; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) {
          int s = 1 << 21;
          for (int j = 0; j < cv.n[y]; ++j)
            s += src[((cv.xmin[y] + j) * w + x) * 3 + c] * cv.k[y][j];
          tmp[(y * w + x) * 3 + c] = ref_clip(s);
        }
    for (int y = 0; y < oh; ++y)
      for (int x = 0; x < ow; ++x)
        for (int c = 0; c < 3; ++c) {
          int s = 1 << 21;
          for (int j = 0; j < ch.n[x]; ++j) s += tmp[(y * w + ch.xmin[x] + j) * 3 + c] * ch.k[x][j];
          out[(y * ow + x) * 3 + c] = ref_clip(s);
        }
    return out;
  }
  std::vector<uint8_t> tmp(size_t(ow) * h * 3), out(size_t(ow) * oh * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < ow; ++x)
      for (int c = 0; c < 3; ++c) {
        int s = 1 << 21;
        for (int j = 0; j < ch.n[x]; ++j) s += src[(y * w + ch.xmin[x] + j) * 3 + c] * ch.k[x][j];
        tmp[(y * ow + x) * 3 + c] = ref_clip(s);
      }
  for (int y = 0; y < oh; ++y)
    for (int x = 0; x < ow; ++x)
      for (int c = 0; c < 3; ++c) {
        int s = 1 << 21;
        for (int j = 0; j < cv.n[y]; ++j)
          s += tmp[((cv.xmin[y] + j) * ow + x) * 3 + c] * cv.k[y][j];
        out[(y * ow + x) * 3 + c] = ref_clip(s);
      }
  return out;
}

std::vector<uint8_t> noise(int w, int h, std::mt19937& gen) {
  std::vector<uint8_t> v(size_t(w) * h * 3);
  for (auto& x : v) x = uint8_t(gen());
  return v;
}

TEST(ResizeBilinear, MatchesReferenceOnRandomSizesAndBoxes) {
  std::mt19937 gen(1);
  for (int trial = 0; trial < 200; ++trial) {
    const int w = 1 + gen() % 90, h = 1 + gen() % 90;
    const int ow = 1 + gen() % 70, oh = 1 + gen() % 70;
    const auto src = noise(w, h, gen);
    ResizeBox box{0, 0, float(w), float(h)};
    if (trial % 2) {  // a random float box inside the image
      std::uniform_real_distribution<float> fx(0, w), fy(0, h);
      float a = fx(gen), b = fx(gen), c = fy(gen), d = fy(gen);
      if (a == b || c == d) continue;
      box = {std::min(a, b), std::min(c, d), std::max(a, b), std::max(c, d)};
    }
    std::vector<uint8_t> got(size_t(ow) * oh * 3);
    resize_bilinear(src, w, h, box, ow, oh, got);
    ASSERT_EQ(got, reference_resize(src, w, h, box, ow, oh))
        << w << "x" << h << " -> " << ow << "x" << oh << " box " << box.x0 << "," << box.y0 << ","
        << box.x1 << "," << box.y1;
  }
}

// Bicubic: the transcription on random sizes and boxes (up and down), and Pillow 13's own output
// (Image.resize(..., Image.BICUBIC, box=...)) on a fixed 9x6 image.
TEST(ResizeBicubic, MatchesReferenceOnRandomSizesAndBoxes) {
  std::mt19937 gen(2);
  for (int trial = 0; trial < 200; ++trial) {
    const int w = 1 + gen() % 90, h = 1 + gen() % 90;
    const int ow = 1 + gen() % 70, oh = 1 + gen() % 70;
    const auto src = noise(w, h, gen);
    ResizeBox box{0, 0, float(w), float(h)};
    if (trial % 2) {
      std::uniform_real_distribution<float> fx(0, w), fy(0, h);
      float a = fx(gen), b = fx(gen), c = fy(gen), d = fy(gen);
      if (a == b || c == d) continue;
      box = {std::min(a, b), std::min(c, d), std::max(a, b), std::max(c, d)};
    }
    std::vector<uint8_t> got(size_t(ow) * oh * 3);
    resize_rgb(src, w, h, box, ow, oh, got, ResizeFilter::kBicubic);
    ASSERT_EQ(got, reference_resize(src, w, h, box, ow, oh, true))
        << w << "x" << h << " -> " << ow << "x" << oh << " box " << box.x0 << "," << box.y0 << ","
        << box.x1 << "," << box.y1;
  }
}

TEST(ResizeBicubic, MatchesPillowFixtures) {
  const int w = 9, h = 6;
  std::vector<uint8_t> src(w * h * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c)
        src[(y * w + x) * 3 + c] = uint8_t((x * 37 + y * 91 + c * 53 + (x * y * 7) % 29) % 256);
  struct Case {
    int ow, oh;
    ResizeBox box;
    std::vector<uint8_t> want;
  };
  const std::vector<Case> cases = {
      {4, 3, {0, 0, 9, 6}, {89,  130, 149, 122, 128, 147, 109, 132, 131, 105, 124, 113,
                            123, 126, 124, 115, 130, 152, 149, 128, 123, 150, 145, 111,
                            159, 142, 99,  130, 90,  137, 119, 144, 160, 125, 124, 114}},
      {5,
       7,
       {1.5f, 0.25f, 8.0f, 5.5f},
       {70,  124, 162, 117, 153, 211, 146, 211, 182, 201, 118, 52,  57,  48,  114, 159, 221, 114,
        199, 63,  69,  22,  72,  121, 59,  99,  148, 101, 148, 199, 133, 107, 105, 92,  77,  113,
        60,  116, 199, 101, 182, 138, 178, 227, 89,  94,  73,  155, 57,  149, 193, 151, 175, 168,
        199, 144, 100, 159, 179, 50,  104, 148, 193, 147, 187, 211, 189, 169, 47,  236, 20,  94,
        73,  76,  140, 196, 98,  45,  223, 38,  100, 44,  91,  126, 92,  119, 183, 121, 179, 221,
        144, 63,  85,  114, 86,  145, 84,  140, 210, 122, 193, 145, 176, 105, 107}},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> got(size_t(c.ow) * c.oh * 3);
    resize_rgb(src, w, h, c.box, c.ow, c.oh, got, ResizeFilter::kBicubic);
    EXPECT_EQ(got, c.want) << c.ow << "x" << c.oh;
  }
  // 9x6 -> 8x3: the height loses 3 pixels, more than twice the width's 1, so Pillow 13 runs the
  // vertical pass first (bicubic, then bilinear: Stoker's bilinear keeps the horizontal pass
  // first, Pillow 12's order, so it differs by one here).
  const std::vector<uint8_t> cubic_v_first = {
      66,  115, 143, 104, 137, 166, 131, 146, 110, 122, 101, 174, 86,  159, 144, 138, 114, 101,
      90,  118, 146, 111, 139, 84,  107, 148, 108, 144, 109, 135, 101, 117, 157, 121, 147, 147,
      130, 125, 135, 177, 116, 110, 126, 170, 111, 165, 124, 115, 144, 187, 126, 177, 117, 74,
      132, 60,  124, 127, 117, 154, 91,  134, 179, 137, 162, 135, 157, 106, 143, 85,  133, 86};
  const std::vector<uint8_t> linear_v_first = {
      71,  119, 140, 108, 134, 159, 125, 140, 122, 120, 113, 166, 97,  150, 142, 135, 117, 108,
      96,  122, 139, 114, 136, 90,  108, 147, 113, 140, 113, 134, 108, 118, 150, 121, 139, 149,
      128, 129, 138, 166, 123, 114, 130, 159, 116, 156, 128, 112, 142, 179, 122, 171, 114, 85,
      130, 73,  126, 124, 117, 154, 101, 134, 171, 138, 154, 136, 152, 114, 140, 95,  132, 91};
  std::vector<uint8_t> got(8 * 3 * 3);
  resize_rgb(src, w, h, {0, 0, 9, 6}, 8, 3, got, ResizeFilter::kBicubic);
  EXPECT_EQ(got, cubic_v_first);
  resize_rgb(src, w, h, {0, 0, 9, 6}, 8, 3, got, ResizeFilter::kBilinear);
  EXPECT_NE(got, linear_v_first);
  EXPECT_EQ(got, reference_resize(src, w, h, {0, 0, 9, 6}, 8, 3));
  // An upscale: 13x10's first row (its ringing clips at 0 and 255).
  std::vector<uint8_t> up(13 * 10 * 3);
  resize_rgb(src, w, h, {0, 0, 9, 6}, 13, 10, up, ResizeFilter::kBicubic);
  const std::vector<uint8_t> row0 = {0,   44,  97,  10,  63,  115, 39,  91,  148, 63,
                                     115, 187, 87,  154, 215, 118, 187, 248, 158, 211,
                                     255, 186, 255, 89,  224, 166, 22,  224, 4,   67,
                                     36,  33,  90,  0,   67,  130, 33,  86,  159};
  EXPECT_EQ(std::vector<uint8_t>(up.begin(), up.begin() + 39), row0);
}

TEST(ResizeBicubic, IdentityIsACopy) {
  std::mt19937 gen(5);
  const auto src = noise(17, 9, gen);
  std::vector<uint8_t> out(src.size());
  resize_rgb(src, 17, 9, {0, 0, 17, 9}, 17, 9, out, ResizeFilter::kBicubic);
  EXPECT_EQ(out, src);
}

TEST(ResizeBilinear, KnownValues) {
  // 4 -> 2 pixels: triangle of support 2 around centres 1.0 and 3.0.
  const std::vector<uint8_t> src = {0, 0, 0, 100, 100, 100, 200, 200, 200, 40, 40, 40};
  std::vector<uint8_t> out(6);
  resize_bilinear(src, 4, 1, {0, 0, 4, 1}, 2, 1, out);
  // Weights (1/8, 3/8, 3/8, 1/8) around each centre, renormalised where the image ends.
  EXPECT_EQ(out[0], 71);   // (0*3 + 100*3 + 200*1) / 7 = 71.4
  EXPECT_EQ(out[3], 117);  // (100*1 + 200*3 + 40*3) / 7 = 117.1
  const auto ref = reference_resize(src, 4, 1, {0, 0, 4, 1}, 2, 1);
  EXPECT_EQ(out, ref);
}

TEST(ResizeBilinear, IdentityIsACopy) {
  std::mt19937 gen(3);
  const auto src = noise(17, 9, gen);
  std::vector<uint8_t> out(src.size());
  resize_bilinear(src, 17, 9, {0, 0, 17, 9}, 17, 9, out);
  EXPECT_EQ(out, src);
}

TEST(ResizeBilinear, ACropAtItsOwnSizeIsTheSourcesPixels) {
  std::mt19937 gen(4);
  const auto src = noise(17, 9, gen);
  std::vector<uint8_t> out(10 * 6 * 3);
  resize_bilinear(src, 17, 9, {3, 2, 13, 8}, 10, 6, out);
  for (int y = 0; y < 6; ++y)
    for (int x = 0; x < 30; ++x)
      ASSERT_EQ(out[y * 30 + x], src[(y + 2) * 17 * 3 + 9 + x]) << y << " " << x;
}

TEST(ResizeBilinear, RejectsBadArguments) {
  std::vector<uint8_t> src(12), dst(12);
  EXPECT_THROW(resize_bilinear(src, 2, 2, {0, 0, 3, 2}, 2, 2, dst), InvalidArgument);
  EXPECT_THROW(resize_bilinear(src, 2, 2, {1, 0, 1, 2}, 2, 2, dst), InvalidArgument);
  EXPECT_THROW(resize_bilinear(src, 2, 2, {0, 0, 2, 2}, 0, 2, dst), InvalidArgument);
  EXPECT_THROW(resize_bilinear(src, 2, 2, {0, 0, 2, 2}, 3, 3, dst), InvalidArgument);
}

// Resize-then-crop in one resample equals resizing fully, then cropping (with zero padding).
TEST(Resample, CroppedOutputEqualsCropOfFullOutput) {
  std::mt19937 gen(9);
  const int w = 80, h = 60, fw = 50, fh = 37;
  const auto src = noise(w, h, gen);
  const auto full = reference_resize(src, w, h, {0, 0, float(w), float(h)}, fw, fh);
  for (auto [ox, oy, cw, chh] : {std::array{10, 5, 20, 20}, std::array{-3, -2, 56, 41},
                                 std::array{0, 0, fw, fh}, std::array{45, 30, 10, 10}}) {
    internal::AxisCoeffs hc, vc;
    internal::compute_coeffs({w, 0, float(w), fw, ox, cw}, hc);
    internal::compute_coeffs({h, 0, float(h), fh, oy, chh}, vc);
    // Give the resampler only the source rectangle it reads.
    std::vector<uint8_t> part;
    for (int y = vc.lo; y < vc.hi; ++y)
      part.insert(part.end(), src.begin() + (y * w + hc.lo) * 3, src.begin() + (y * w + hc.hi) * 3);
    const int lo_x = hc.lo, lo_y = vc.lo;
    internal::shift_coeffs(hc, -lo_x);
    internal::shift_coeffs(vc, -lo_y);
    std::vector<uint8_t> out(size_t(cw) * chh * 3), tmp, row;
    struct Ctx {
      std::vector<uint8_t>* out;
      int cw;
    } ctx{&out, cw};
    internal::resample_rgb8(
        part.data(), size_t(hc.hi - hc.lo) * 3, hc, vc, tmp, row,
        [](void* c, int y, const uint8_t* rgb) {
          auto* x = static_cast<Ctx*>(c);
          std::copy(rgb, rgb + x->cw * 3, x->out->begin() + y * x->cw * 3);
        },
        &ctx);
    for (int y = 0; y < chh; ++y)
      for (int x = 0; x < cw; ++x)
        for (int c = 0; c < 3; ++c) {
          const int sx = x + ox, sy = y + oy;
          const bool inside = sx >= 0 && sx < fw && sy >= 0 && sy < fh;
          ASSERT_EQ(out[(y * cw + x) * 3 + c], inside ? full[(sy * fw + sx) * 3 + c] : 0)
              << "crop " << ox << "," << oy << " at " << x << "," << y;
        }
  }
}

// Every kernel (generic, portable, AVX2 where the CPU has it) gives the same bytes, over random
// sizes (widths that are not multiples of any vector width), boxes, scales from 6x up to 6x down
// (tap windows 2 to 14 wide: each specialised count and the generic fallback) and crops that
// pad. The source holds exactly the rectangle the coefficients read, so that ASan catches any
// read past it.
TEST(Resample, KernelsAgreeOnRandomInputs) {
  using internal::ResampleKernel;
  std::mt19937 gen(17);
  std::vector<ResampleKernel> kernels = {ResampleKernel::kPortable};
  if (internal::set_resample_kernel(ResampleKernel::kAvx2))
    kernels.push_back(ResampleKernel::kAvx2);
  int tried = 0;
  for (int trial = 0; trial < 600; ++trial) {
    const int w = 1 + gen() % 120, h = 1 + gen() % 40;
    const double zoom = std::exp(std::uniform_real_distribution<double>(-1.8, 1.8)(gen));
    const int fw = std::max(1, int(w * zoom)), fh = std::max(1, int(h * zoom));
    std::uniform_real_distribution<float> fx(0, w), fy(0, h);
    float x0 = 0, x1 = w, y0 = 0, y1 = h;
    if (trial % 2) {
      float a = fx(gen), b = fx(gen), c = fy(gen), d = fy(gen);
      if (a == b || c == d) continue;
      x0 = std::min(a, b), x1 = std::max(a, b), y0 = std::min(c, d), y1 = std::max(c, d);
    }
    int ox = 0, oy = 0, cw = fw, chh = fh;
    if (trial % 3 == 1) {  // a crop, possibly padded
      ox = int(gen() % (fw + 6)) - 3, oy = int(gen() % (fh + 6)) - 3;
      cw = 1 + gen() % (fw + 4), chh = 1 + gen() % (fh + 4);
    }
    const auto src = noise(w, h, gen);
    const ResizeFilter f = trial % 4 >= 2 ? ResizeFilter::kBicubic : ResizeFilter::kBilinear;
    internal::AxisCoeffs hc, vc;
    internal::compute_coeffs({w, x0, x1, fw, ox, cw, true, f}, hc);
    internal::compute_coeffs({h, y0, y1, fh, oy, chh, true, f}, vc);
    std::vector<uint8_t> part;
    for (int y = vc.lo; y < vc.hi; ++y)
      part.insert(part.end(), src.begin() + (y * w + hc.lo) * 3, src.begin() + (y * w + hc.hi) * 3);
    if (part.empty()) part.resize(1);
    const std::vector<uint8_t> exact(part);  // part's capacity may exceed its size
    const int lo_x = hc.lo, lo_y = vc.lo;
    internal::shift_coeffs(hc, -lo_x);
    internal::shift_coeffs(vc, -lo_y);
    auto run = [&](ResampleKernel k) {
      EXPECT_TRUE(internal::set_resample_kernel(k));
      std::vector<uint8_t> out(size_t(cw) * chh * 3), tmp, row;
      struct Ctx {
        std::vector<uint8_t>* out;
        int cw;
      } ctx{&out, cw};
      internal::resample_rgb8(
          exact.data(), size_t(hc.hi - hc.lo) * 3, hc, vc, tmp, row,
          [](void* c, int y, const uint8_t* rgb) {
            auto* x = static_cast<Ctx*>(c);
            std::copy(rgb, rgb + x->cw * 3, x->out->begin() + y * x->cw * 3);
          },
          &ctx, trial % 5 == 0);
      return out;
    };
    const auto want = run(ResampleKernel::kGeneric);
    for (ResampleKernel k : kernels) {
      ASSERT_EQ(run(k), want) << "kernel " << int(k) << ": " << w << "x" << h << " box " << x0
                              << "," << y0 << "," << x1 << "," << y1 << " -> " << fw << "x" << fh
                              << " crop " << ox << "," << oy << " " << cw << "x" << chh << " taps "
                              << hc.taps;
    }
    ++tried;
  }
  internal::set_resample_kernel(ResampleKernel::kAuto);
  EXPECT_GT(tried, 500);
}

// The default kernels against the PIL transcription at the pipeline's typical sizes (wide rows,
// where the vector loops do most of the work): a RandomResizedCrop box, an upscale and a 2.2x
// downscale to 224x224.
TEST(ResizeBilinear, MatchesReferenceAtPipelineSizes) {
  std::mt19937 gen(5);
  struct Case {
    int w, h;
    ResizeBox box;
  };
  for (const Case& c :
       {Case{500, 375, {100.5f, 60.25f, 400.5f, 310.25f}}, Case{120, 100, {0, 0, 120, 100}},
        Case{493, 493, {0, 0, 493, 493}}, Case{333, 251, {3.7f, 0.2f, 331.1f, 250.9f}}}) {
    const auto src = noise(c.w, c.h, gen);
    std::vector<uint8_t> got(224 * 224 * 3);
    resize_bilinear(src, c.w, c.h, c.box, 224, 224, got);
    ASSERT_EQ(got, reference_resize(src, c.w, c.h, c.box, 224, 224)) << c.w << "x" << c.h;
  }
}

}  // namespace
}  // namespace stoker::image

namespace stoker::image::internal {
namespace {

void expect_same(const AxisCoeffs& a, const AxisCoeffs& b, const char* what) {
  EXPECT_EQ(a.first, b.first) << what;
  EXPECT_EQ(a.count, b.count) << what;
  EXPECT_EQ(a.k, b.k) << what;
  EXPECT_EQ(a.lo, b.lo) << what;
  EXPECT_EQ(a.hi, b.hi) << what;
  EXPECT_EQ(a.off, b.off) << what;
  EXPECT_EQ(a.kp, b.kp) << what;
}

AxisCoeffs fresh(const AxisSpec& spec, int delta) {
  AxisCoeffs c;
  compute_coeffs(spec, c);
  shift_coeffs(c, delta);
  return c;
}

// Kept coefficients, moved and prepared again in any order, are always those computed afresh
// for the spec and the move asked for.
TEST(CachedCoeffs, AreWhatAFreshComputationGives) {
  const AxisSpec a{340, 12.5f, 300.25f, 224, 0, 224, true};
  const AxisSpec b{340, 0.0f, 340.0f, 256, 16, 224, true};
  CachedCoeffs cached;
  cached.prepare(a);
  expect_same(cached.coeffs(), fresh(a, 0), "a");
  cached.move(-7);
  expect_same(cached.coeffs(), fresh(a, -7), "a moved");
  cached.prepare(a);  // the next frame of the clip
  expect_same(cached.coeffs(), fresh(a, 0), "a again");
  cached.move(5);
  cached.move(3);  // a move is from where prepare() left them, not cumulative
  expect_same(cached.coeffs(), fresh(a, 3), "a moved twice");
  cached.prepare(b);
  expect_same(cached.coeffs(), fresh(b, 0), "b");
  cached.move(2);
  cached.prepare(a);
  expect_same(cached.coeffs(), fresh(a, 0), "a after b");
}

}  // namespace
}  // namespace stoker::image::internal
