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

Decoder::Decoder() : impl_(std::make_unique<internal::RegionDecoder>()) {}
Decoder::~Decoder() = default;
Decoder::Decoder(Decoder&&) noexcept = default;
Decoder& Decoder::operator=(Decoder&&) noexcept = default;

ImageInfo Decoder::read_info(std::span<const std::byte> bytes, uint64_t max_pixels) {
  return impl_->open(bytes, max_pixels);
}

void Decoder::decode(std::span<const std::byte> bytes, DecodedImage& out, uint64_t max_pixels,
                     Alpha alpha) {
  const ImageInfo info = impl_->open(bytes, max_pixels, alpha);
  impl_->decode_all(out.rgb);
  out.width = info.width;
  out.height = info.height;
}

ImageInfo read_info(std::span<const std::byte> bytes, uint64_t max_pixels) {
  return Decoder().read_info(bytes, max_pixels);
}

DecodedImage decode(std::span<const std::byte> bytes, uint64_t max_pixels, Alpha alpha) {
  DecodedImage out;
  Decoder().decode(bytes, out, max_pixels, alpha);
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

RegionDecoder::RegionDecoder() = default;
RegionDecoder::~RegionDecoder() = default;
RegionDecoder::RegionDecoder(RegionDecoder&&) noexcept = default;
RegionDecoder& RegionDecoder::operator=(RegionDecoder&&) noexcept = default;

ImageInfo RegionDecoder::open(std::span<const std::byte> bytes, uint64_t max_pixels, Alpha alpha) {
  opened_ = false;
  png_.reset();
  bytes_ = bytes;
  if (sniff(bytes) == ImageFormat::kJpeg) {
    if (!jpeg_) jpeg_ = make_jpeg_context();
    info_ = jpeg_open(*jpeg_, bytes, max_pixels);
  } else {
    if (jpeg_) jpeg_reset(*jpeg_);
    png_ = png_open(bytes, max_pixels, alpha, info_);
  }
  opened_ = true;
  return info_;
}

DecodedRegion RegionDecoder::decode_into(int scale_num, Rect want, const JpegOptions& options,
                                         std::vector<uint8_t>& pixels) {
  if (!opened_) throw Error("RegionDecoder::decode without a successful open()");
  opened_ = false;  // one decode per open, whatever happens
  if (info_.format == ImageFormat::kJpeg) {
    return jpeg_decode(*jpeg_, scale_num, want, options, pixels, row_, rows_);
  }
  // The reader is done with after this image, also when it fails.
  const std::unique_ptr<PngReader, PngReaderDeleter> png = std::move(png_);
  return png_decode(*png, want, pixels, row_, rows_);
}

DecodedRegion RegionDecoder::decode(int scale_num, Rect want, const JpegOptions& options) {
  return decode_into(scale_num, want, options, pixels_);
}

void RegionDecoder::decode_all(std::vector<uint8_t>& out) {
  const Rect all{0, 0, info_.width, info_.height};
  const DecodedRegion r = decode_into(8, all, JpegOptions{}, out);
  // JPEG writes the full width in place; an interlaced or plain PNG too (region == image).
  if (r.rgb != out.data() || r.stride != static_cast<size_t>(info_.width) * 3) {
    throw Error("RegionDecoder::decode_all: the region is not the packed image");
  }
}

}  // namespace internal
}  // namespace stoker::image
