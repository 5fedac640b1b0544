#include "geometry.h"

#include <algorithm>
#include <cmath>

#include "decode_region.h"

namespace stoker::image::internal {
namespace {

AxisPlan identity(int size) {
  return AxisPlan{0, size, 0.0, double(size), size, 0, size, false, true, ResizeFilter::kBilinear};
}

void crop(AxisPlan& a, int offset, int size) {
  a.offset += offset;
  a.size = size;
}

void resize(AxisPlan& a, int n, bool antialias, ResizeFilter filter) {
  a.antialias = antialias;
  a.filter = filter;
  if (!a.resized) {
    // PIL resizes the cropped image: the filter sees only the crop's pixels. Where the crop was
    // padded, the window stops at the image and the filter replicates the edge instead of
    // reading zeros (an approximation for this rare chain).
    const int s0 = a.lo + a.offset, s1 = s0 + a.size;
    const int w0 = std::clamp(s0, a.lo, a.hi - 1), w1 = std::clamp(s1, w0 + 1, a.hi);
    a.in0 = s0 - w0;
    a.in1 = s1 - w0;
    a.lo = w0;
    a.hi = w1;
  } else {
    // A resize of a resize: compose into one box (exact in geometry, one filter instead of two).
    const double scale = a.ratio();
    const double in0 = a.in0 + a.offset * scale;
    a.in1 = a.in0 + (a.offset + a.size) * scale;
    a.in0 = in0;
  }
  a.full_out = n;
  a.offset = 0;
  a.size = n;
  a.resized = true;
}

// A crop given in the current (possibly flipped) image, applied to the unflipped plan.
void crop_x(GeometryPlan& p, int left, int width) {
  crop(p.x, p.flip ? p.x.size - left - width : left, width);
}
void crop_y(GeometryPlan& p, int top, int height) {
  crop(p.y, p.vflip ? p.y.size - top - height : top, height);
}

}  // namespace

GeometryPlan plan_geometry(std::span<const Transform> transforms, int image_width, int image_height,
                           SampleRng& rng) {
  GeometryPlan p{identity(image_width), identity(image_height), false, false};
  for (const Transform& t : transforms) {
    if (const auto* rrc = std::get_if<RandomResizedCrop>(&t)) {
      const CropBox b = random_resized_crop_params(p.y.size, p.x.size, *rrc, rng);
      crop_y(p, b.top, b.height);
      crop_x(p, b.left, b.width);
      resize(p.y, rrc->height, rrc->antialias, rrc->interpolation);
      resize(p.x, rrc->width, rrc->antialias, rrc->interpolation);
    } else if (const auto* r = std::get_if<Resize>(&t)) {
      const auto [h, w] = resize_output_size(p.y.size, p.x.size, *r);
      resize(p.y, h, r->antialias, r->interpolation);
      resize(p.x, w, r->antialias, r->interpolation);
    } else if (const auto* cc = std::get_if<CenterCrop>(&t)) {
      const CropBox b = center_crop_box(p.y.size, p.x.size, *cc);
      crop_y(p, b.top, b.height);
      crop_x(p, b.left, b.width);
    } else if (const auto* cv = std::get_if<CoverCrop>(&t)) {
      const CoverBox b = cover_crop_params(p.y.size, p.x.size, *cv, rng);
      resize(p.y, b.resized_height, cv->antialias, ResizeFilter::kBilinear);
      resize(p.x, b.resized_width, cv->antialias, ResizeFilter::kBilinear);
      crop_y(p, b.top, cv->height);
      crop_x(p, b.left, cv->width);
    } else if (const auto* f = std::get_if<RandomHorizontalFlip>(&t)) {
      if (rng.bernoulli(f->p)) p.flip = !p.flip;
    } else if (const auto* vf = std::get_if<RandomVerticalFlip>(&t)) {
      if (rng.bernoulli(vf->p)) p.vflip = !p.vflip;
    }
  }
  return p;
}

AxisPlan scale_axis(const AxisPlan& a, int scale_num, int scaled) {
  if (scale_num == 8) return a;
  const double s = scale_num / 8.0;
  AxisPlan b = a;
  b.lo = static_cast<int>(std::floor(a.lo * s));
  b.hi = std::clamp(static_cast<int>(std::ceil(a.hi * s)), b.lo + 1, scaled);
  b.in0 = (a.lo + a.in0) * s - b.lo;
  b.in1 = (a.lo + a.in1) * s - b.lo;
  return b;
}

int choose_scale_num(const GeometryPlan& p, double min_ratio) {
  // Decoding at a reduced scale averages pixels: an antialiasing torch's antialias=False lacks.
  if (min_ratio <= 0 || !p.x.antialias || !p.y.antialias) return 8;
  if (p.x.filter != ResizeFilter::kBilinear || p.y.filter != ResizeFilter::kBilinear) return 8;
  const double ratio = std::min(p.x.ratio(), p.y.ratio());
  // libjpeg-turbo has SIMD inverse DCTs for 8x8, 4x4 and 2x2 outputs (and 1x1 is DC only); its
  // 3/8 and 5/8..7/8 scalings run in C and cost more than the full-size decode they replace
  // (decode_stages: 5/8 1.16x, 6/8 1.27x, 7/8 1.47x the 8/8 time; 4/8 0.87x).
  for (int num : {1, 2, 4})
    if (ratio * num / 8.0 >= min_ratio) return num;
  return 8;
}

}  // namespace stoker::image::internal
