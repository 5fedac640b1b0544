// Colour and tone operations of ops.h: torchvision.transforms.v2's uint8 kernels
// (v2/functional/_color.py, gaussian_blur in _misc.py), step for step in float32.
//
// How torch's arithmetic is reproduced (measured on torch 2.14 / torchvision 0.29, CPU):
// - A Python float meets a uint8 tensor as float32: TensorIterator casts the double scalar to the
//   common dtype. So parameters and constants are rounded from the double (float(0.2989), not
//   the literal 0.2989f, which can differ in the last bit).
// - `a.add_(b, alpha=s)` is fused: ATen's CPU add computes `self + alpha * other` with one fused
//   multiply-add, in the vector loop and in the scalar tail alike. Grayscale and the blends of
//   contrast, saturation and sharpness therefore use std::fma; plain `a * b + c` is never
//   contracted here (CMakeLists.txt compiles this file with -ffp-contract=off).
// - `.to(torch.uint8)` after `clamp_(0, 255)` truncates toward zero; `round_()` rounds half to
//   even.
// With that, every operation but gaussian_blur is bit-exact (tests/python/
// test_vision_color_ops.py holds each against torchvision). gaussian_blur sums its taps in
// another order than torch's conv2d (separably, in float32), so a pixel whose blurred value lies
// within ~1e-4 of k + 0.5 may round the other way.
//
// Speed: contrast (after its mean), autocontrast and equalize (after their per-channel
// statistics) look each byte up in 256-entry tables computed with torch's expression;
// brightness, posterize, solarize and invert compute on the bytes in vector registers. The
// others run row loops written to vectorize. On x86 the loops that need FMA or gain from 8-wide
// floats are compiled twice, for AVX2 + FMA (chosen at run time where the CPU has them) and for
// the baseline ISA, where std::fma is libm's correctly rounded fmaf: slower, same bits. Nothing
// allocates but the scratch of blur and sharpness, which a warm OpScratch already holds.
#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "stoker/image/ops.h"
#include "stoker/errors.h"

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define STOKER_COLOR_X86 1
#else
#define STOKER_COLOR_X86 0
#endif

#define STOKER_ALWAYS_INLINE inline __attribute__((always_inline))

namespace stoker::image::internal {

// Test hook (color_ops_test.cc declares it): true runs the baseline-ISA loops even where the CPU
// has AVX2 + FMA, so that the tests can hold both compilations to the same bits.
void force_baseline_color_kernels(bool on);

namespace {

std::atomic<bool> g_force_baseline{false};

[[maybe_unused]] bool use_avx2_fma() {
#if STOKER_COLOR_X86
  static const bool have = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return have && !g_force_baseline.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

// Defines `ret name params`, running the always-inline `name##_body args` compiled for AVX2 + FMA
// where the CPU has them and for the baseline ISA otherwise (see the top of the file).
#if STOKER_COLOR_X86
#define STOKER_MULTIVERSIONED(ret, name, params, args)                                    \
  __attribute__((target("avx2,fma"))) ret name##_avx2 params { return name##_body args; } \
  ret name##_baseline params { return name##_body args; }                                 \
  ret name params { return use_avx2_fma() ? name##_avx2 args : name##_baseline args; }
#else
#define STOKER_MULTIVERSIONED(ret, name, params, args) \
  ret name params { return name##_body args; }
#endif

// torch's float32 constants, each rounded from the Python double as torch rounds it.
const float kRedLuma = static_cast<float>(0.2989);
const float kGreenLuma = static_cast<float>(0.587);
const float kBlueLuma = static_cast<float>(0.114);
const float kInv255 = static_cast<float>(1.0 / 255);  // to_dtype(float32, scale=True)
const float kInv6 = static_cast<float>(1.0 / 6.0);
const float kTo8Bit = static_cast<float>(255.0 + 1.0 - 1e-3);  // to_dtype(uint8, scale=True)

bool empty(const RgbView& img) { return img.height <= 0 || img.width <= 0; }

// clamp_(0, 255) then .to(torch.uint8).
STOKER_ALWAYS_INLINE uint8_t clamp_to_u8(float v) {
  return static_cast<uint8_t>(static_cast<int>(std::min(std::max(v, 0.0f), 255.0f)));
}

// The same for v >= 0 (a product of non-negative numbers), which needs only the upper clamp:
// without the lower compare, which GCC turns into masks over the converted values, it vectorizes
// to half the instructions.
STOKER_ALWAYS_INLINE uint8_t non_negative_to_u8(float v) {
  return static_cast<uint8_t>(static_cast<int>(v < 255.0f ? v : 255.0f));
}

// _rgb_to_grayscale_image in float32: r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114).
STOKER_ALWAYS_INLINE float luma(uint8_t r, uint8_t g, uint8_t b) {
  const float acc = static_cast<float>(r) * kRedLuma;
  return std::fma(static_cast<float>(b), kBlueLuma,
                  std::fma(static_cast<float>(g), kGreenLuma, acc));
}

// Table lookups gather 8 bytes into one 8-byte store: a store per byte, each checked against the
// table loads that follow it, runs at half the speed.
void apply_table(RgbView img, const uint8_t* table) {
  const size_t n = static_cast<size_t>(img.width) * 3;
  for (int y = 0; y < img.height; ++y) {
    uint8_t* p = img.row(y);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t in, out = 0;
      std::memcpy(&in, p + i, 8);
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) out |= uint64_t{table[(in >> (8 * k)) & 255]} << (8 * k);
      std::memcpy(p + i, &out, 8);
    }
    for (; i < n; ++i) p[i] = table[p[i]];
  }
}

// tables: 3 x 256, one per channel. (Gathering 24 bytes into three 8-byte stores, as
// apply_table does, is slower here.)
void apply_channel_tables(RgbView img, const uint8_t* tables) {
  const uint8_t* t0 = tables;
  const uint8_t* t1 = tables + 256;
  const uint8_t* t2 = tables + 512;
  for (int y = 0; y < img.height; ++y) {
    uint8_t* p = img.row(y);
    for (int x = 0; x < img.width; ++x, p += 3) {
      p[0] = t0[p[0]];
      p[1] = t1[p[1]];
      p[2] = t2[p[2]];
    }
  }
}

// Byte-wise minimum and maximum over `blocks` blocks of kMinMaxBlock bytes into lo and hi; byte k
// of a block is channel k % 3 (a block is 32 pixels).
constexpr size_t kMinMaxBlock = 96;
void block_min_max(const uint8_t* __restrict p, size_t blocks, uint8_t* __restrict lo,
                   uint8_t* __restrict hi) {
  for (size_t b = 0; b < blocks; ++b, p += kMinMaxBlock) {
    for (size_t k = 0; k < kMinMaxBlock; ++k) {
      const uint8_t v = p[k], l = lo[k], h = hi[k];
      lo[k] = v < l ? v : l;
      hi[k] = v > h ? v : h;
    }
  }
}

// --- Per-value kernels -----------------------------------------------------------------------
// Brightness and solarize compute their expression on every byte: 8 to 32 bytes per vector
// instruction beat a table lookup per byte. (Contrast's blend, with its lower clamp, is no faster
// so than its table.)

// image.mul(factor).clamp_(0, 255).to(uint8)
STOKER_ALWAYS_INLINE void scale_bytes_body(RgbView img, float factor) {
  const size_t n = static_cast<size_t>(img.width) * 3;
  for (int y = 0; y < img.height; ++y) {
    uint8_t* p = img.row(y);
    for (size_t i = 0; i < n; ++i) p[i] = non_negative_to_u8(static_cast<float>(p[i]) * factor);
  }
}
STOKER_MULTIVERSIONED(void, scale_bytes, (RgbView img, float factor), (img, factor))

// --- Grayscale-based kernels ------------------------------------------------------------------

STOKER_ALWAYS_INLINE void grayscale_rows_body(RgbView img) {
  for (int y = 0; y < img.height; ++y) {
    uint8_t* p = img.row(y);
    for (int x = 0; x < img.width; ++x) {
      const uint8_t l =
          static_cast<uint8_t>(static_cast<int>(luma(p[3 * x], p[3 * x + 1], p[3 * x + 2])));
      p[3 * x] = l;
      p[3 * x + 1] = l;
      p[3 * x + 2] = l;
    }
  }
}
STOKER_MULTIVERSIONED(void, grayscale_rows, (RgbView img), (img))

// The sum of the floored grayscale (adjust_contrast's mean is this over the pixel count).
STOKER_ALWAYS_INLINE uint64_t floored_luma_sum_body(RgbView img) {
  uint64_t total = 0;
  for (int y = 0; y < img.height; ++y) {
    const uint8_t* p = img.row(y);
    uint32_t row = 0;  // <= 255 * width
    for (int x = 0; x < img.width; ++x) {
      row += static_cast<uint32_t>(luma(p[3 * x], p[3 * x + 1], p[3 * x + 2]));
    }
    total += row;
  }
  return total;
}
STOKER_MULTIVERSIONED(uint64_t, floored_luma_sum, (RgbView img), (img))

// _blend(image, floor(grayscale), factor): image.mul(factor).add_(gray, alpha=1 - factor).
STOKER_ALWAYS_INLINE void saturation_rows_body(RgbView img, float factor, float alpha) {
  for (int y = 0; y < img.height; ++y) {
    uint8_t* p = img.row(y);
    for (int x = 0; x < img.width; ++x) {
      const uint8_t r = p[3 * x], g = p[3 * x + 1], b = p[3 * x + 2];
      const float gray = static_cast<float>(static_cast<int>(luma(r, g, b)));  // floor_(), >= 0
      p[3 * x] = clamp_to_u8(std::fma(gray, alpha, static_cast<float>(r) * factor));
      p[3 * x + 1] = clamp_to_u8(std::fma(gray, alpha, static_cast<float>(g) * factor));
      p[3 * x + 2] = clamp_to_u8(std::fma(gray, alpha, static_cast<float>(b) * factor));
    }
  }
}
STOKER_MULTIVERSIONED(void, saturation_rows, (RgbView img, float factor, float alpha),
                      (img, factor, alpha))

// --- Hue ------------------------------------------------------------------------------------

// c ? a : b through bit masks: GCC turns chains of ?: into multi-way branches that stop the
// hue loop from vectorizing; these stay branch-free.
STOKER_ALWAYS_INLINE float pick(bool c, float a, float b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & mask) |
                              (std::bit_cast<uint32_t>(b) & ~mask));
}

// clamp_(0.0, 1.0) for values that are not NaN.
STOKER_ALWAYS_INLINE float clamp01(float v) {
  v = pick(v < 0.0f, 0.0f, v);
  return pick(v > 1.0f, 1.0f, v);
}

constexpr int kHueChunk = 64;  // pixels converted to float planes at a time (on the stack)

// _rgb_to_hsv, the hue shift with remainder_(1.0), _hsv_to_rgb and to_dtype(uint8, scale=True)
// on n <= kHueChunk pixels at p.
STOKER_ALWAYS_INLINE void hue_pixels(uint8_t* p, int n, float hue_factor) {
  float red[kHueChunk], green[kHueChunk], blue[kHueChunk];
  int32_t out_r[kHueChunk], out_g[kHueChunk], out_b[kHueChunk];
  for (int j = 0; j < n; ++j) {
    red[j] = static_cast<float>(p[3 * j]) * kInv255;
    green[j] = static_cast<float>(p[3 * j + 1]) * kInv255;
    blue[j] = static_cast<float>(p[3 * j + 2]) * kInv255;
  }
  for (int j = 0; j < n; ++j) {
    const float r = red[j], g = green[j], b = blue[j];
    // Every value is computed on both sides of a choice and then picked: under -ftrapping-math
    // GCC will not if-convert a branch that holds float arithmetic, and branches stop the loop
    // from vectorizing.
    const float max_rg = pick(r < g, g, r), min_rg = pick(r > g, g, r);
    const float maxc = pick(b > max_rg, b, max_rg);  // torch.aminmax over the channels
    const float minc = pick(b < min_rg, b, min_rg);
    const bool eqc = maxc == minc;
    const float range = maxc - minc;
    const float s = range / pick(eqc, 1.0f, maxc);
    const float divisor = pick(eqc, 1.0f, range);
    // torch sums three masked candidates (the others are +-0, which adds nothing):
    // max == r: bc - gc; max == g: (rc + 2) - bc; else (gc + 4) - rc, with
    // xc = (maxc - x) / divisor. Only the two quotients the chosen one needs are computed.
    const bool max_is_r = maxc == r;
    const bool max_is_g = !max_is_r & (maxc == g);
    const float first = pick(max_is_r, b, pick(max_is_g, r, g));
    const float second = pick(max_is_r, g, pick(max_is_g, b, r));
    const float offset = pick(max_is_r, 0.0f, pick(max_is_g, 2.0f, 4.0f));
    float h = ((maxc - first) / divisor + offset) - (maxc - second) / divisor;
    h = h * kInv6 + 1.0f;              // in [5/6, 11/6]
    h = pick(h >= 1.0f, h - 1.0f, h);  // fmod_(1.0), exact
    h = h + hue_factor;                // in [-0.5, 1.5)
    h = pick(h >= 1.0f, h - 1.0f, h);  // remainder_(1.0): fmod, exact, then + 1 for a
    h = pick(h < 0.0f, h + 1.0f, h);   // negative rest (rounded: may give 1.0)
    const float v = maxc;
    const float h6 = h * 6.0f;  // >= 0 (or -0.0), so truncation is floor
    int i = static_cast<int>(h6);
    const float f = h6 - static_cast<float>(i);
    i &= -static_cast<int>(i != 6);  // i.remainder_(6), for i in [0, 6]
    const float sxf = s * f;
    const float one_minus_s = 1.0f - s;
    const float q = clamp01((1.0f - sxf) * v);
    const float t = clamp01((sxf + one_minus_s) * v);
    const float pv = clamp01(one_minus_s * v);
    // vpqt.gather with select = [[v, q, p, p, t, v], [t, v, v, q, p, p], [p, p, t, v, v, q]].
    const float ro = pick((i == 0) | (i == 5), v, pick(i == 1, q, pick(i == 4, t, pv)));
    const float go = pick(i == 0, t, pick((i == 1) | (i == 2), v, pick(i == 3, q, pv)));
    const float bo = pick(i == 2, t, pick((i == 3) | (i == 4), v, pick(i == 5, q, pv)));
    out_r[j] = static_cast<int32_t>(ro * kTo8Bit);
    out_g[j] = static_cast<int32_t>(go * kTo8Bit);
    out_b[j] = static_cast<int32_t>(bo * kTo8Bit);
  }
  for (int j = 0; j < n; ++j) {
    p[3 * j] = static_cast<uint8_t>(out_r[j]);
    p[3 * j + 1] = static_cast<uint8_t>(out_g[j]);
    p[3 * j + 2] = static_cast<uint8_t>(out_b[j]);
  }
}

STOKER_ALWAYS_INLINE void hue_rows_body(RgbView img, float hue_factor) {
  for (int y = 0; y < img.height; ++y) {
    uint8_t* p = img.row(y);
    for (int x = 0; x < img.width; x += kHueChunk) {
      hue_pixels(p + 3 * static_cast<size_t>(x), std::min(kHueChunk, img.width - x), hue_factor);
    }
  }
}
STOKER_MULTIVERSIONED(void, hue_rows, (RgbView img, float hue_factor), (img, hue_factor))

// --- Sharpness ------------------------------------------------------------------------------

// One interior row of adjust_sharpness. above, here: copies of the original rows y - 1 and y;
// below: row y + 1 (not yet written); out: row y. n = 3 * width.
//
// torch convolves the float image with [[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13 (weights rounded
// to float32) and rounds half to even. With s the 3x3 sum plus 4 * centre, the exact value s / 13
// is never within 1/26 of k + 0.5 (13 is odd), far beyond float32's error on it, so the rounded
// value is exactly round(s / 13) = (2s + 13) / 26 in integers.
STOKER_ALWAYS_INLINE void sharpness_row_body(const uint8_t* above, const uint8_t* here,
                                             const uint8_t* below, uint8_t* out, size_t n,
                                             float alpha) {
  for (size_t i = 3; i + 3 < n; ++i) {
    const uint32_t s = uint32_t(above[i - 3]) + above[i] + above[i + 3] + here[i - 3] +
                       5u * here[i] + here[i + 3] + below[i - 3] + below[i] + below[i + 3];
    const int blurred = static_cast<int>((2 * s + 13) / 26);
    const int x = here[i];
    // view.add_(blurred - view, alpha=1 - factor)
    out[i] = clamp_to_u8(std::fma(static_cast<float>(blurred - x), alpha, static_cast<float>(x)));
  }
}
STOKER_MULTIVERSIONED(void, sharpness_row,
                      (const uint8_t* above, const uint8_t* here, const uint8_t* below,
                       uint8_t* out, size_t n, float alpha),
                      (above, here, below, out, n, alpha))

// --- Gaussian blur --------------------------------------------------------------------------

// _get_gaussian_kernel1d: softmax(-(linspace(-lim, lim, size) / sigma)^2) in float32.
void gaussian_kernel(int size, double sigma, float* out) {
  const double lim = (size - 1) / (2.0 * std::sqrt(2.0));
  const float start = static_cast<float>(-lim), end = static_cast<float>(lim);
  const float sigma_f = static_cast<float>(sigma);
  float peak = -INFINITY;
  for (int i = 0; i < size; ++i) {
    // torch.linspace's CPU kernel: start + step * i up to half-way, end - step * (size - 1 - i)
    // from there (both fused by the compiler that built torch).
    float x = start;
    if (size > 1) {
      const float step = (end - start) / static_cast<float>(size - 1);
      x = i < size / 2 ? std::fma(step, static_cast<float>(i), start)
                       : std::fma(-step, static_cast<float>(size - 1 - i), end);
    }
    const float z = x / sigma_f;
    out[i] = -(z * z);
    peak = std::max(peak, out[i]);
  }
  // torch's exp is SLEEF's (within 1 ulp) and its sum is vectorized: the weights may differ from
  // these in the last bit, which moves the blurred value by ~1e-5 of 255.
  float total = 0.0f;
  for (int i = 0; i < size; ++i) {
    out[i] = static_cast<float>(std::exp(static_cast<double>(out[i] - peak)));
    total += out[i];
  }
  const float inverse = 1.0f / total;
  for (int i = 0; i < size; ++i) out[i] *= inverse;
}

// One row through the horizontal kernel: src's pixels reflected by `radius` on both sides into
// padded (3 * (width + 2 * radius) floats), then out[i] = sum_t k[t] * padded[i + 3 t]. The
// kernel is symmetric (torch's linspace is), so mirrored taps share a multiply.
STOKER_ALWAYS_INLINE void blur_row_h_body(const uint8_t* src, int width, const float* k, int radius,
                                          float* padded, float* out) {
  const size_t n = static_cast<size_t>(width) * 3;
  for (size_t i = 0; i < n; ++i) padded[3 * radius + i] = static_cast<float>(src[i]);
  for (int j = 1; j <= radius; ++j) {  // torch's reflect: -j -> j, width - 1 + j -> width - 1 - j
    for (int c = 0; c < 3; ++c) {
      padded[3 * (radius - j) + c] = static_cast<float>(src[3 * j + c]);
      padded[3 * (radius + width - 1 + j) + c] = static_cast<float>(src[3 * (width - 1 - j) + c]);
    }
  }
  const float* centre = padded + 3 * radius;
  const float kc = k[radius];
  for (size_t i = 0; i < n; ++i) out[i] = kc * centre[i];
  for (int t = 1; t <= radius; ++t) {
    const float kt = k[radius + t];
    const float* left = centre - 3 * t;
    const float* right = centre + 3 * t;
    for (size_t i = 0; i < n; ++i) out[i] += kt * (left[i] + right[i]);
  }
}
STOKER_MULTIVERSIONED(void, blur_row_h,
                      (const uint8_t* src, int width, const float* k, int radius, float* padded,
                       float* out),
                      (src, width, k, radius, padded, out))

// Output row y through the vertical kernel: ring slot r % height_k holds the horizontally
// blurred source row r; rows y - radius .. y + radius are reflected into [0, rows). The sum is
// rounded half to even (round_()) into out.
STOKER_ALWAYS_INLINE void blur_row_v_body(const float* ring, int height_k, int y, int rows,
                                          const float* k, int radius, size_t n, float* acc,
                                          uint8_t* out) {
  auto row = [&](int r) {
    r = r < 0 ? -r : r >= rows ? 2 * (rows - 1) - r : r;
    return ring + static_cast<size_t>(r % height_k) * n;
  };
  const float kc = k[radius];
  const float* centre = row(y);
  for (size_t i = 0; i < n; ++i) acc[i] = kc * centre[i];
  for (int t = 1; t <= radius; ++t) {
    const float kt = k[radius + t];
    const float* up = row(y - t);
    const float* down = row(y + t);
    for (size_t i = 0; i < n; ++i) acc[i] += kt * (up[i] + down[i]);
  }
  // Adding and removing 2^23 rounds a float in [0, 2^22) to an integer, half to even, in the
  // default rounding mode; the sum is in [0, 255.5).
  const float magic = 8388608.0f;
  for (size_t i = 0; i < n; ++i) {
    const float rounded = (acc[i] + magic) - magic;
    out[i] = static_cast<uint8_t>(static_cast<int>(rounded));
  }
}
STOKER_MULTIVERSIONED(void, blur_row_v,
                      (const float* ring, int height_k, int y, int rows, const float* k, int radius,
                       size_t n, float* acc, uint8_t* out),
                      (ring, height_k, y, rows, k, radius, n, acc, out))

std::string number(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

void require_non_negative(const char* op, const char* name, double v) {
  if (!(v >= 0.0 && std::isfinite(v))) {
    throw InvalidArgument(std::string(op) + ": " + name + " (" + number(v) +
                          ") is not a finite non-negative number");
  }
}

}  // namespace

void force_baseline_color_kernels(bool on) { g_force_baseline.store(on); }

void adjust_brightness(RgbView img, double factor) {
  require_non_negative("adjust_brightness", "brightness_factor", factor);
  scale_bytes(img, static_cast<float>(factor));
}

void adjust_contrast(RgbView img, double factor) {
  require_non_negative("adjust_contrast", "contrast_factor", factor);
  if (empty(img)) return;
  // mean over the floored grayscale: torch sums it in float32 and divides by the count. The sum
  // of integers is exact in float32 while it stays below 2^24 (any image up to 65,793 pixels;
  // larger ones while dark enough); above, torch's partial sums may round where this exact sum
  // does not, which moves the mean by an ulp at most.
  const uint64_t count = static_cast<uint64_t>(img.height) * static_cast<uint64_t>(img.width);
  const float mean =
      static_cast<float>(floored_luma_sum(img)) / static_cast<float>(static_cast<int64_t>(count));
  const float f = static_cast<float>(factor);
  const float alpha = static_cast<float>(1.0 - factor);
  uint8_t table[256];
  for (int v = 0; v < 256; ++v) {
    table[v] = clamp_to_u8(std::fma(mean, alpha, static_cast<float>(v) * f));
  }
  apply_table(img, table);
}

void adjust_saturation(RgbView img, double factor) {
  require_non_negative("adjust_saturation", "saturation_factor", factor);
  if (empty(img)) return;
  saturation_rows(img, static_cast<float>(factor), static_cast<float>(1.0 - factor));
}

void adjust_hue(RgbView img, double hue_factor, OpScratch&) {
  if (!(hue_factor >= -0.5 && hue_factor <= 0.5)) {
    throw InvalidArgument("adjust_hue: hue_factor (" + number(hue_factor) +
                          ") is not in [-0.5, 0.5]");
  }
  if (empty(img)) return;
  hue_rows(img, static_cast<float>(hue_factor));
}

void adjust_sharpness(RgbView img, double factor, OpScratch& scratch) {
  require_non_negative("adjust_sharpness", "sharpness_factor", factor);
  // torch returns images of height or width <= 2 as they are: they have no interior.
  if (img.height <= 2 || img.width <= 2) return;
  const size_t n = static_cast<size_t>(img.width) * 3;
  const float alpha = static_cast<float>(1.0 - factor);
  // Two rows of originals: row y is rewritten before row y + 1 needs it as its upper neighbour.
  scratch.bytes.resize(2 * n);
  uint8_t* saved[2] = {scratch.bytes.data(), scratch.bytes.data() + n};
  std::memcpy(saved[0], img.row(0), n);
  for (int y = 1; y + 1 < img.height; ++y) {
    uint8_t* here = saved[y & 1];
    std::memcpy(here, img.row(y), n);
    sharpness_row(saved[(y - 1) & 1], here, img.row(y + 1), img.row(y), n, alpha);
  }
}

void rgb_to_grayscale(RgbView img) {
  if (empty(img)) return;
  grayscale_rows(img);
}

void posterize(RgbView img, int bits) {
  if (bits < 0 || bits > 8) {
    throw InvalidArgument("posterize: bits must be in [0, 8], got " + std::to_string(bits));
  }
  if (bits == 8) return;
  // image & (((1 << bits) - 1) << (8 - bits))
  const uint8_t mask = static_cast<uint8_t>(((1u << bits) - 1u) << (8 - bits));
  const size_t n = static_cast<size_t>(img.width) * 3;
  for (int y = 0; y < img.height; ++y) {
    uint8_t* p = img.row(y);
    for (size_t i = 0; i < n; ++i) p[i] &= mask;
  }
}

void solarize(RgbView img, double threshold) {
  // torch.where(image >= threshold, ~image, image), compared in float32: the threshold is
  // rounded to float first (128.000001 becomes 128, so 128 is inverted). For the integers v,
  // float(v) >= t exactly when v >= ceil(t). A threshold above 255 (which torchvision rejects)
  // inverts nothing.
  const float t = static_cast<float>(threshold);
  if (!(t <= 255.0f)) return;
  const uint8_t first = t <= 0.0f ? 0 : static_cast<uint8_t>(std::ceil(t));
  const size_t n = static_cast<size_t>(img.width) * 3;
  for (int y = 0; y < img.height; ++y) {
    uint8_t* p = img.row(y);
    for (size_t i = 0; i < n; ++i) {
      const uint8_t v = p[i];
      p[i] = v >= first ? static_cast<uint8_t>(~v) : v;
    }
  }
}

void autocontrast(RgbView img) {
  if (empty(img)) return;
  // Minimum and maximum per channel, over blocks of 96 bytes that vectorize, then over the rest
  // of each row.
  uint8_t block_lo[kMinMaxBlock], block_hi[kMinMaxBlock];
  std::memset(block_lo, 255, kMinMaxBlock);
  std::memset(block_hi, 0, kMinMaxBlock);
  uint8_t lo[3] = {255, 255, 255}, hi[3] = {0, 0, 0};
  const size_t n = static_cast<size_t>(img.width) * 3;
  for (int y = 0; y < img.height; ++y) {
    const uint8_t* p = img.row(y);
    const size_t blocks = n / kMinMaxBlock;
    block_min_max(p, blocks, block_lo, block_hi);
    for (size_t i = blocks * kMinMaxBlock; i < n; ++i) {
      lo[i % 3] = std::min(lo[i % 3], p[i]);
      hi[i % 3] = std::max(hi[i % 3], p[i]);
    }
  }
  for (size_t k = 0; k < kMinMaxBlock; ++k) {
    lo[k % 3] = std::min(lo[k % 3], block_lo[k]);
    hi[k % 3] = std::max(hi[k % 3], block_hi[k]);
  }
  uint8_t tables[3 * 256];
  for (int c = 0; c < 3; ++c) {
    // inv_scale = (max - min) * (1 / 255); a flat channel gets min 0 and inv_scale 1 (identity).
    float minimum = static_cast<float>(lo[c]);
    float inv_scale = (static_cast<float>(hi[c]) - minimum) * kInv255;
    if (lo[c] == hi[c]) {
      minimum = 0.0f;
      inv_scale = 1.0f;
    }
    for (int v = 0; v < 256; ++v) {
      tables[256 * c + v] = clamp_to_u8((static_cast<float>(v) - minimum) / inv_scale);
    }
  }
  apply_channel_tables(img, tables);
}

void equalize(RgbView img) {
  if (empty(img)) return;
  // Four histograms per channel, so that runs of equal values do not serialize on one counter.
  uint32_t hist[3][4][256] = {};
  for (int y = 0; y < img.height; ++y) {
    const uint8_t* p = img.row(y);
    int x = 0;
    for (; x + 4 <= img.width; x += 4, p += 12) {
      for (int c = 0; c < 3; ++c) {
        ++hist[c][0][p[c]];
        ++hist[c][1][p[3 + c]];
        ++hist[c][2][p[6 + c]];
        ++hist[c][3][p[9 + c]];
      }
    }
    for (; x < img.width; ++x, p += 3) {
      for (int c = 0; c < 3; ++c) ++hist[c][0][p[c]];
    }
  }
  const uint64_t count = static_cast<uint64_t>(img.height) * static_cast<uint64_t>(img.width);
  uint8_t tables[3 * 256];
  for (int c = 0; c < 3; ++c) {
    uint64_t h[256];
    int last = 0;  // the largest value present: the first argmax of the cumulative histogram
    for (int v = 0; v < 256; ++v) {
      h[v] = uint64_t(hist[c][0][v]) + hist[c][1][v] + hist[c][2][v] + hist[c][3][v];
      if (h[v] != 0) last = v;
    }
    // PIL's scheme as torchvision writes it: step = (pixels not of the largest value) // 255;
    // lut[0] = 0, lut[k] = min((cum[k - 1] + step // 2) // step, 255); step 0 keeps the channel.
    const uint64_t step = (count - h[last]) / 255;
    uint8_t* table = tables + 256 * c;
    if (step == 0) {
      for (int v = 0; v < 256; ++v) table[v] = static_cast<uint8_t>(v);
      continue;
    }
    table[0] = 0;
    uint64_t cum = 0;
    for (int v = 1; v < 256; ++v) {
      cum += h[v - 1];
      table[v] = static_cast<uint8_t>(std::min<uint64_t>((cum + step / 2) / step, 255));
    }
  }
  apply_channel_tables(img, tables);
}

void invert(RgbView img) {
  const size_t n = static_cast<size_t>(img.width) * 3;
  for (int y = 0; y < img.height; ++y) {
    uint8_t* p = img.row(y);
    for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(~p[i]);
  }
}

void gaussian_blur(RgbView img, int kernel_width, int kernel_height, double sigma_x, double sigma_y,
                   OpScratch& scratch) {
  if (kernel_width <= 0 || kernel_height <= 0 || kernel_width % 2 == 0 || kernel_height % 2 == 0) {
    throw InvalidArgument(
        "gaussian_blur: kernel_size should have odd and positive integers, got [" +
        std::to_string(kernel_width) + ", " + std::to_string(kernel_height) + "]");
  }
  if (!(sigma_x > 0.0) || !(sigma_y > 0.0)) {
    throw InvalidArgument("gaussian_blur: sigma should have positive values, got [" +
                          number(sigma_x) + ", " + number(sigma_y) + "]");
  }
  if (empty(img)) return;
  const int rx = kernel_width / 2, ry = kernel_height / 2;
  // torch pads with mode="reflect", which needs each padding below the side it mirrors, and
  // raises otherwise; so does this.
  if (rx >= img.width || ry >= img.height) {
    throw InvalidArgument(
        "gaussian_blur: a " + std::to_string(kernel_width) + "x" + std::to_string(kernel_height) +
        " kernel reflects " + std::to_string(rx) + " columns and " + std::to_string(ry) +
        " rows, which needs an image wider than " + std::to_string(rx) + " and taller than " +
        std::to_string(ry) + " pixels (torch's reflect padding rule); the image is " +
        std::to_string(img.width) + "x" + std::to_string(img.height));
  }
  const size_t n = static_cast<size_t>(img.width) * 3;
  const size_t padded_size = static_cast<size_t>(img.width + 2 * rx) * 3;
  // Floats: both kernels, a padded row, the ring of kernel_height blurred rows, the accumulator.
  scratch.f.resize(kernel_width + kernel_height + padded_size +
                   static_cast<size_t>(kernel_height) * n + n);
  float* kx = scratch.f.data();
  float* ky = kx + kernel_width;
  float* padded = ky + kernel_height;
  float* ring = padded + padded_size;
  float* acc = ring + static_cast<size_t>(kernel_height) * n;
  gaussian_kernel(kernel_width, sigma_x, kx);
  gaussian_kernel(kernel_height, sigma_y, ky);

  // Source row r's horizontal blur lives in ring slot r % kernel_height. Output row y needs rows
  // y - ry .. y + ry reflected, all within [y - ry, y + ry]: the ring holds them, and each is
  // blurred from the image before output row y overwrites it (rows up to y + ry are blurred
  // first).
  int next = 0;  // the next source row to blur horizontally
  for (int y = 0; y < img.height; ++y) {
    for (; next <= std::min(y + ry, img.height - 1); ++next) {
      blur_row_h(img.row(next), img.width, kx, rx, padded,
                 ring + static_cast<size_t>(next % kernel_height) * n);
    }
    blur_row_v(ring, kernel_height, y, img.height, ky, ry, n, acc, img.row(y));
  }
}

}  // namespace stoker::image::internal
