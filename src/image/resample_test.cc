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

}  // namespace
}  // namespace stoker::image
