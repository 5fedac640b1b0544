// Internal: PIL's two-pass resampling (bilinear or bicubic), generalised to "resize, then crop the
// result" so that the pipeline can produce its output in a single resample.
//
// Follows Pillow's libImaging/Resample.c (precompute_coeffs, normalize_coeffs_8bpc,
// ImagingResample{Horizontal,Vertical}_8bpc): same coefficient arithmetic (float box, double
// filter weights, 22-bit fixed point), same rounding, so results are bit-identical.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "stoker/image/resize.h"

namespace stoker::image::internal {

// One axis of: PIL resize of an image `in_size` pixels long, box [in0, in1) to `full_out`
// pixels, then a crop of `out_size` pixels starting at `out_offset` of that result. Output pixels
// that fall outside [0, full_out) are zero (CenterCrop's padding).
struct AxisSpec {
  int in_size = 0;
  float in0 = 0, in1 = 0;
  int full_out = 0;
  int out_offset = 0;
  int out_size = 0;
  // false: torch's bilinear interpolation without antialiasing (the filter keeps support 1 when
  // downscaling instead of widening with the scale).
  bool antialias = true;
  ResizeFilter filter = ResizeFilter::kBilinear;
  bool operator==(const AxisSpec&) const = default;
};

struct AxisCoeffs {
  int ksize = 0;
  std::vector<int> first;       // per output pixel, first source pixel it reads
  std::vector<int> count;       // per output pixel, how many (0: padding)
  std::vector<int32_t> k;       // out_size * ksize fixed-point weights
  int lo = 0, hi = 0;           // source pixels read by any output pixel: [lo, hi)
  std::vector<double> weights;  // working space, kept so steady state does not allocate

  // Fast horizontal form (built by compute_coeffs; shift-invariant). Each output pixel reads a
  // window of `taps` source pixels (the largest count, rounded up to even) starting at
  // first - off, with its weights zero-padded to that window (`kp`; `kv` holds the same weights
  // split as hi * 2^11 + lo in int16, laid out for the AVX2 kernel: per pair of output pixels,
  // per pair of taps, 16 hi then 16 lo). The window is moved left where it would end past `hi`,
  // and must leave 2 readable bytes after it; off == kSlow marks pixels whose window does not fit
  // in [lo, hi), which take the generic path.
  static constexpr int kSlow = -(1 << 30);
  int taps = 0;
  std::vector<int> off;
  std::vector<int32_t> kp;
  std::vector<int16_t> kv;
};

constexpr int kPrecisionBits = 32 - 8 - 2;

void compute_coeffs(const AxisSpec& spec, AxisCoeffs& c);

// Moves the source coordinate system: pixel p becomes p + delta.
void shift_coeffs(AxisCoeffs& c, int delta);

// An axis's coefficients kept for the next call with the same spec (the frames of a clip share
// their geometry; so do the images of a dataset of one size under CenterCrop or Resize): they are
// computed once, and only moved for each call. Not thread-safe: one per worker's scratch.
class CachedCoeffs {
 public:
  // Makes coeffs() those of `spec`, in its own coordinates (unmoved).
  void prepare(const AxisSpec& spec);
  // Moves them (shift_coeffs) by `delta` from where prepare() left them.
  void move(int delta);
  const AxisCoeffs& coeffs() const { return c_; }

 private:
  AxisCoeffs c_;
  AxisSpec spec_;
  int delta_ = 0;
  bool valid_ = false;
};

// Whether to run the vertical pass first, as Pillow 13 does when both passes run (it skips an
// axis whose size and box are unchanged, by its own test box[2] != xsize) and the height shrinks
// by more than twice the pixels the width shrinks by. The order changes the intermediate
// rounding. Followed for bicubic only (new, matched against Pillow 13); bilinear keeps the
// horizontal pass first, as Pillow before 13 and the GPU kernels (gpu/) do.
bool pil_vertical_first(const AxisSpec& x, const AxisSpec& y);

// Receives each output row (3 * out_width bytes of RGB) in order.
using RowSink = void (*)(void* ctx, int y, const uint8_t* rgb);

// Resamples `src` (RGB, `stride` bytes per row; pixel (x, y) of the coefficient coordinate
// system at src + y * stride + 3 * x, for the rows/columns the coefficients read). `tmp` holds
// the first pass and `row` one output row; both are resized as needed and reusable.
// vertical_first: the passes in that order (pil_vertical_first).
void resample_rgb8(const uint8_t* src, size_t stride, const AxisCoeffs& h, const AxisCoeffs& v,
                   std::vector<uint8_t>& tmp, std::vector<uint8_t>& row, RowSink sink, void* ctx,
                   bool vertical_first = false);

// Which kernels resample_rgb8 uses: kAuto picks the best the CPU supports. For tests and
// benchmarks (not thread-safe against concurrent resamples); returns false if `k` is not
// available on this CPU/build.
enum class ResampleKernel { kAuto, kGeneric, kPortable, kAvx2 };
bool set_resample_kernel(ResampleKernel k);

}  // namespace stoker::image::internal
