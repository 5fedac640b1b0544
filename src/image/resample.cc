#include "resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "stoker/errors.h"
#include "stoker/image/resize.h"

namespace stoker::image {
namespace internal {
namespace {

double triangle(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

inline uint8_t clip8(int32_t ss) {
  const int32_t v = ss >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

void compute_coeffs(const AxisSpec& s, AxisCoeffs& c) {
  // PIL computes (in1 - in0) in float, then widens.
  const double scale = static_cast<double>(s.in1 - s.in0) / s.full_out;
  const double filterscale = std::max(scale, 1.0);
  const double support = 1.0 * filterscale;  // bilinear support is 1
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.first.assign(s.out_size, 0);
  c.count.assign(s.out_size, 0);
  c.k.assign(static_cast<size_t>(s.out_size) * c.ksize, 0);
  c.lo = s.in_size;
  c.hi = 0;
  std::vector<double>& w = c.weights;
  w.resize(c.ksize);
  for (int i = 0; i < s.out_size; ++i) {
    const int xx = i + s.out_offset;
    if (xx < 0 || xx >= s.full_out) continue;  // padding
    const double center = s.in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    const int xmin = std::max(static_cast<int>(center - support + 0.5), 0);
    const int xmax = std::min(static_cast<int>(center + support + 0.5), s.in_size);
    const int n = std::max(xmax - xmin, 0);
    double ww = 0.0;
    for (int x = 0; x < n; ++x) {
      w[x] = triangle((x + xmin - center + 0.5) * ss);
      ww += w[x];
    }
    int32_t* k = &c.k[static_cast<size_t>(i) * c.ksize];
    for (int x = 0; x < n; ++x) {
      const double v = ww != 0.0 ? w[x] / ww : w[x];
      k[x] = static_cast<int32_t>(v < 0 ? -0.5 + v * (1 << kPrecisionBits)
                                        : 0.5 + v * (1 << kPrecisionBits));
    }
    c.first[i] = xmin;
    c.count[i] = n;
    if (n > 0) {
      c.lo = std::min(c.lo, xmin);
      c.hi = std::max(c.hi, xmin + n);
    }
  }
  if (c.lo >= c.hi) c.lo = c.hi = 0;
}

void shift_coeffs(AxisCoeffs& c, int delta) {
  for (int& f : c.first) f += delta;
  c.lo += delta;
  c.hi += delta;
}

void resample_rgb8(const uint8_t* src, size_t stride, const AxisCoeffs& h, const AxisCoeffs& v,
                   std::vector<uint8_t>& tmp, std::vector<uint8_t>& row, RowSink sink, void* ctx) {
  const int out_w = static_cast<int>(h.count.size());
  const int out_h = static_cast<int>(v.count.size());
  const size_t tmp_stride = static_cast<size_t>(out_w) * 3;
  const int rows = v.hi - v.lo;
  tmp.resize(tmp_stride * std::max(rows, 0));
  row.resize(tmp_stride);
  constexpr int32_t kHalf = 1 << (kPrecisionBits - 1);

  // Horizontal pass over the source rows the vertical pass will read.
  for (int r = 0; r < rows; ++r) {
    const uint8_t* in = src + static_cast<size_t>(v.lo + r) * stride;
    uint8_t* out = tmp.data() + r * tmp_stride;
    for (int x = 0; x < out_w; ++x, out += 3) {
      const int32_t* k = &h.k[static_cast<size_t>(x) * h.ksize];
      const uint8_t* p = in + static_cast<size_t>(h.first[x]) * 3;
      int32_t s0 = kHalf, s1 = kHalf, s2 = kHalf;
      for (int j = 0, n = h.count[x]; j < n; ++j, p += 3) {
        s0 += p[0] * k[j];
        s1 += p[1] * k[j];
        s2 += p[2] * k[j];
      }
      if (h.count[x] == 0) s0 = s1 = s2 = 0;  // padding column
      out[0] = clip8(s0);
      out[1] = clip8(s1);
      out[2] = clip8(s2);
    }
  }
  // Vertical pass, one output row at a time.
  for (int y = 0; y < out_h; ++y) {
    const int n = v.count[y];
    if (n == 0) {
      std::memset(row.data(), 0, tmp_stride);  // padding row
    } else {
      const int32_t* k = &v.k[static_cast<size_t>(y) * v.ksize];
      const uint8_t* base = tmp.data() + static_cast<size_t>(v.first[y] - v.lo) * tmp_stride;
      for (size_t i = 0; i < tmp_stride; ++i) {
        int32_t s = kHalf;
        const uint8_t* p = base + i;
        for (int j = 0; j < n; ++j, p += tmp_stride) s += *p * k[j];
        row[i] = clip8(s);
      }
    }
    sink(ctx, y, row.data());
  }
}

}  // namespace internal

void resize_bilinear(std::span<const uint8_t> src, int width, int height, ResizeBox box,
                     int out_width, int out_height, std::span<uint8_t> dst) {
  if (width <= 0 || height <= 0 || out_width <= 0 || out_height <= 0) {
    throw InvalidArgument("resize_bilinear: sizes must be positive");
  }
  if (src.size() < static_cast<size_t>(width) * height * 3 ||
      dst.size() < static_cast<size_t>(out_width) * out_height * 3) {
    throw InvalidArgument(
        "resize_bilinear: src must hold width*height*3 bytes, dst "
        "out_width*out_height*3");
  }
  if (!(box.x0 >= 0 && box.y0 >= 0 && box.x1 <= width && box.y1 <= height && box.x0 < box.x1 &&
        box.y0 < box.y1)) {
    throw InvalidArgument(
        "resize_bilinear: the box must lie inside the image with x0 < x1 and y0 < y1");
  }
  internal::AxisCoeffs h, v;
  internal::compute_coeffs({width, box.x0, box.x1, out_width, 0, out_width}, h);
  internal::compute_coeffs({height, box.y0, box.y1, out_height, 0, out_height}, v);
  std::vector<uint8_t> tmp, row;
  struct Ctx {
    uint8_t* dst;
    size_t stride;
  } ctx{dst.data(), static_cast<size_t>(out_width) * 3};
  internal::resample_rgb8(
      src.data(), static_cast<size_t>(width) * 3, h, v, tmp, row,
      [](void* c, int y, const uint8_t* rgb) {
        auto* x = static_cast<Ctx*>(c);
        std::memcpy(x->dst + y * x->stride, rgb, x->stride);
      },
      &ctx);
}

}  // namespace stoker::image
