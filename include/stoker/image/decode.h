// Image decoding to 8-bit RGB (JPEG via libjpeg-turbo, PNG via libpng).
//
// Contract:
// - Output is always 8-bit interleaved RGB with packed rows (stride 3 * width), the pixels that
//   torchvision's ImageFolder loader gets from PIL's `Image.open(f).convert("RGB")`: gray is
//   replicated, alpha is dropped (not composited), CMYK/YCCK is converted as PIL does (Adobe
//   inverted CMYK included), 16-bit samples keep their high byte.
// - Thread safety: every function is reentrant; threads may decode concurrently.
// - Ownership: input bytes are borrowed for the duration of the call only.
// - Errors: any bad input (empty, unknown format, corrupt, truncated, larger than `max_pixels`)
//   throws stoker::DecodeError with the decoder's message. Nothing is printed, nothing exits.
//   The pixel limit is checked from the header, before any pixel buffer is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace stoker::image {

enum class ImageFormat { kJpeg, kPng };

// PIL's Image.MAX_IMAGE_PIXELS.
inline constexpr uint64_t kDefaultMaxPixels = 89'478'485;

struct ImageInfo {
  int width = 0;
  int height = 0;
  ImageFormat format = ImageFormat::kJpeg;
};

struct DecodedImage {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> rgb;  // height rows of 3 * width bytes
};

// The format from the magic bytes. Throws DecodeError "unsupported image format (...)".
ImageFormat sniff(std::span<const std::byte> bytes);

// Width and height from the header only (no pixel decoding). Throws DecodeError when the header
// is bad or width * height > max_pixels.
ImageInfo read_info(std::span<const std::byte> bytes, uint64_t max_pixels = kDefaultMaxPixels);

// The whole image as RGB.
DecodedImage decode(std::span<const std::byte> bytes, uint64_t max_pixels = kDefaultMaxPixels);

}  // namespace stoker::image
