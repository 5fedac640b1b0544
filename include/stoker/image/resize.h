// PIL-equivalent bilinear and bicubic resizing of 8-bit RGB images.
//
// resize_rgb gives the same bytes as Pillow's
//   Image.resize((out_width, out_height), Image.BILINEAR or Image.BICUBIC, box=(x0, y0, x1, y1))
// on an RGB image: a separable convolution with PIL's filter (triangle, support 1; or cubic with
// a = -0.5, support 2) widened by the downscale factor (antialiasing), PIL's fixed-point
// coefficients, horizontal pass then vertical pass, each rounded and clipped to 8 bits. The box is
// PIL's float source region; the filter may read pixels outside the box but inside the image, as
// PIL's does.
//
// Thread safety: reentrant. Ownership: spans are borrowed for the call.
#pragma once

#include <cstdint>
#include <span>

namespace stoker::image {

struct ResizeBox {
  float x0, y0, x1, y1;
};

// PIL's resampling filters that resize_rgb (and the pipeline's Resize, RandomResizedCrop) offer.
enum class ResizeFilter { kBilinear, kBicubic };

// src: height rows of 3 * width bytes; dst: out_height rows of 3 * out_width bytes.
// Throws InvalidArgument when a size is not positive, a span is too small, or the box is not
// inside the image with x0 < x1, y0 < y1 (PIL's rules).
void resize_rgb(std::span<const uint8_t> src, int width, int height, ResizeBox box, int out_width,
                int out_height, std::span<uint8_t> dst, ResizeFilter filter);

inline void resize_bilinear(std::span<const uint8_t> src, int width, int height, ResizeBox box,
                            int out_width, int out_height, std::span<uint8_t> dst) {
  resize_rgb(src, width, height, box, out_width, out_height, dst, ResizeFilter::kBilinear);
}

}  // namespace stoker::image
