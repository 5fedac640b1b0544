// Internal: decoding of a sub-rectangle of an image, optionally DCT-scaled (JPEG only).
//
// A RegionDecoder is the per-thread decoder state: the libjpeg context (created once, reset
// between images, also after an error) and the pixel buffers. open() parses the header once;
// decode() then decodes the rows and columns asked for. One thread at a time.
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

// How libjpeg turns coefficients into pixels. The defaults are PIL's (libjpeg's defaults), so
// that a full-size decode gives PIL's pixels.
struct JpegOptions {
  bool fast_idct = false;        // JDCT_IFAST instead of JDCT_ISLOW
  bool fancy_upsampling = true;  // triangle-filtered chroma instead of replicated (merged)
};

// Decoded pixels of `rect` (a superset of what was asked), in the coordinate system of the image
// scaled by scale_num/8. Points into the decoder's buffer, valid until its next call.
struct DecodedRegion {
  Rect rect;
  const uint8_t* rgb = nullptr;
  size_t stride = 0;  // bytes between rows
};

class JpegContext;  // libjpeg state, reused between images (jpeg.cc)
class PngReader;    // libpng state of the image being decoded (png.cc)
struct JpegContextDeleter {
  void operator()(JpegContext* c) const;
};
struct PngReaderDeleter {
  void operator()(PngReader* r) const;
};

class RegionDecoder {
 public:
  RegionDecoder();
  ~RegionDecoder();
  RegionDecoder(RegionDecoder&&) noexcept;
  RegionDecoder& operator=(RegionDecoder&&) noexcept;

  // Parses the header of `bytes`, which stay borrowed until decode() returns or the next open().
  // Throws DecodeError for an unknown format, a bad header or more than max_pixels pixels.
  // `alpha` says what a PNG's transparency becomes (JPEG has none).
  ImageInfo open(std::span<const std::byte> bytes, uint64_t max_pixels, Alpha alpha = Alpha::kDrop);

  // Decodes the opened image's pixels of `want`. REQUIRES: open() succeeded with no decode()
  // since; `want` lies inside the image scaled by scale_num/8 and is not empty; scale_num is in
  // [1, 16] (JPEG) or 8 (PNG). Throws DecodeError for bad data. A JPEG is read only to the last
  // row wanted (damage after it goes unnoticed) unless `want` reaches the last row.
  DecodedRegion decode(int scale_num, Rect want, const JpegOptions& options = {});

  // The whole opened image into `out` (height rows of 3 * width bytes), its capacity reused.
  void decode_all(std::vector<uint8_t>& out);

  ImageInfo info() const { return info_; }

 private:
  DecodedRegion decode_into(int scale_num, Rect want, const JpegOptions& options,
                            std::vector<uint8_t>& pixels);

  std::unique_ptr<JpegContext, JpegContextDeleter> jpeg_;  // created on the first JPEG
  std::unique_ptr<PngReader, PngReaderDeleter> png_;       // the opened PNG, until its decode ends
  std::span<const std::byte> bytes_;
  ImageInfo info_;
  bool opened_ = false;
  std::vector<uint8_t> pixels_;  // decoded region
  std::vector<uint8_t> row_;     // one source row (CMYK, PNG) before conversion
  std::vector<uint8_t*> rows_;   // row pointers handed to the codec
};

// Per-format halves of RegionDecoder (jpeg.cc, png.cc). `row` and `rows` are scratch.
std::unique_ptr<JpegContext, JpegContextDeleter> make_jpeg_context();
// Leaves the context after the header (and resets it first, whatever an earlier image left).
ImageInfo jpeg_open(JpegContext& ctx, std::span<const std::byte> bytes, uint64_t max_pixels);
// REQUIRES: jpeg_open succeeded. Leaves the context reset for the next image, also on error.
DecodedRegion jpeg_decode(JpegContext& ctx, int scale_num, Rect want, const JpegOptions& options,
                          std::vector<uint8_t>& pixels, std::vector<uint8_t>& row,
                          std::vector<uint8_t*>& rows);
// Forgets an opened image that will not be decoded.
void jpeg_reset(JpegContext& ctx);
std::unique_ptr<PngReader, PngReaderDeleter> png_open(std::span<const std::byte> bytes,
                                                      uint64_t max_pixels, Alpha alpha,
                                                      ImageInfo& info);
DecodedRegion png_decode(PngReader& r, Rect want, std::vector<uint8_t>& pixels,
                         std::vector<uint8_t>& row, std::vector<uint8_t*>& rows);

// Throws DecodeError naming the size and the limit when width * height > max_pixels.
void check_pixel_limit(uint64_t width, uint64_t height, uint64_t max_pixels);

}  // namespace stoker::image::internal
