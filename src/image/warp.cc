// Geometric operations of ops.h: torchvision v2's affine_image, rotate_image (expand=False) and
// pad_image on 8-bit RGB.
//
// affine and rotate reproduce torchvision's arithmetic step by step, because a warp that is off by
// one float rounding moves a nearest-neighbour sample by a whole pixel:
//   1. _get_inverse_affine_matrix in double (the same libm calls in the same order);
//   2. _affine_grid in float32: theta rounded to float, divided by half the image size, and the
//      grid point (xb * a + yb * b) + c, with xb, yb the pixel's offset from the image centre
//      (half-integers, exact in float; the sum in this order, each step rounded, as torch's bmm
//      computes it);
//   3. grid_sample(align_corners=False, padding_mode="zeros") as torch's vectorized CPU kernel
//      computes it: the source coordinate (g + 1) * (size / 2) - 0.5 as one fused multiply-add,
//      nearest by rounding half to even, bilinear weights in float and the four taps accumulated
//      with fused multiply-adds; a fill adds a channel of ones whose sample (the mask) blends the
//      fill in;
//   4. round half to even, then uint8.
// Fused multiply-adds are the instruction where the CPU has it, and otherwise computed in double:
// the product of two floats is exact there, so the only difference is a second rounding, which
// can change the float result only when the exact value lies within 2^-53 (relative) of a float
// rounding boundary. Every other float operation is rounded on its own: CMakeLists.txt compiles
// this file with -ffp-contract=off, because GCC contracts a * b + c into an fma wherever the
// target has one (also in ISO C++ mode), and the copy of the warp compiled for fma has one.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>

#include "stoker/image/ops.h"
#include "stoker/errors.h"

namespace stoker::image::internal {

// Tests only (warp_test.cc declares it): makes affine and rotate take the portable multiply-adds
// even where the CPU has the instruction, so that both copies of the warp are tested here.
namespace warp_testing {
std::atomic<bool> portable_only{false};
void use_portable_fma(bool on) { portable_only.store(on); }
}  // namespace warp_testing

namespace {

// CPython's math.radians: x * (pi / 180), the constant rounded once.
double radians(double degrees) { return degrees * (3.141592653589793 / 180.0); }

// torchvision's _get_inverse_affine_matrix(center, angle, translate, scale, shear) with
// inverted=True, operation for operation. center is relative to the image centre.
std::array<double, 6> inverse_affine_matrix(std::array<double, 2> center, double angle,
                                            std::array<double, 2> translate, double scale,
                                            std::array<double, 2> shear) {
  const double rot = radians(angle);
  const double sx = radians(shear[0]);
  const double sy = radians(shear[1]);
  const double cx = center[0], cy = center[1];
  const double tx = translate[0], ty = translate[1];
  const double cos_sy = std::cos(sy);
  const double tan_sx = std::tan(sx);
  const double rot_minus_sy = rot - sy;
  const double cx_plus_tx = cx + tx;
  const double cy_plus_ty = cy + ty;
  const double a = std::cos(rot_minus_sy) / cos_sy;
  const double b = -(a * tan_sx + std::sin(rot));
  const double c = std::sin(rot_minus_sy) / cos_sy;
  const double d = std::cos(rot) - c * tan_sx;
  std::array<double, 6> m = {d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0};
  m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
  m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
  return m;
}

// The float32 map from an output pixel to grid_sample's source coordinate (unnormalized).
struct SourceMap {
  float ax, bx, cx;  // grid x = (xb * ax + yb * bx) + cx
  float ay, by, cy;  // grid y = (xb * ay + yb * by) + cy
  float x_centre, y_centre;  // xb = x - x_centre, yb = y - y_centre: (size - 1) / 2
  float half_width, half_height;  // grid_sample's scaling factor, size / 2

  SourceMap(const std::array<double, 6>& m, int width, int height) {
    // theta = torch.tensor(matrix, dtype=float32); theta.T / [0.5 * w, 0.5 * h].
    const float hw = static_cast<float>(0.5 * width), hh = static_cast<float>(0.5 * height);
    ax = static_cast<float>(m[0]) / hw;
    bx = static_cast<float>(m[1]) / hw;
    cx = static_cast<float>(m[2]) / hw;
    ay = static_cast<float>(m[3]) / hh;
    by = static_cast<float>(m[4]) / hh;
    cy = static_cast<float>(m[5]) / hh;
    x_centre = static_cast<float>((width - 1) * 0.5);
    y_centre = static_cast<float>((height - 1) * 0.5);
    half_width = static_cast<float>(width) / 2;
    half_height = static_cast<float>(height) / 2;
  }
};

// fma(a, b, c) for floats, two ways that agree: the instruction, where the CPU has it, and
// otherwise double arithmetic, where a * b is exact and what remains is a second rounding (see the
// file comment). Every function that computes with it is inlined into one of two copies of the
// warp (warp_rows below): one compiled for the instruction, chosen at run time, and one portable.
struct EmulatedFma {
  static float fma(float a, float b, float c) {
    return static_cast<float>(static_cast<double>(a) * b + c);
  }
};
struct HardwareFma {
  static float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
};

#define STOKER_WARP_INLINE [[gnu::always_inline]] inline

// grid_sample's unnormalize for align_corners=False: (g + 1) * (size / 2) - 0.5.
template <class Fma>
STOKER_WARP_INLINE float unnormalize(float g, float half_size) {
  return Fma::fma(g + 1.0f, half_size, -0.5f);
}

// Source coordinates beyond this are outside any image; clamping keeps the integer conversions
// below defined without changing which pixels are inside (a NaN from a NaN parameter goes far too).
constexpr float kFar = 1 << 22;
inline float clamp_far(float v) { return v > -kFar ? (v < kFar ? v : kFar) : -kFar; }

// Round half to even for |v| <= 2^22 (the float addition rounds it in the default rounding mode;
// std::nearbyint is a library call without SSE4.1).
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  return (v + kMagic) - kMagic;
}

// floor for |v| <= 2^22, without a library call.
inline int floor_int(float v) {
  const int i = static_cast<int>(v);
  return i - (static_cast<float>(i) > v);
}

// A value >= -0.5 and < 255.5: round half to even, as round_() does.
inline uint8_t to_u8(float v) { return static_cast<uint8_t>(static_cast<int>(round_even(v))); }

// Output pixels are processed in runs of this many, their source coordinates kept on the stack.
constexpr int kRun = 256;

struct WarpFill {
  bool present = false;
  float value[3] = {0, 0, 0};      // fill, as float, clamped to [0, 255]
  uint8_t rounded[3] = {0, 0, 0};  // what nearest writes outside: round(fill), or 0 without fill
};

WarpFill warp_fill(const Fill& fill) {
  WarpFill f;
  if (!fill) return f;
  f.present = true;
  for (int c = 0; c < 3; ++c) {
    // torch's float -> uint8 conversion of an out-of-range fill is undefined; saturate instead.
    f.value[c] = std::min(std::max((*fill)[c], 0.0f), 255.0f);
    f.rounded[c] = to_u8(f.value[c]);
  }
  return f;
}

// One output row of nearest-neighbour sampling; ix, iy are already rounded.
void nearest_run(const RgbView& src, const float* ix, const float* iy, int n,
                 const WarpFill& fill, uint8_t* out) {
  const float max_x = static_cast<float>(src.width - 1);
  const float max_y = static_cast<float>(src.height - 1);
  auto inside = [&](int k) {
    return ix[k] >= 0.0f && ix[k] <= max_x && iy[k] >= 0.0f && iy[k] <= max_y;
  };
  // The map is monotone in x (every float step is), so the pixels that sample inside the image
  // form one interval [lo, hi) of the run.
  int lo = 0, hi = n;
  while (lo < n && !inside(lo)) ++lo;
  while (hi > lo && !inside(hi - 1)) --hi;
  auto outside_or_not = [&](int k) {
    uint8_t* o = out + 3 * k;
    if (inside(k)) {
      const uint8_t* p = src.row(static_cast<int>(iy[k])) + 3 * static_cast<int>(ix[k]);
      o[0] = p[0], o[1] = p[1], o[2] = p[2];
    } else {
      o[0] = fill.rounded[0], o[1] = fill.rounded[1], o[2] = fill.rounded[2];
    }
  };
  for (int k = 0; k < lo; ++k) outside_or_not(k);
  for (int k = lo; k < hi; ++k) {
    const uint8_t* p = src.row(static_cast<int>(iy[k])) + 3 * static_cast<int>(ix[k]);
    uint8_t* o = out + 3 * k;
    o[0] = p[0], o[1] = p[1], o[2] = p[2];
  }
  for (int k = hi; k < n; ++k) outside_or_not(k);
}

// torch's bilinear weights for a source coordinate.
struct Taps {
  int x0, y0;
  float nw, ne, sw, se;

  Taps(float ix, float iy) {
    x0 = floor_int(ix);
    y0 = floor_int(iy);
    const float w = ix - static_cast<float>(x0);
    const float e = 1.0f - w;
    const float n = iy - static_cast<float>(y0);
    const float s = 1.0f - n;
    nw = s * e;
    ne = s * w;
    sw = n * e;
    se = n * w;
  }
};

// One bilinear sample of the four taps nw, ne (row y0), sw, se (row y0 + 1), in torch's order:
// nw * w_nw in float, then ne, sw and se each added with a fused multiply-add. A fill blends in
// by the mask channel's sample, (value - fill) * mask + fill, each step rounded.
template <bool kFill, class Fma>
STOKER_WARP_INLINE void blend(const Taps& t, const uint8_t* nw, const uint8_t* ne,
                              const uint8_t* sw, const uint8_t* se, float mask,
                              const WarpFill& fill, uint8_t* out) {
  for (int c = 0; c < 3; ++c) {
    float v = static_cast<float>(nw[c]) * t.nw;
    v = Fma::fma(static_cast<float>(ne[c]), t.ne, v);
    v = Fma::fma(static_cast<float>(sw[c]), t.sw, v);
    v = Fma::fma(static_cast<float>(se[c]), t.se, v);
    if constexpr (kFill) {
      v = v - fill.value[c];
      v = v * mask;
      v = v + fill.value[c];
    }
    out[c] = to_u8(v);
  }
}

// A sample with taps outside the image: they read as 0, in the image and in the mask channel.
template <bool kFill, class Fma>
STOKER_WARP_INLINE void blend_border(const RgbView& src, float ix, float iy, const WarpFill& fill,
                                     uint8_t* out) {
  const Taps t(ix, iy);
  const bool x0_in = t.x0 >= 0 && t.x0 < src.width;
  const bool x1_in = t.x0 + 1 >= 0 && t.x0 + 1 < src.width;
  const bool y0_in = t.y0 >= 0 && t.y0 < src.height;
  const bool y1_in = t.y0 + 1 >= 0 && t.y0 + 1 < src.height;
  static constexpr uint8_t kZero[3] = {0, 0, 0};
  const uint8_t* top = y0_in ? src.row(t.y0) : nullptr;
  const uint8_t* bottom = y1_in ? src.row(t.y0 + 1) : nullptr;
  const uint8_t* nw = top && x0_in ? top + 3 * t.x0 : kZero;
  const uint8_t* ne = top && x1_in ? top + 3 * (t.x0 + 1) : kZero;
  const uint8_t* sw = bottom && x0_in ? bottom + 3 * t.x0 : kZero;
  const uint8_t* se = bottom && x1_in ? bottom + 3 * (t.x0 + 1) : kZero;
  float mask = 0.0f;
  if constexpr (kFill) {
    mask = (nw != kZero ? t.nw : 0.0f);
    mask = mask + (ne != kZero ? t.ne : 0.0f);
    mask = mask + (sw != kZero ? t.sw : 0.0f);
    mask = mask + (se != kZero ? t.se : 0.0f);
  }
  blend<kFill, Fma>(t, nw, ne, sw, se, mask, fill, out);
}

// One output row of bilinear sampling.
template <bool kFill, class Fma>
STOKER_WARP_INLINE void bilinear_run(const RgbView& src, const float* ix, const float* iy, int n,
                                     const WarpFill& fill, uint8_t* out) {
  const float last_x = static_cast<float>(src.width - 1);
  const float last_y = static_cast<float>(src.height - 1);
  // All four taps inside: 0 <= ix < width - 1 and the same for y. The map is monotone in x, so
  // these pixels form one interval [lo, hi) of the run.
  auto inside = [&](int k) {
    return ix[k] >= 0.0f && ix[k] < last_x && iy[k] >= 0.0f && iy[k] < last_y;
  };
  int lo = 0, hi = n;
  while (lo < n && !inside(lo)) ++lo;
  while (hi > lo && !inside(hi - 1)) --hi;
  for (int k = 0; k < lo; ++k) blend_border<kFill, Fma>(src, ix[k], iy[k], fill, out + 3 * k);
  for (int k = lo; k < hi; ++k) {
    const Taps t(ix[k], iy[k]);
    const uint8_t* p = src.row(t.y0) + 3 * t.x0;
    const uint8_t* q = p + src.stride;
    float mask = 0.0f;
    if constexpr (kFill) mask = ((t.nw + t.ne) + t.sw) + t.se;
    blend<kFill, Fma>(t, p, p + 3, q, q + 3, mask, fill, out + 3 * k);
  }
  for (int k = hi; k < n; ++k) blend_border<kFill, Fma>(src, ix[k], iy[k], fill, out + 3 * k);
}

// The rows of a warp: source coordinates run by run, then the samples.
template <class Fma>
STOKER_WARP_INLINE void warp_rows(const RgbView& src, const RgbView& dst, const SourceMap& map,
                                  bool nearest, const WarpFill& fill) {
  float ix[kRun], iy[kRun];
  for (int y = 0; y < dst.height; ++y) {
    const float yb = static_cast<float>(y) - map.y_centre;
    const float row_x = yb * map.bx, row_y = yb * map.by;
    uint8_t* out = dst.row(y);
    for (int x0 = 0; x0 < dst.width; x0 += kRun) {
      const int n = std::min(kRun, dst.width - x0);
      for (int k = 0; k < n; ++k) {
        const float xb = static_cast<float>(x0 + k) - map.x_centre;
        const float gx = (xb * map.ax + row_x) + map.cx;
        const float gy = (xb * map.ay + row_y) + map.cy;
        ix[k] = clamp_far(unnormalize<Fma>(gx, map.half_width));
        iy[k] = clamp_far(unnormalize<Fma>(gy, map.half_height));
      }
      uint8_t* o = out + 3 * static_cast<size_t>(x0);
      if (nearest) {
        for (int k = 0; k < n; ++k) ix[k] = round_even(ix[k]), iy[k] = round_even(iy[k]);
        nearest_run(src, ix, iy, n, fill, o);
      } else if (fill.present) {
        bilinear_run<true, Fma>(src, ix, iy, n, fill, o);
      } else {
        bilinear_run<false, Fma>(src, ix, iy, n, fill, o);
      }
    }
  }
}

#if defined(__FP_FAST_FMAF)  // the baseline target has the instruction (aarch64, x86-64-v3)
void warp_rows_any(const RgbView& src, const RgbView& dst, const SourceMap& map, bool nearest,
                   const WarpFill& fill) {
  warp_rows<HardwareFma>(src, dst, map, nearest, fill);
}
#elif defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
[[gnu::target("fma")]] void warp_rows_fma(const RgbView& src, const RgbView& dst,
                                          const SourceMap& map, bool nearest,
                                          const WarpFill& fill) {
  warp_rows<HardwareFma>(src, dst, map, nearest, fill);
}
void warp_rows_any(const RgbView& src, const RgbView& dst, const SourceMap& map, bool nearest,
                   const WarpFill& fill) {
  static const bool has_fma = __builtin_cpu_supports("fma");
  if (has_fma && !warp_testing::portable_only.load(std::memory_order_relaxed)) {
    warp_rows_fma(src, dst, map, nearest, fill);
  } else {
    warp_rows<EmulatedFma>(src, dst, map, nearest, fill);
  }
}
#else
void warp_rows_any(const RgbView& src, const RgbView& dst, const SourceMap& map, bool nearest,
                   const WarpFill& fill) {
  warp_rows<EmulatedFma>(src, dst, map, nearest, fill);
}
#endif

// affine_image / rotate_image's grid transform with the inverse matrix m (torchvision's
// convention: pixel offsets from the image centre).
void warp(RgbView src, RgbView dst, const std::array<double, 6>& m, Interpolation interpolation,
          const Fill& fill_arg) {
  if (src.width <= 0 || src.height <= 0) return;
  const SourceMap map(m, src.width, src.height);
  const WarpFill fill = warp_fill(fill_arg);
  warp_rows_any(src, dst, map, interpolation == Interpolation::kNearest, fill);
}

void require_same_size(const RgbView& src, const RgbView& dst, const char* op) {
  if (dst.width != src.width || dst.height != src.height) {
    throw InvalidArgument(std::string(op) + ": dst must be the size of src (" +
                          std::to_string(src.height) + "x" + std::to_string(src.width) +
                          "), got " + std::to_string(dst.height) + "x" +
                          std::to_string(dst.width));
  }
}

// torch.rot90(img, k, dims=(-2, -1)): out(x, y) = in(source(x, y)).
template <typename Source>
void permute(RgbView src, RgbView dst, Source source) {
  for (int y = 0; y < dst.height; ++y) {
    uint8_t* o = dst.row(y);
    for (int x = 0; x < dst.width; ++x) {
      const auto [sx, sy] = source(x, y);
      const uint8_t* p = src.row(sy) + 3 * sx;
      o[3 * x] = p[0], o[3 * x + 1] = p[1], o[3 * x + 2] = p[2];
    }
  }
}

// Python's float modulo (the result takes the divisor's sign), as rotate_image's angle % 360.
double python_mod(double a, double b) {
  double r = std::fmod(a, b);
  if (r != 0.0) {
    if ((b < 0) != (r < 0)) r += b;
  } else {
    r = std::copysign(0.0, b);
  }
  return r;
}

// The source index of padded index i along a side of n pixels (i outside [0, n)).
int pad_source(int i, int n, PadMode mode) {
  switch (mode) {
    case PadMode::kEdge:
      return std::clamp(i, 0, n - 1);
    case PadMode::kReflect:  // torch: the edge pixel is the mirror
      return i < 0 ? -i : 2 * (n - 1) - i;
    case PadMode::kSymmetric:  // torchvision's _pad_symmetric: the edge pixel repeats
      return i < 0 ? -i - 1 : 2 * n - 1 - i;
    case PadMode::kConstant:
      break;
  }
  return -1;
}

}  // namespace

void affine(RgbView src, RgbView dst, double angle, std::array<double, 2> translate, double scale,
            std::array<double, 2> shear, Interpolation interpolation, const Fill& fill,
            std::optional<std::array<double, 2>> center) {
  require_same_size(src, dst, "affine");
  if (!(scale > 0.0)) throw InvalidArgument("affine: scale must be positive");
  std::array<double, 2> centre = {0.0, 0.0};
  if (center) {
    centre = {(*center)[0] - src.width * 0.5, (*center)[1] - src.height * 0.5};
  }
  warp(src, dst, inverse_affine_matrix(centre, angle, translate, scale, shear), interpolation,
       fill);
}

void rotate(RgbView src, RgbView dst, double angle, Interpolation interpolation, const Fill& fill,
            std::optional<std::array<double, 2>> center) {
  require_same_size(src, dst, "rotate");
  angle = python_mod(angle, 360.0);
  const int w = src.width, h = src.height;
  // rotate_image's fast paths (only for the default centre): exact index permutations.
  if (!center && w > 0 && h > 0) {
    if (angle == 0.0) {
      for (int y = 0; y < h; ++y) std::memcpy(dst.row(y), src.row(y), 3 * static_cast<size_t>(w));
      return;
    }
    if (angle == 180.0) {
      permute(src, dst, [&](int x, int y) { return std::pair(w - 1 - x, h - 1 - y); });
      return;
    }
    if (w == h && angle == 90.0) {  // counter-clockwise
      permute(src, dst, [&](int x, int y) { return std::pair(w - 1 - y, x); });
      return;
    }
    if (w == h && angle == 270.0) {
      permute(src, dst, [&](int x, int y) { return std::pair(y, h - 1 - x); });
      return;
    }
  }
  std::array<double, 2> centre = {0.0, 0.0};
  if (center) centre = {(*center)[0] - w * 0.5, (*center)[1] - h * 0.5};
  // rotate and affine turn opposite ways: rotate_image passes -angle.
  warp(src, dst, inverse_affine_matrix(centre, -angle, {0.0, 0.0}, 1.0, {0.0, 0.0}),
       interpolation, fill);
}

void pad(RgbView src, RgbView dst, int left, int top, int right, int bottom, PadMode mode,
         std::array<uint8_t, 3> fill) {
  const int w = src.width, h = src.height;
  if (left < 0 || top < 0 || right < 0 || bottom < 0) {
    throw InvalidArgument("pad: paddings must be >= 0");
  }
  if (dst.width != left + w + right || dst.height != top + h + bottom) {
    throw InvalidArgument("pad: dst must be (top + height + bottom) x (left + width + right)");
  }
  // torch.nn.functional.pad's rule for reflect; _pad_symmetric indexes at most a whole side.
  if (mode == PadMode::kReflect && (std::max(left, right) >= w || std::max(top, bottom) >= h)) {
    throw InvalidArgument("pad: reflect padding must be < the side it mirrors (" +
                          std::to_string(h) + "x" + std::to_string(w) + ")");
  }
  if (mode == PadMode::kSymmetric && (std::max(left, right) > w || std::max(top, bottom) > h)) {
    throw InvalidArgument("pad: symmetric padding must be <= the side it mirrors (" +
                          std::to_string(h) + "x" + std::to_string(w) + ")");
  }
  const bool constant = mode == PadMode::kConstant;
  const size_t row_bytes = 3 * static_cast<size_t>(w);
  for (int y = 0; y < dst.height; ++y) {
    uint8_t* o = dst.row(y);
    int sy = y - top;
    if (sy < 0 || sy >= h) sy = constant ? -1 : pad_source(sy, h, mode);
    if (sy < 0) {
      for (int x = 0; x < dst.width; ++x) {
        o[3 * x] = fill[0], o[3 * x + 1] = fill[1], o[3 * x + 2] = fill[2];
      }
      continue;
    }
    const uint8_t* s = src.row(sy);
    for (int x = 0; x < left; ++x) {
      const uint8_t* p = constant ? fill.data() : s + 3 * pad_source(x - left, w, mode);
      o[3 * x] = p[0], o[3 * x + 1] = p[1], o[3 * x + 2] = p[2];
    }
    std::memcpy(o + 3 * static_cast<size_t>(left), s, row_bytes);
    for (int x = left + w; x < dst.width; ++x) {
      const uint8_t* p = constant ? fill.data() : s + 3 * pad_source(x - left, w, mode);
      o[3 * x] = p[0], o[3 * x + 1] = p[1], o[3 * x + 2] = p[2];
    }
  }
}

}  // namespace stoker::image::internal
