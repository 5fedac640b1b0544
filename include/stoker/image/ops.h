// torchvision.transforms.v2's image kernels on 8-bit RGB, for the pipeline's image
// stage (the operations that run on the decoded, cropped and resized image before it is written
// to the batch: colour, auto-augment, blur, padding, affine warps).
//
// Each function computes what v2's kernel computes for a uint8 image tensor (the `*_image`
// kernels of torchvision/transforms/v2/functional/) on the same pixels and parameters: the same
// float32 arithmetic and the same rounding (`.to(torch.uint8)` truncates toward zero,
// `.round_()` rounds half to even), so that the output agrees with torchvision within a mean
// absolute difference <= 1 of 255, and for most operations exactly. tests/python/
// test_vision_color_ops.py and test_vision_warp_ops.py check every one against torchvision.
//
// Images are interleaved RGB (HWC), 3 channels; torchvision's CHW tensor is another layout of the
// same pixels. Parameters are validated by the transforms that draw them (transforms.h), not here:
// REQUIRES below states what a caller must pass.
//
// Thread safety: reentrant. An OpScratch is per thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "stoker/image/augment.h"

namespace stoker::image::internal {

// A view of an 8-bit RGB image: pixel (x, y) at row(y) + 3 * x.
struct RgbView {
  uint8_t* data = nullptr;
  int height = 0, width = 0;
  size_t stride = 0;  // bytes from one row to the next, >= 3 * width

  uint8_t* row(int y) const { return data + static_cast<size_t>(y) * stride; }
};

// An RGB image the pipeline owns between operations; its storage is kept and reused.
class RgbImage {
 public:
  // Makes the image height x width (rows packed: stride 3 * width); contents unspecified.
  void reset(int height, int width) {
    height_ = height;
    width_ = width;
    pixels_.resize(static_cast<size_t>(height) * width * 3);
  }
  RgbView view() { return {pixels_.data(), height_, width_, static_cast<size_t>(width_) * 3}; }
  int height() const { return height_; }
  int width() const { return width_; }

 private:
  std::vector<uint8_t> pixels_;
  int height_ = 0, width_ = 0;
};

// Working memory that operations reuse from one image to the next (one per thread): warm, an
// operation allocates nothing.
struct OpScratch {
  std::vector<float> f;        // float planes (blur, sharpness, hue)
  std::vector<uint8_t> bytes;  // a copy of image rows
};

// The transforms' own types (augment.h): Interpolation {kNearest, kBilinear}; Fill, none
// (grid_sample's zero padding, no mask channel) or one value per channel (v2 keeps it as float;
// the result is rounded when written); PadMode {kConstant, kEdge, kReflect, kSymmetric}.
using image::Fill;
using image::Interpolation;
using image::PadMode;

// --- Colour and tone (color_ops.cc), in place ------------------------------------------------

// F.adjust_brightness. REQUIRES: factor >= 0.
void adjust_brightness(RgbView img, double factor);
// F.adjust_contrast (blend with the mean of the floored grayscale). REQUIRES: factor >= 0.
void adjust_contrast(RgbView img, double factor);
// F.adjust_saturation (blend with the floored grayscale). REQUIRES: factor >= 0.
void adjust_saturation(RgbView img, double factor);
// F.adjust_hue (through HSV in float32). REQUIRES: -0.5 <= hue_factor <= 0.5.
void adjust_hue(RgbView img, double hue_factor, OpScratch& scratch);
// F.adjust_sharpness (3x3 smoothing kernel, border pixels kept). REQUIRES: factor >= 0.
void adjust_sharpness(RgbView img, double factor, OpScratch& scratch);
// F.rgb_to_grayscale(num_output_channels=3): every channel holds the luma.
void rgb_to_grayscale(RgbView img);
// F.posterize. REQUIRES: 0 <= bits <= 8.
void posterize(RgbView img, int bits);
// F.solarize: values >= threshold inverted. REQUIRES: 0 <= threshold <= 255.
void solarize(RgbView img, double threshold);
// F.autocontrast: each channel stretched to [0, 255].
void autocontrast(RgbView img);
// F.equalize: each channel's histogram equalized.
void equalize(RgbView img);
// F.invert.
void invert(RgbView img);
// F.gaussian_blur(kernel_size=[kernel_width, kernel_height], sigma=[sigma_x, sigma_y]), reflect
// padding. REQUIRES: kernel sizes odd and positive, sigmas > 0. Throws InvalidArgument, as
// torchvision raises, when half a kernel is not smaller than the image's side it runs along.
void gaussian_blur(RgbView img, int kernel_width, int kernel_height, double sigma_x,
                   double sigma_y, OpScratch& scratch);

// --- Geometry (warp.cc): dst and src must not overlap ----------------------------------------

// F.affine(img, angle, translate, scale, shear, interpolation, fill, center); center nullopt is
// the image centre. Angles and shears in degrees. REQUIRES: dst the size of src, scale > 0.
void affine(RgbView src, RgbView dst, double angle, std::array<double, 2> translate, double scale,
            std::array<double, 2> shear, Interpolation interpolation, const Fill& fill,
            std::optional<std::array<double, 2>> center = std::nullopt);
// F.rotate(img, angle, interpolation, expand=False, center, fill). REQUIRES: dst the size of src.
void rotate(RgbView src, RgbView dst, double angle, Interpolation interpolation, const Fill& fill,
            std::optional<std::array<double, 2>> center = std::nullopt);
// F.pad(img, [left, top, right, bottom], fill, padding_mode). REQUIRES: paddings >= 0; dst of
// (top + height + bottom) x (left + width + right); for kReflect each padding < the side it
// mirrors (torch's rule), for kSymmetric <= it.
void pad(RgbView src, RgbView dst, int left, int top, int right, int bottom, PadMode mode,
         std::array<uint8_t, 3> fill);

}  // namespace stoker::image::internal
