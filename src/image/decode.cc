// Format dispatch, the pixel limit and the public decode entry points.
#include "stoker/image/decode.h"

#include <cstdio>
#include <string>

#include "decode_region.h"
#include "stoker/errors.h"

namespace stoker::image {
namespace {

bool starts_with(std::span<const std::byte> b, std::initializer_list<uint8_t> magic) {
  if (b.size() < magic.size()) return false;
  size_t i = 0;
  for (uint8_t m : magic) {
    if (static_cast<uint8_t>(b[i++]) != m) return false;
  }
  return true;
}

}  // namespace

ImageFormat sniff(std::span<const std::byte> bytes) {
  if (starts_with(bytes, {0xFF, 0xD8, 0xFF})) return ImageFormat::kJpeg;
  if (starts_with(bytes, {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'})) return ImageFormat::kPng;
  if (bytes.empty()) throw DecodeError("unsupported image format (empty input)");
  // The first bytes let a user tell HTML error pages, WebP, GIF, ... apart.
  std::string hex;
  for (size_t i = 0; i < bytes.size() && i < 8; ++i) {
    char buf[4];
    std::snprintf(buf, sizeof buf, "%s%02x", i ? " " : "", static_cast<unsigned>(bytes[i]));
    hex += buf;
  }
  throw DecodeError("unsupported image format (first bytes: " + hex +
                    "); supported formats: JPEG, PNG");
}

ImageInfo read_info(std::span<const std::byte> bytes, uint64_t max_pixels) {
  internal::DecodeScratch scratch;
  return internal::read_info(bytes, max_pixels, scratch);
}

DecodedImage decode(std::span<const std::byte> bytes, uint64_t max_pixels) {
  internal::DecodeScratch scratch;
  const ImageInfo info = internal::read_info(bytes, max_pixels, scratch);
  const internal::Rect all{0, 0, info.width, info.height};
  const internal::DecodedRegion r =
      internal::decode_region(bytes, info, max_pixels, 8, all, scratch);
  DecodedImage out;
  out.width = info.width;
  out.height = info.height;
  out.rgb.resize(static_cast<size_t>(info.width) * info.height * 3);
  const size_t row_bytes = static_cast<size_t>(info.width) * 3;
  for (int y = 0; y < info.height; ++y) {
    const uint8_t* src = r.rgb + static_cast<size_t>(y - r.rect.y0) * r.stride +
                         static_cast<size_t>(0 - r.rect.x0) * 3;
    std::copy(src, src + row_bytes, out.rgb.data() + y * row_bytes);
  }
  return out;
}

namespace internal {

void check_pixel_limit(uint64_t width, uint64_t height, uint64_t max_pixels) {
  if (width == 0 || height == 0) {
    throw DecodeError("image has an empty size " + std::to_string(width) + "x" +
                      std::to_string(height));
  }
  if (width * height > max_pixels) {
    throw DecodeError("image size " + std::to_string(width) + "x" + std::to_string(height) + " (" +
                      std::to_string(width * height) + " pixels) exceeds the pixel limit of " +
                      std::to_string(max_pixels) + " pixels");
  }
}

ImageInfo read_info(std::span<const std::byte> bytes, uint64_t max_pixels, DecodeScratch& scratch) {
  if (sniff(bytes) == ImageFormat::kJpeg) {
    if (!scratch.jpeg) scratch = DecodeScratch();
    return jpeg_read_info(bytes, max_pixels, *scratch.jpeg);
  }
  return png_read_info(bytes, max_pixels);
}

DecodedRegion decode_region(std::span<const std::byte> bytes, const ImageInfo& info,
                            uint64_t max_pixels, int scale_num, Rect want, DecodeScratch& scratch) {
  if (info.format == ImageFormat::kJpeg) {
    return jpeg_decode_region(bytes, max_pixels, scale_num, want, scratch);
  }
  return png_decode_region(bytes, max_pixels, want, scratch);
}

}  // namespace internal
}  // namespace stoker::image
