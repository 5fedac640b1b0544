// Image decoding to 8-bit RGB (JPEG via libjpeg-turbo, PNG via libpng).
//
// Contract:
// - Output is always 8-bit interleaved RGB with packed rows (stride 3 * width), the pixels that
//   torchvision's ImageFolder loader gets from PIL's `Image.open(f).convert("RGB")`: gray is
//   replicated, alpha is dropped (not composited), CMYK/YCCK is converted as PIL does (Adobe
//   inverted CMYK included), 16-bit samples keep their high byte. With Alpha::kOverWhite,
//   transparency is composited on white instead, as Hugging Face's image processors see it.
// - Thread safety: the free functions are reentrant; threads may decode concurrently. A Decoder
//   is used by one thread at a time (one per worker thread).
// - Ownership: input bytes are borrowed for the duration of the call only.
// - Errors: any bad input (empty, unknown format, corrupt, truncated, larger than `max_pixels`)
//   throws stoker::DecodeError with the decoder's message. Nothing is printed, nothing exits.
//   The pixel limit is checked from the header, before any pixel buffer is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace stoker::image {

enum class ImageFormat { kJpeg, kPng };

// What becomes of a PNG's transparency: an alpha channel, or a tRNS chunk (palette alphas or a
// transparent colour).
enum class Alpha : uint8_t {
  // PIL's convert("RGB"), torchvision's loader: the colours stay, the alpha is ignored.
  kDrop,
  // PIL's alpha_composite over opaque white, then convert("RGB"): transformers' convert_to_rgb,
  // which every Hugging Face image processor runs first. Bit-identical to it.
  kOverWhite,
};

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

namespace internal {
class RegionDecoder;
}

// Decoder state kept from one image to the next: the libjpeg context (created once, reset
// between images and after a failed one) and the buffers. Decoding many images with one Decoder
// allocates nothing of ours once its buffers have grown (the codecs still allocate their
// per-image state). A failed image leaves the Decoder usable for the next one.
class Decoder {
 public:
  Decoder();
  ~Decoder();
  Decoder(Decoder&&) noexcept;
  Decoder& operator=(Decoder&&) noexcept;

  // As the free functions below.
  ImageInfo read_info(std::span<const std::byte> bytes, uint64_t max_pixels = kDefaultMaxPixels);
  // The whole image into `out`, whose buffer is reused.
  void decode(std::span<const std::byte> bytes, DecodedImage& out,
              uint64_t max_pixels = kDefaultMaxPixels, Alpha alpha = Alpha::kDrop);

 private:
  std::unique_ptr<internal::RegionDecoder> impl_;
};

// The format from the magic bytes. Throws DecodeError "unsupported image format (...)".
ImageFormat sniff(std::span<const std::byte> bytes);

// Width and height from the header only (no pixel decoding). Throws DecodeError when the header
// is bad or width * height > max_pixels.
ImageInfo read_info(std::span<const std::byte> bytes, uint64_t max_pixels = kDefaultMaxPixels);

// The whole image as RGB (a Decoder used once).
DecodedImage decode(std::span<const std::byte> bytes, uint64_t max_pixels = kDefaultMaxPixels,
                    Alpha alpha = Alpha::kDrop);

}  // namespace stoker::image
