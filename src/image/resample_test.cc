#include "resample.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "stoker/errors.h"
#include "stoker/image/resize.h"

namespace stoker::image {
namespace {

// A plain transcription of Pillow's bilinear 8-bit resample, written independently of
// resample.cc: whole-image passes, one channel at a time.
struct RefCoeffs {
  std::vector<int> xmin, n;
  std::vector<std::vector<int>> k;
};

RefCoeffs ref_coeffs(int in_size, float in0, float in1, int out_size) {
  RefCoeffs c;
  const double scale = double(in1 - in0) / out_size;
  const double fs = scale < 1.0 ? 1.0 : scale;
  const double support = fs;
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
      w.push_back(t < 1 ? 1 - t : 0);
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
                                      int ow, int oh) {
  const RefCoeffs ch = ref_coeffs(w, b.x0, b.x1, ow), cv = ref_coeffs(h, b.y0, b.y1, oh);
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
    internal::AxisCoeffs hc, vc;
    internal::compute_coeffs({w, x0, x1, fw, ox, cw}, hc);
    internal::compute_coeffs({h, y0, y1, fh, oy, chh}, vc);
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
          &ctx);
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
