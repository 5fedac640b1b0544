// PNG decoding through libpng.
//
// libpng reports errors through png_error, which longjmps to png_jmpbuf. As in jpeg.cc, the
// functions that call setjmp hold no objects with destructors; buffers are sized between them.
#include <png.h>

#include <csetjmp>
#include <cstring>
#include <string>

#include "decode_region.h"
#include "stoker/errors.h"

namespace stoker::image::internal {
namespace {

struct Source {
  const uint8_t* data;
  size_t size;
  size_t pos;
  char message[256];
};

void read_fn(png_structp png, png_bytep out, size_t n) {
  auto* src = static_cast<Source*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "truncated file (unexpected end of data)");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

[[noreturn]] void error_fn(png_structp png, png_const_charp msg) {
  auto* src = static_cast<Source*>(png_get_error_ptr(png));
  std::snprintf(src->message, sizeof src->message, "%s", msg);
  png_longjmp(png, 1);
}

// Warnings (bad ancillary chunks such as a wrong sRGB profile) leave the pixels intact.
void warning_fn(png_structp, png_const_charp) {}

}  // namespace

// Owns the libpng structs of one image; destroyed outside the setjmp frames. libpng has no way
// to reset a read struct for the next image, so each image gets its own (the pixel buffers are
// the RegionDecoder's and are reused).
class PngReader {
 public:
  PngReader(std::span<const std::byte> bytes, Alpha alpha)
      : src_{reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), 0, {}}, alpha_(alpha) {
    png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, &src_, error_fn, warning_fn);
    if (png_) info_ = png_create_info_struct(png_);
    if (!png_ || !info_) throw DecodeError("PNG: out of memory creating the decoder");
    png_set_read_fn(png_, &src_, read_fn);
    // Our own limit is checked after the header; libpng's must not reject first.
    png_set_user_limits(png_, 0x7fffffff, 0x7fffffff);
  }
  ~PngReader() { png_destroy_read_struct(&png_, &info_, nullptr); }
  PngReader(const PngReader&) = delete;
  PngReader& operator=(const PngReader&) = delete;

  png_structp png() { return png_; }
  png_infop info() { return info_; }
  Alpha alpha() const { return alpha_; }
  [[noreturn]] void fail() const { throw DecodeError(std::string("PNG: ") + src_.message); }

 private:
  Source src_;
  Alpha alpha_;
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
};

void PngReaderDeleter::operator()(PngReader* r) const { delete r; }

namespace {

struct Header {
  png_uint_32 width, height;
  int bit_depth, color_type, interlace;
};

bool read_header(PngReader& r, Header& h) {
  png_structp png = r.png();
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_info(png, r.info());
  png_get_IHDR(png, r.info(), &h.width, &h.height, &h.bit_depth, &h.color_type, &h.interlace,
               nullptr, nullptr);
  return true;
}

// Whether the rows are read as RGBA and composited on white: Alpha::kOverWhite and an image with
// transparency (transformers' test: an alpha band, or PIL's "transparency" info from tRNS).
bool over_white(PngReader& r, const Header& h) {
  return r.alpha() == Alpha::kOverWhite &&
         ((h.color_type & PNG_COLOR_MASK_ALPHA) || png_get_valid(r.png(), r.info(), PNG_INFO_tRNS));
}

// Transformations to 8-bit RGB the way PIL's convert("RGB") sees the image, or to 8-bit RGBA
// the way its convert("RGBA") does (tRNS becoming alpha, as PIL's palette alphas and
// transparent colour do) when `rgba`.
bool set_8bit(PngReader& r, const Header& h, bool rgba, int& passes, size_t& rowbytes) {
  png_structp png = r.png();
  if (setjmp(png_jmpbuf(png))) return false;
  if (h.color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (h.color_type == PNG_COLOR_TYPE_GRAY && h.bit_depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  const bool trns = png_get_valid(png, r.info(), PNG_INFO_tRNS) != 0;
  if (rgba && trns) png_set_tRNS_to_alpha(png);
  if (h.bit_depth == 16) png_set_strip_16(png);
  // A palette's expansion adds tRNS alphas by itself; stripped too.
  if (!rgba && ((h.color_type & PNG_COLOR_MASK_ALPHA) || trns)) png_set_strip_alpha(png);
  if (!(h.color_type & PNG_COLOR_MASK_COLOR)) png_set_gray_to_rgb(png);
  passes = png_set_interlace_handling(png);
  png_read_update_info(png, r.info());
  rowbytes = png_get_rowbytes(png, r.info());
  return true;
}

// n RGBA pixels composited over opaque white into RGB: PIL's alpha_composite
// (libImaging/AlphaComposite.c, 7 fractional bits), whose coefficients over an opaque white
// reduce to a * 128 and (255 - a) * 128, then convert("RGB"). `out` may be `rgba` itself: pixel
// i is read whole before its 3 bytes are written, below pixel i + 1's.
void composite_over_white(const uint8_t* rgba, size_t n, uint8_t* out) {
  for (size_t i = 0; i < n; ++i, rgba += 4, out += 3) {
    const uint32_t a = rgba[3];
    const uint32_t white = 255 * (255 - a) * 128 + (0x80 << 7);
    uint8_t px[3];
    for (int c = 0; c < 3; ++c) {
      const uint32_t t = rgba[c] * a * 128 + white;
      px[c] = static_cast<uint8_t>((((t >> 8) + t) >> 8) >> 7);  // rounded / 255, then / 128
    }
    std::memcpy(out, px, 3);
  }
}

// Non-interlaced: rows arrive in order, so keep only the wanted ones and stop after the last.
bool read_rows(PngReader& r, Rect want, int channels, uint8_t* row, uint8_t* out) {
  png_structp png = r.png();
  if (setjmp(png_jmpbuf(png))) return false;
  const size_t n = static_cast<size_t>(want.width()) * 3;
  for (int y = 0; y < want.y1; ++y) {
    png_read_row(png, row, nullptr);
    if (y < want.y0) continue;
    const uint8_t* from = row + static_cast<size_t>(want.x0) * channels;
    if (channels == 4) {
      composite_over_white(from, static_cast<size_t>(want.width()), out + (y - want.y0) * n);
    } else {
      std::memcpy(out + (y - want.y0) * n, from, n);
    }
  }
  return true;
}

// Interlaced: every pass touches every row, so decode the whole image.
bool read_image(PngReader& r, png_bytepp rows) {
  png_structp png = r.png();
  if (setjmp(png_jmpbuf(png))) return false;
  png_read_image(png, rows);
  return true;
}

}  // namespace

std::unique_ptr<PngReader, PngReaderDeleter> png_open(std::span<const std::byte> bytes,
                                                      uint64_t max_pixels, Alpha alpha,
                                                      ImageInfo& info) {
  std::unique_ptr<PngReader, PngReaderDeleter> r(new PngReader(bytes, alpha));
  Header h{};
  if (!read_header(*r, h)) r->fail();
  check_pixel_limit(h.width, h.height, max_pixels);
  info = ImageInfo{static_cast<int>(h.width), static_cast<int>(h.height), ImageFormat::kPng};
  return r;
}

DecodedRegion png_decode(PngReader& r, Rect want, std::vector<uint8_t>& pixels,
                         std::vector<uint8_t>& row, std::vector<uint8_t*>& rows) {
  Header h{};
  png_get_IHDR(r.png(), r.info(), &h.width, &h.height, &h.bit_depth, &h.color_type, &h.interlace,
               nullptr, nullptr);
  int passes = 1;
  size_t rowbytes = 0;
  const bool rgba = over_white(r, h);
  const int channels = rgba ? 4 : 3;
  if (!set_8bit(r, h, rgba, passes, rowbytes)) r.fail();
  if (rowbytes != static_cast<size_t>(h.width) * channels) {
    throw DecodeError(std::string("PNG: unexpected row size after conversion to ") +
                      (rgba ? "RGBA" : "RGB"));
  }
  if (passes == 1) {
    row.resize(rowbytes);
    pixels.resize(static_cast<size_t>(want.width()) * 3 * want.height());
    if (!read_rows(r, want, channels, row.data(), pixels.data())) r.fail();
    return DecodedRegion{want, pixels.data(), static_cast<size_t>(want.width()) * 3};
  }
  pixels.resize(rowbytes * h.height);
  rows.resize(h.height);
  for (png_uint_32 y = 0; y < h.height; ++y) rows[y] = pixels.data() + y * rowbytes;
  if (!read_image(r, rows.data())) r.fail();
  const Rect all{0, 0, static_cast<int>(h.width), static_cast<int>(h.height)};
  if (rgba) {  // packed in place into RGB rows
    const size_t n = static_cast<size_t>(h.width) * h.height;
    composite_over_white(pixels.data(), n, pixels.data());
    pixels.resize(n * 3);
    return DecodedRegion{all, pixels.data(), static_cast<size_t>(h.width) * 3};
  }
  return DecodedRegion{all, pixels.data(), rowbytes};
}

}  // namespace stoker::image::internal
