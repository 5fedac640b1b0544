// Internal: composition of the geometric transforms into one resample.
//
// torchvision applies crops and resizes one after another to PIL images. Per axis, every such
// chain is (or, for a resize after a resize, is approximated by) one PIL resize of a float box of
// a source window, followed by a crop of its output: AxisPlan. The flips commute with
// resampling, so they are applied once when writing the output.
#pragma once

#include <span>
#include <vector>

#include "resample.h"
#include "stoker/image/transforms.h"
#include "stoker/random.h"

namespace stoker::image::internal {

struct AxisPlan {
  int lo = 0, hi = 0;        // source window the filter may read (PIL's image at resize time)
  double in0 = 0, in1 = 0;   // resize box, relative to lo
  int full_out = 0;          // resize output size
  int offset = 0, size = 0;  // crop of the resize output (outside [0, full_out): zero padding)
  bool resized = false;
  bool antialias = true;  // the last resize's (torch's antialias=False: no filter widening)
  ResizeFilter filter = ResizeFilter::kBilinear;  // the last resize's

  // Source-to-output size ratio of the resize (> 1 when downscaling).
  double ratio() const { return (in1 - in0) / full_out; }
  AxisSpec spec() const {
    return AxisSpec{hi - lo,
                    static_cast<float>(in0),
                    static_cast<float>(in1),
                    full_out,
                    offset,
                    size,
                    antialias,
                    filter};
  }
};

struct GeometryPlan {
  AxisPlan x, y;
  bool flip = false;   // left-right
  bool vflip = false;  // top-bottom
};

// Draws the random parameters in transform order (torchvision's) and composes the transforms
// of stage kFused (transforms.h) of an image_width x image_height image. REQUIRES: every
// transform is of stage kFused or kOutput (the latter are skipped).
GeometryPlan plan_geometry(std::span<const Transform> transforms, int image_width, int image_height,
                           SampleRng& rng);

// The same plan in the coordinates of the image decoded at scale scale_num/8 (JPEG DCT scaling),
// whose size on this axis is scaled_size.
AxisPlan scale_axis(const AxisPlan& a, int scale_num, int scaled_size);

// The smallest DCT scale n/8, n in {1, 2, 4}, that keeps the decoded region at least min_ratio
// times the output on both axes; 8 when min_ratio <= 0 or no reduction qualifies, and for a
// bicubic resize (chosen to match PIL, as Hugging Face's image processors, exactly).
int choose_scale_num(const GeometryPlan& p, double min_ratio);

}  // namespace stoker::image::internal
