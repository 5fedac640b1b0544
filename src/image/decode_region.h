// Internal: decoding of a sub-rectangle of an image, optionally DCT-scaled (JPEG only).
//
// A DecodeScratch keeps buffers and decoder state between calls; one thread at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "stoker/image/decode.h"

namespace stoker::image::internal {

// Half-open pixel rectangle [x0, x1) x [y0, y1).
struct Rect {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  int width() const { return x1 - x0; }
  int height() const { return y1 - y0; }
};

// Size of an image dimension decoded at scale scale_num/8 (libjpeg's jdiv_round_up).
constexpr int scaled_size(int size, int scale_num) {
  return static_cast<int>((static_cast<int64_t>(size) * scale_num + 7) / 8);
}

class JpegContext;  // libjpeg state, reused between calls

struct DecodeScratch {
  DecodeScratch();
  ~DecodeScratch();
  DecodeScratch(DecodeScratch&&) noexcept;
  DecodeScratch& operator=(DecodeScratch&&) noexcept;

  std::vector<uint8_t> pixels;  // decoded RGB region
  std::vector<uint8_t> row;     // one source row (CMYK or PNG) before conversion
  std::unique_ptr<JpegContext> jpeg;
};

// Decoded pixels of `rect` (a superset of what was asked), in the coordinate system of the image
// scaled by scale_num/8. Points into DecodeScratch::pixels.
struct DecodedRegion {
  Rect rect;
  const uint8_t* rgb = nullptr;
  size_t stride = 0;  // bytes between rows
};

// REQUIRES: `want` lies inside the scaled image and is not empty; scale_num in [1, 8]; scale_num
// is 8 for PNG. Throws DecodeError as decode() does.
DecodedRegion decode_region(std::span<const std::byte> bytes, const ImageInfo& info,
                            uint64_t max_pixels, int scale_num, Rect want, DecodeScratch& scratch);

ImageInfo read_info(std::span<const std::byte> bytes, uint64_t max_pixels, DecodeScratch& scratch);

// Per-format entry points used by the dispatchers above.
ImageInfo jpeg_read_info(std::span<const std::byte> bytes, uint64_t max_pixels, JpegContext& ctx);
DecodedRegion jpeg_decode_region(std::span<const std::byte> bytes, uint64_t max_pixels,
                                 int scale_num, Rect want, DecodeScratch& scratch);
ImageInfo png_read_info(std::span<const std::byte> bytes, uint64_t max_pixels);
DecodedRegion png_decode_region(std::span<const std::byte> bytes, uint64_t max_pixels, Rect want,
                                DecodeScratch& scratch);

// Throws DecodeError naming the size and the limit when width * height > max_pixels.
void check_pixel_limit(uint64_t width, uint64_t height, uint64_t max_pixels);

}  // namespace stoker::image::internal
