// The GPU decode's resample/flip/normalize kernels, as one source for two compilers.
//
// NVRTC compiles this file at run time for the GPU (its text is embedded in the library by CMake:
// kernel_source.cc), with --fmad=false so that no multiply-add is fused; the host compiler
// compiles the very same functions (render.h) for the CPU reference of the tests' emulated backend
// (emulated_backend.cc), which they run against the CPU pipeline. The arithmetic is Pillow's
// (src/image/resample.cc): double-precision triangle weights normalized and rounded to 22-bit
// fixed point, int32 accumulation, each pass rounded to 8 bits; then the CPU pipeline's per-value
// output table. With IEEE double add/mul/div on both sides and no contraction, the GPU computes
// the CPU's bytes from the same decoded pixels.
//
// Plain C++ without headers (NVRTC has no standard library here): the host includes this file
// inside a namespace after <cstdint>; NVRTC defines __CUDACC_RTC__.
#ifdef __CUDACC_RTC__
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
#define STOKER_FN __device__ __forceinline__
#else
#define STOKER_FN inline
#endif

// One axis of a sample's resample (StagedAxis, plus where its coefficient table is).
struct KAxis {
  int32_t lo, in_size;
  float in0, in1;
  int32_t full_out, out_offset, out_size;
  int32_t ksize;  // weights per output pixel
  int64_t table;  // int32 offset of [out_size][2 + ksize]: first, count, weights
};

// One sample of a render launch.
struct KSample {
  int32_t out_index;  // its slot in the output batch
  int32_t pixels;     // 1: 8-bit HWC pixels already resampled (CPU path); 0: resample `src`
  int64_t src;        // byte offset in the arena: decoded RGB image, or the pixels
  int32_t src_pitch;  // bytes per row of the decoded image
  int32_t flip;
  KAxis x, y;
  int32_t rows_lo, rows;  // window rows the horizontal pass produces (y window coordinates)
  int64_t tmp;            // byte offset of rows x out_w x 3 horizontal-pass bytes
};

struct KParams {
  uint8_t* arena;
  const KSample* samples;
  int32_t* tables;
  const uint8_t* table_out;  // 3 x 256 output elements of elem_bytes each
  uint8_t* out;
  int64_t out_sample_bytes;
  int32_t elem_bytes;  // 1, 2 or 4
  int32_t hwc;         // layout: 1 HWC, 0 CHW
  int32_t out_h, out_w;
  int32_t n;
};

#define STOKER_PRECISION_BITS 22

STOKER_FN double k_abs(double v) { return v < 0 ? -v : v; }
STOKER_FN double k_max(double a, double b) { return a > b ? a : b; }
STOKER_FN int32_t k_imax(int32_t a, int32_t b) { return a > b ? a : b; }
STOKER_FN int32_t k_imin(int32_t a, int32_t b) { return a < b ? a : b; }
// ceil of a positive value below 2^52 (the filter support).
STOKER_FN double k_ceil(double v) {
  double t = (double)(int64_t)v;
  return t < v ? t + 1.0 : t;
}
STOKER_FN double k_triangle(double v) {
  v = k_abs(v);
  return v < 1.0 ? 1.0 - v : 0.0;
}

// Pillow's support arithmetic: PIL computes the box width in float, then widens.
STOKER_FN double k_scale(float in0, float in1, int32_t full_out) {
  return (double)(in1 - in0) / full_out;
}
STOKER_FN int32_t k_ksize(float in0, float in1, int32_t full_out) {
  const double filterscale = k_max(k_scale(in0, in1, full_out), 1.0);
  const double support = 1.0 * filterscale;
  return (int32_t)k_ceil(support) * 2 + 1;
}

// Output pixel i of an axis: the first source pixel its filter reads and how many (0: padding),
// and, when `weights` is not null, its ksize fixed-point weights (zeros past count).
STOKER_FN void k_coeffs(const KAxis& a, int32_t i, int32_t* first, int32_t* count,
                        int32_t* weights) {
  const double scale = k_scale(a.in0, a.in1, a.full_out);
  const double filterscale = k_max(scale, 1.0);
  const double support = 1.0 * filterscale;
  const int32_t xx = i + a.out_offset;
  *first = 0;
  *count = 0;
  if (weights != 0)
    for (int32_t x = 0; x < a.ksize; ++x) weights[x] = 0;
  if (xx < 0 || xx >= a.full_out) return;  // padding
  const double center = a.in0 + (xx + 0.5) * scale;
  const double ss = 1.0 / filterscale;
  const int32_t xmin = k_imax((int32_t)(center - support + 0.5), 0);
  const int32_t xmax = k_imin((int32_t)(center + support + 0.5), a.in_size);
  const int32_t n = k_imax(xmax - xmin, 0);
  *first = xmin;
  *count = n;
  if (weights == 0) return;
  // Pillow keeps the weights in an array; summing, then recomputing each one gives the same
  // doubles in the same order without one.
  double ww = 0.0;
  for (int32_t x = 0; x < n; ++x) ww += k_triangle((x + xmin - center + 0.5) * ss);
  for (int32_t x = 0; x < n; ++x) {
    const double w = k_triangle((x + xmin - center + 0.5) * ss);
    const double v = ww != 0.0 ? w / ww : w;
    weights[x] = (int32_t)(v < 0 ? -0.5 + v * (1 << STOKER_PRECISION_BITS)
                                 : 0.5 + v * (1 << STOKER_PRECISION_BITS));
  }
}

STOKER_FN uint8_t k_clip8(int32_t ss) {
  const int32_t v = ss >> STOKER_PRECISION_BITS;
  return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

// Thread of the coefficient kernel: entry i of the x table (i < out_w), else of the y table.
STOKER_FN void k_coeff_thread(const KParams& p, int32_t s, int32_t i) {
  const KSample& k = p.samples[s];
  if (k.pixels) return;
  const KAxis& a = i < p.out_w ? k.x : k.y;
  if (i >= p.out_w) i -= p.out_w;
  if (i >= a.out_size) return;
  int32_t* e = p.tables + a.table + (int64_t)i * (2 + a.ksize);
  k_coeffs(a, i, &e[0], &e[1], &e[2]);
}

// Thread of the horizontal pass: row r of the sample's rows, output column x (3 channels).
STOKER_FN void k_hpass_thread(const KParams& p, int32_t s, int32_t r, int32_t x) {
  const KSample& k = p.samples[s];
  if (k.pixels || r >= k.rows) return;
  uint8_t* out = p.arena + k.tmp + ((int64_t)r * p.out_w + x) * 3;
  const int32_t* e = p.tables + k.x.table + (int64_t)x * (2 + k.x.ksize);
  const int32_t first = e[0], n = e[1];
  const int32_t half = 1 << (STOKER_PRECISION_BITS - 1);
  int32_t s0 = half, s1 = half, s2 = half;
  const uint8_t* row = p.arena + k.src + (int64_t)(k.y.lo + k.rows_lo + r) * k.src_pitch;
  const uint8_t* px = row + (int64_t)(k.x.lo + first) * 3;
  for (int32_t j = 0; j < n; ++j, px += 3) {
    const int32_t w = e[2 + j];
    s0 += px[0] * w;
    s1 += px[1] * w;
    s2 += px[2] * w;
  }
  out[0] = n == 0 ? 0 : k_clip8(s0);
  out[1] = n == 0 ? 0 : k_clip8(s1);
  out[2] = n == 0 ? 0 : k_clip8(s2);
}

// Thread of the vertical pass and output: pixel (y, x) of sample s, written flipped, in the
// output dtype and layout through the output table.
STOKER_FN void k_vpass_thread(const KParams& p, int32_t s, int32_t y, int32_t x) {
  const KSample& k = p.samples[s];
  uint8_t v[3];
  if (k.pixels) {
    const uint8_t* px = p.arena + k.src + ((int64_t)y * p.out_w + x) * 3;
    v[0] = px[0];
    v[1] = px[1];
    v[2] = px[2];
  } else {
    const int32_t* e = p.tables + k.y.table + (int64_t)y * (2 + k.y.ksize);
    const int32_t first = e[0], n = e[1];
    const int32_t half = 1 << (STOKER_PRECISION_BITS - 1);
    const int64_t stride = (int64_t)p.out_w * 3;
    for (int32_t c = 0; c < 3; ++c) {
      int32_t ss = half;
      const uint8_t* t = p.arena + k.tmp + (int64_t)(first - k.rows_lo) * stride + x * 3 + c;
      for (int32_t j = 0; j < n; ++j, t += stride) ss += *t * e[2 + j];
      v[c] = n == 0 ? 0 : k_clip8(ss);
    }
  }
  const int32_t ox = k.flip ? p.out_w - 1 - x : x;
  uint8_t* dst = p.out + (int64_t)k.out_index * p.out_sample_bytes;
  const int64_t plane = (int64_t)p.out_h * p.out_w;
  for (int32_t c = 0; c < 3; ++c) {
    const int64_t at =
        p.hwc ? ((int64_t)y * p.out_w + ox) * 3 + c : c * plane + (int64_t)y * p.out_w + ox;
    const uint8_t* src = p.table_out + (c * 256 + v[c]) * p.elem_bytes;
    uint8_t* o = dst + at * p.elem_bytes;
    for (int32_t b = 0; b < p.elem_bytes; ++b) o[b] = src[b];
  }
}

#ifdef __CUDACC_RTC__
// Launch shapes (nvjpeg_backend.cc): blockIdx.y is the sample; x covers the per-sample index.
extern "C" __global__ void stoker_coeffs(KParams p) {
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.out_w + p.out_h) k_coeff_thread(p, blockIdx.y, i);
}
extern "C" __global__ void stoker_hpass(KParams p, int32_t max_rows) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < (int64_t)max_rows * p.out_w) k_hpass_thread(p, blockIdx.y, i / p.out_w, i % p.out_w);
}
extern "C" __global__ void stoker_vpass(KParams p) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < (int64_t)p.out_h * p.out_w) k_vpass_thread(p, blockIdx.y, i / p.out_w, i % p.out_w);
}
#endif
