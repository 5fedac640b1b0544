#include "resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#if defined(__x86_64__) || defined(__i386__)
#define STOKER_RESAMPLE_X86 1
#include <immintrin.h>
#else
#define STOKER_RESAMPLE_X86 0
#endif

#include "stoker/errors.h"
#include "stoker/image/resize.h"

namespace stoker::image {
namespace internal {
namespace {

double triangle(double x) {
  x = std::abs(x);
  return x < 1.0 ? 1.0 - x : 0.0;
}

// PIL's bicubic_filter (a = -0.5), written as Pillow's Resample.c evaluates it.
double cubic(double x) {
  constexpr double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

inline uint8_t clip8(int32_t ss) {
  const int32_t v = ss >> kPrecisionBits;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// Builds the fast horizontal form of `c` (see AxisCoeffs::taps).
void build_fast_form(AxisCoeffs& c) {
  const int out = static_cast<int>(c.count.size());
  int maxn = 0;
  for (int n : c.count) maxn = std::max(maxn, n);
  const int taps = (maxn + 1) & ~1;
  const int pairs = taps / 2;
  c.taps = taps;
  c.off.assign(out, AxisCoeffs::kSlow);
  c.kp.assign(static_cast<size_t>(out) * taps, 0);
  c.kv.assign(static_cast<size_t>(out / 2) * pairs * 32, 0);
  if (taps == 0) return;
  for (int i = 0; i < out; ++i) {
    const int first = c.first[i], n = c.count[i];
    // The AVX2 kernel reads 3 * taps + 2 bytes from the window start: keep them in [lo, hi).
    // Padding pixels (all-zero weights) read a window at lo, which must fit too.
    const int start = std::min(n == 0 ? c.lo : first, c.hi - taps - 1);
    if (start < c.lo || start + taps < first + n) continue;
    const int32_t* k = &c.k[static_cast<size_t>(i) * c.ksize];
    // pmaddwd needs each weight as two int16 halves: hi = k >> 11 (bicubic's negative lobes
    // give a negative hi) and lo = k & 2047.
    bool fits = true;
    for (int j = 0; j < n; ++j) fits &= (k[j] >> 11) >= INT16_MIN && (k[j] >> 11) <= INT16_MAX;
    if (!fits) continue;
    const int off = first - start;
    c.off[i] = off;
    int32_t* kp = &c.kp[static_cast<size_t>(i) * taps];
    for (int j = 0; j < n; ++j) kp[off + j] = k[j];
    if (i / 2 >= out / 2) continue;  // the odd last pixel: portable code
    for (int q = 0; q < pairs; ++q) {
      int16_t* v = &c.kv[(static_cast<size_t>(i / 2) * pairs + q) * 32 + (i % 2) * 8];
      for (int t = 0; t < 2; ++t) {
        const int32_t w = kp[2 * q + t];
        for (int ch = 0; ch < 3; ++ch) {
          v[2 * ch + t] = static_cast<int16_t>(w >> 11);
          v[16 + 2 * ch + t] = static_cast<int16_t>(w & 2047);
        }
      }
    }
  }
}

}  // namespace

void compute_coeffs(const AxisSpec& s, AxisCoeffs& c) {
  // PIL computes (in1 - in0) in float, then widens.
  const double scale = static_cast<double>(s.in1 - s.in0) / s.full_out;
  const double filterscale = s.antialias ? std::max(scale, 1.0) : 1.0;
  const bool bicubic = s.filter == ResizeFilter::kBicubic;
  const double support = (bicubic ? 2.0 : 1.0) * filterscale;
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
      const double d = (x + xmin - center + 0.5) * ss;
      w[x] = bicubic ? cubic(d) : triangle(d);
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
  build_fast_form(c);
}

void shift_coeffs(AxisCoeffs& c, int delta) {
  for (int& f : c.first) f += delta;
  c.lo += delta;
  c.hi += delta;
}

void CachedCoeffs::prepare(const AxisSpec& spec) {
  if (valid_ && spec == spec_) {
    shift_coeffs(c_, -delta_);
    delta_ = 0;
    return;
  }
  valid_ = false;  // until compute_coeffs returns
  compute_coeffs(spec, c_);
  spec_ = spec;
  delta_ = 0;
  valid_ = true;
}

void CachedCoeffs::move(int delta) {
  shift_coeffs(c_, delta - delta_);
  delta_ = delta;
}

namespace {

constexpr int32_t kHalf = 1 << (kPrecisionBits - 1);

// One output pixel of the horizontal pass, exactly as Pillow computes it.
inline void h_pixel_generic(const uint8_t* in, const AxisCoeffs& h, int x, uint8_t* out) {
  const int n = h.count[x];
  if (n == 0) {  // padding column
    out[0] = out[1] = out[2] = 0;
    return;
  }
  const int32_t* k = &h.k[static_cast<size_t>(x) * h.ksize];
  const uint8_t* p = in + static_cast<size_t>(h.first[x]) * 3;
  int32_t s0 = kHalf, s1 = kHalf, s2 = kHalf;
  for (int j = 0; j < n; ++j, p += 3) {
    s0 += p[0] * k[j];
    s1 += p[1] * k[j];
    s2 += p[2] * k[j];
  }
  out[0] = clip8(s0);
  out[1] = clip8(s1);
  out[2] = clip8(s2);
}

void h_row_generic(const uint8_t* in, const AxisCoeffs& h, uint8_t* out) {
  const int out_w = static_cast<int>(h.count.size());
  for (int x = 0; x < out_w; ++x) h_pixel_generic(in, h, x, out + 3 * x);
}

// One output pixel through the zero-padded window of T (or h.taps, when T is 0) taps. Padding
// columns have all-zero weights, so they come out as kHalf >> 22 == 0.
template <int T>
inline void h_pixel_padded(const uint8_t* in, const AxisCoeffs& h, int x, uint8_t* out) {
  const int taps = T ? T : h.taps;
  const int off = h.off[x];
  if (off == AxisCoeffs::kSlow) return h_pixel_generic(in, h, x, out);
  const int32_t* k = &h.kp[static_cast<size_t>(x) * taps];
  const uint8_t* p = in + static_cast<ptrdiff_t>(h.first[x] - off) * 3;
  int32_t s0 = kHalf, s1 = kHalf, s2 = kHalf;
  for (int j = 0; j < taps; ++j) {
    s0 += p[3 * j] * k[j];
    s1 += p[3 * j + 1] * k[j];
    s2 += p[3 * j + 2] * k[j];
  }
  out[0] = clip8(s0);
  out[1] = clip8(s1);
  out[2] = clip8(s2);
}

template <int T>
void h_row_portable_t(const uint8_t* in, const AxisCoeffs& h, uint8_t* out) {
  const int out_w = static_cast<int>(h.count.size());
  for (int x = 0; x < out_w; ++x) h_pixel_padded<T>(in, h, x, out + 3 * x);
}

void h_row_portable(const uint8_t* in, const AxisCoeffs& h, uint8_t* out) {
  switch (h.taps) {
    case 0:
      return h_row_generic(in, h, out);
    case 2:
      return h_row_portable_t<2>(in, h, out);
    case 4:
      return h_row_portable_t<4>(in, h, out);
    case 6:
      return h_row_portable_t<6>(in, h, out);
    case 8:
      return h_row_portable_t<8>(in, h, out);
    default:
      return h_row_portable_t<0>(in, h, out);
  }
}

// Vertical pass for one output row: out[i] = clip(sum_j rows[j * stride + i] * k[j]), i < width.
// Taps inner over a block of contiguous bytes, so the block's sums stay in registers.
void v_row_portable(const uint8_t* base, size_t stride, const int32_t* k, int n, size_t width,
                    uint8_t* out) {
  size_t i = 0;
  constexpr size_t B = 16;
  for (; i + B <= width; i += B) {
    int32_t acc[B];
    for (size_t l = 0; l < B; ++l) acc[l] = kHalf;
    const uint8_t* p = base + i;
    for (int j = 0; j < n; ++j, p += stride) {
      const int32_t kj = k[j];
      for (size_t l = 0; l < B; ++l) acc[l] += p[l] * kj;
    }
    for (size_t l = 0; l < B; ++l) out[i + l] = clip8(acc[l]);
  }
  for (; i < width; ++i) {
    int32_t s = kHalf;
    const uint8_t* p = base + i;
    for (int j = 0; j < n; ++j, p += stride) s += *p * k[j];
    out[i] = clip8(s);
  }
}

#if STOKER_RESAMPLE_X86
// AVX2 horizontal pass: two output pixels per register (one per 128-bit lane). Per pair of taps,
// the 6 bytes of two source pixels become int16 (R0 R1 G0 G1 B0 B1 0 0), and pmaddwd against
// the weights split into hi * 2^11 + lo gives the exact 32-bit sums Pillow computes.
template <int Q>
__attribute__((target("avx2"))) void h_row_avx2_t(const uint8_t* in, const AxisCoeffs& h,
                                                  uint8_t* out) {
  const int out_w = static_cast<int>(h.count.size());
  const int pairs = Q ? Q : h.taps / 2;
  const __m256i ctrl = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1, 0,
                                        -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m256i half = _mm256_set1_epi32(kHalf);
  const int* first = h.first.data();
  const int* off = h.off.data();
  const __m256i* kv = reinterpret_cast<const __m256i*>(h.kv.data());
  int x = 0;
  for (; x + 2 <= out_w; x += 2, out += 6, kv += 2 * pairs) {
    const int o0 = off[x], o1 = off[x + 1];
    if (o0 == AxisCoeffs::kSlow || o1 == AxisCoeffs::kSlow) {
      h_pixel_generic(in, h, x, out);
      h_pixel_generic(in, h, x + 1, out + 3);
      continue;
    }
    const uint8_t* p0 = in + static_cast<ptrdiff_t>(first[x] - o0) * 3;
    const uint8_t* p1 = in + static_cast<ptrdiff_t>(first[x + 1] - o1) * 3;
    __m256i acc_h = _mm256_setzero_si256(), acc_l = _mm256_setzero_si256();
    for (int q = 0; q < pairs; ++q) {
      const __m128i a = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p0 + 6 * q));
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p1 + 6 * q));
      const __m256i v =
          _mm256_shuffle_epi8(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1), ctrl);
      acc_h = _mm256_add_epi32(acc_h, _mm256_madd_epi16(v, _mm256_loadu_si256(kv + 2 * q)));
      acc_l = _mm256_add_epi32(acc_l, _mm256_madd_epi16(v, _mm256_loadu_si256(kv + 2 * q + 1)));
    }
    __m256i sum = _mm256_add_epi32(_mm256_slli_epi32(acc_h, 11), _mm256_add_epi32(acc_l, half));
    sum = _mm256_srai_epi32(sum, kPrecisionBits);
    sum = _mm256_packs_epi32(sum, sum);   // saturating, as clip8: same result
    sum = _mm256_packus_epi16(sum, sum);  // lane i: R G B 0 ...
    const uint32_t w0 = static_cast<uint32_t>(_mm256_cvtsi256_si32(sum));
    const uint32_t w1 = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm256_extracti128_si256(sum, 1)));
    std::memcpy(out, &w0, 4);  // 4th bytes are junk, overwritten next (tmp has slack)
    std::memcpy(out + 3, &w1, 4);
  }
  if (x < out_w) h_pixel_padded<0>(in, h, x, out);
}

__attribute__((target("avx2"))) void h_row_avx2(const uint8_t* in, const AxisCoeffs& h,
                                                uint8_t* out) {
  switch (h.taps) {
    case 0:
      return h_row_generic(in, h, out);
    case 2:
      return h_row_avx2_t<1>(in, h, out);
    case 4:
      return h_row_avx2_t<2>(in, h, out);
    case 6:
      return h_row_avx2_t<3>(in, h, out);
    default:
      return h_row_avx2_t<0>(in, h, out);
  }
}

__attribute__((target("avx2"))) inline __m256i load8_epi32(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

__attribute__((target("avx2"))) void v_row_avx2(const uint8_t* base, size_t stride,
                                                const int32_t* k, int n, size_t width,
                                                uint8_t* out) {
  const __m256i half = _mm256_set1_epi32(kHalf);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  size_t i = 0;
  for (; i + 32 <= width; i += 32) {
    __m256i a0 = half, a1 = half, a2 = half, a3 = half;
    const uint8_t* p = base + i;
    for (int j = 0; j < n; ++j, p += stride) {
      const __m256i kj = _mm256_set1_epi32(k[j]);
      a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(load8_epi32(p), kj));
      a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(load8_epi32(p + 8), kj));
      a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(load8_epi32(p + 16), kj));
      a3 = _mm256_add_epi32(a3, _mm256_mullo_epi32(load8_epi32(p + 24), kj));
    }
    const __m256i s01 = _mm256_packs_epi32(_mm256_srai_epi32(a0, kPrecisionBits),
                                           _mm256_srai_epi32(a1, kPrecisionBits));
    const __m256i s23 = _mm256_packs_epi32(_mm256_srai_epi32(a2, kPrecisionBits),
                                           _mm256_srai_epi32(a3, kPrecisionBits));
    const __m256i r = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(s01, s23), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), r);
  }
  if (i < width) v_row_portable(base + i, stride, k, n, width - i, out + i);
}
#endif

using HRowFn = void (*)(const uint8_t*, const AxisCoeffs&, uint8_t*);
using VRowFn = void (*)(const uint8_t*, size_t, const int32_t*, int, size_t, uint8_t*);

void v_row_generic(const uint8_t* base, size_t stride, const int32_t* k, int n, size_t width,
                   uint8_t* out) {
  for (size_t i = 0; i < width; ++i) {
    int32_t s = kHalf;
    const uint8_t* p = base + i;
    for (int j = 0; j < n; ++j, p += stride) s += *p * k[j];
    out[i] = clip8(s);
  }
}

bool have_avx2() {
#if STOKER_RESAMPLE_X86
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

struct Kernels {
  HRowFn h;
  VRowFn v;
};

Kernels kernels_for(ResampleKernel k) {
  switch (k) {
    case ResampleKernel::kGeneric:
      return {h_row_generic, v_row_generic};
    case ResampleKernel::kPortable:
      return {h_row_portable, v_row_portable};
#if STOKER_RESAMPLE_X86
    case ResampleKernel::kAvx2:
      return {h_row_avx2, v_row_avx2};
#endif
    default:
      return have_avx2() ? kernels_for(ResampleKernel::kAvx2)
                         : kernels_for(ResampleKernel::kPortable);
  }
}

Kernels g_kernels = kernels_for(ResampleKernel::kAuto);

}  // namespace

bool set_resample_kernel(ResampleKernel k) {
  if (k == ResampleKernel::kAvx2 && !have_avx2()) return false;
  g_kernels = kernels_for(k);
  return true;
}

namespace {

// Whether an axis copies its source pixels one to one (each output pixel's first tap at full
// weight, its others at zero, on consecutive source pixels): a crop without a resize, a video
// frame at its own size. Exact: (p << bits + half) >> bits == p.
bool is_copy(const AxisCoeffs& a) {
  if (a.count.empty()) return false;
  for (size_t i = 0; i < a.count.size(); ++i) {
    const int32_t* k = &a.k[i * a.ksize];
    if (a.count[i] < 1 || a.first[i] != a.first[0] + static_cast<int>(i) ||
        k[0] != (1 << kPrecisionBits))
      return false;
    for (int j = 1; j < a.count[i]; ++j)
      if (k[j] != 0) return false;
  }
  return true;
}

}  // namespace

bool pil_vertical_first(const AxisSpec& x, const AxisSpec& y) {
  // Bilinear keeps the horizontal pass first (Pillow before 13's order, and the GPU kernels').
  if (x.filter != ResizeFilter::kBicubic) return false;
  const auto needed = [](const AxisSpec& a) {
    return a.full_out != a.in_size || a.in0 != 0 || a.in1 != static_cast<float>(a.full_out);
  };
  if (!needed(x) || !needed(y)) return false;
  const int shrink_y = y.in_size - y.full_out, shrink_x = x.in_size - x.full_out;
  return shrink_y > 0 && shrink_y > 2 * shrink_x;
}

void resample_rgb8(const uint8_t* src, size_t stride, const AxisCoeffs& h, const AxisCoeffs& v,
                   std::vector<uint8_t>& tmp, std::vector<uint8_t>& row, RowSink sink, void* ctx,
                   bool vertical_first) {
  const int out_w = static_cast<int>(h.count.size());
  const int out_h = static_cast<int>(v.count.size());
  if (is_copy(h) && is_copy(v)) {  // no resize: the source rows go to the sink as they are
    for (int y = 0; y < out_h; ++y)
      sink(ctx, y,
           src + static_cast<size_t>(v.first[y]) * stride + static_cast<size_t>(h.first[0]) * 3);
    return;
  }
  const Kernels kern = g_kernels;
  if (vertical_first) {
    // Vertical pass over the source columns the horizontal pass will read, [0, h.hi) wide so
    // that h's coordinates index it (columns below h.lo are left unset: never read).
    const size_t cols = static_cast<size_t>(std::max(h.hi, 0)) * 3;
    const size_t lo = static_cast<size_t>(std::max(h.lo, 0)) * 3;
    tmp.resize(cols * out_h + 8);
    row.resize(static_cast<size_t>(out_w) * 3 + 8);  // the horizontal kernels' slack
    for (int y = 0; y < out_h; ++y) {
      uint8_t* t = tmp.data() + y * cols;
      const int n = v.count[y];
      if (n == 0) {
        std::memset(t + lo, 0, cols - lo);  // padding row
      } else {
        kern.v(src + static_cast<size_t>(v.first[y]) * stride + lo, stride,
               &v.k[static_cast<size_t>(y) * v.ksize], n, cols - lo, t + lo);
      }
      kern.h(t, h, row.data());
      sink(ctx, y, row.data());
    }
    return;
  }
  const size_t tmp_stride = static_cast<size_t>(out_w) * 3;
  const int rows = v.hi - v.lo;
  // +8: the horizontal kernels may write a few bytes past a row (overwritten by the next).
  tmp.resize(tmp_stride * std::max(rows, 0) + 8);
  row.resize(tmp_stride);

  // Horizontal pass over the source rows the vertical pass will read.
  for (int r = 0; r < rows; ++r) {
    kern.h(src + static_cast<size_t>(v.lo + r) * stride, h, tmp.data() + r * tmp_stride);
  }
  // Vertical pass, one output row at a time.
  for (int y = 0; y < out_h; ++y) {
    const int n = v.count[y];
    if (n == 0) {
      std::memset(row.data(), 0, tmp_stride);  // padding row
    } else {
      kern.v(tmp.data() + static_cast<size_t>(v.first[y] - v.lo) * tmp_stride, tmp_stride,
             &v.k[static_cast<size_t>(y) * v.ksize], n, tmp_stride, row.data());
    }
    sink(ctx, y, row.data());
  }
}

}  // namespace internal

void resize_rgb(std::span<const uint8_t> src, int width, int height, ResizeBox box, int out_width,
                int out_height, std::span<uint8_t> dst, ResizeFilter filter) {
  if (width <= 0 || height <= 0 || out_width <= 0 || out_height <= 0) {
    throw InvalidArgument("resize_rgb: sizes must be positive");
  }
  if (src.size() < static_cast<size_t>(width) * height * 3 ||
      dst.size() < static_cast<size_t>(out_width) * out_height * 3) {
    throw InvalidArgument(
        "resize_rgb: src must hold width*height*3 bytes, dst "
        "out_width*out_height*3");
  }
  if (!(box.x0 >= 0 && box.y0 >= 0 && box.x1 <= width && box.y1 <= height && box.x0 < box.x1 &&
        box.y0 < box.y1)) {
    throw InvalidArgument("resize_rgb: the box must lie inside the image with x0 < x1 and y0 < y1");
  }
  const internal::AxisSpec hs{width, box.x0, box.x1, out_width, 0, out_width, true, filter};
  const internal::AxisSpec vs{height, box.y0, box.y1, out_height, 0, out_height, true, filter};
  internal::AxisCoeffs h, v;
  internal::compute_coeffs(hs, h);
  internal::compute_coeffs(vs, v);
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
      &ctx, internal::pil_vertical_first(hs, vs));
}

}  // namespace stoker::image
