// JPEG decoding through libjpeg-turbo's libjpeg API.
//
// libjpeg reports errors by calling error_exit, which must not return: we longjmp back to the
// setjmp in the calling function. Functions that call setjmp hold no objects with destructors, so
// the longjmp skips no C++ cleanup; buffers are sized before entering them.
#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>

#include "decode_region.h"
#include "libjpeg.h"
#include "stoker/errors.h"

namespace stoker::image::internal {
namespace {

struct ErrorMgr {
  jpeg_error_mgr pub;
  std::jmp_buf jmp;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorMgr*>(cinfo->err);
  cinfo->err->format_message(cinfo, err->message);
  std::longjmp(err->jmp, 1);
}

// Warnings that leave the image data intact (PIL decodes such files without complaint).
bool harmless_warning(int code) {
  return code == JWRN_EXTRANEOUS_DATA || code == JWRN_ADOBE_XFORM || code == JWRN_JFIF_MAJOR ||
         code == JWRN_BOGUS_ICC;
}

// libjpeg would print warnings and go on with made-up data (a truncated file decodes as gray
// bottom rows); such data must not reach training, so the warning becomes an error.
void on_message(j_common_ptr cinfo, int level) {
  if (level < 0 && !harmless_warning(cinfo->err->msg_code)) on_error(cinfo);
}

void on_output(j_common_ptr) {}  // never print

}  // namespace

class JpegContext {
 public:
  JpegContext() {
    cinfo_.err = jpeg_std_error(&err_.pub);
    err_.pub.error_exit = on_error;
    err_.pub.emit_message = on_message;
    err_.pub.output_message = on_output;
    if (setjmp(err_.jmp)) throw DecodeError(std::string("libjpeg: ") + err_.message);
    jpeg_create_decompress(&cinfo_);
  }
  ~JpegContext() { jpeg_destroy_decompress(&cinfo_); }
  JpegContext(const JpegContext&) = delete;
  JpegContext& operator=(const JpegContext&) = delete;

  jpeg_decompress_struct& cinfo() { return cinfo_; }
  ErrorMgr& err() { return err_; }

  // A fresh decompressor for the next image (0.2 us). libjpeg keeps quantization and Huffman
  // tables from one image to the next (for abbreviated datastreams): a file without its own
  // DQT or DHT would decode with the previous image's tables on a reused context, and fail or
  // use the standard tables on a fresh one, so its pixels, or whether it fails, would depend on
  // what the thread decoded before (found by fuzz/fuzz_jpeg). False if libjpeg cannot allocate.
  bool renew() {
    jpeg_destroy_decompress(&cinfo_);
    cinfo_ = {};
    cinfo_.err = &err_.pub;
    if (setjmp(err_.jmp)) return false;
    jpeg_create_decompress(&cinfo_);
    return true;
  }

  // After a failed protected call: resets libjpeg for the next image, throws the message.
  [[noreturn]] void fail() {
    jpeg_abort_decompress(&cinfo_);
    throw DecodeError(std::string("JPEG: ") + err_.message);
  }

 private:
  jpeg_decompress_struct cinfo_{};
  ErrorMgr err_{};
};

DecodeScratch::DecodeScratch() : jpeg(std::make_unique<JpegContext>()) {}
DecodeScratch::~DecodeScratch() = default;
DecodeScratch::DecodeScratch(DecodeScratch&&) noexcept = default;
DecodeScratch& DecodeScratch::operator=(DecodeScratch&&) noexcept = default;

namespace {

bool read_header(JpegContext& ctx, std::span<const std::byte> bytes) {
  if (!ctx.renew()) return false;
  jpeg_decompress_struct& cinfo = ctx.cinfo();
  if (setjmp(ctx.err().jmp)) return false;
  jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(bytes.data()),
               static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  return true;
}

// Header, pixel limit and colour space checks; leaves cinfo after jpeg_read_header.
ImageInfo start(JpegContext& ctx, std::span<const std::byte> bytes, uint64_t max_pixels) {
  if (!read_header(ctx, bytes)) ctx.fail();
  const jpeg_decompress_struct& c = ctx.cinfo();
  try {
    check_pixel_limit(c.image_width, c.image_height, max_pixels);
  } catch (...) {
    jpeg_abort_decompress(&ctx.cinfo());
    throw;
  }
  switch (c.jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
    case JCS_CMYK:
    case JCS_YCCK:
      break;
    default:
      jpeg_abort_decompress(&ctx.cinfo());
      throw DecodeError("JPEG: unsupported colour space " + std::to_string(c.jpeg_color_space));
  }
  return ImageInfo{static_cast<int>(c.image_width), static_cast<int>(c.image_height),
                   ImageFormat::kJpeg};
}

// PIL's CMYK -> RGB: r = nk - nk * c / 255 (rounded), nk = 255 - k. Photoshop (Adobe marker)
// writes inverted CMYK, which PIL reads as "CMYK;I".
void cmyk_to_rgb(const uint8_t* in, uint8_t* out, int n, bool inverted) {
  const int flip = inverted ? 255 : 0;
  for (int x = 0; x < n; ++x, in += 4, out += 3) {
    const int nk = 255 - (in[3] ^ flip);
    for (int ch = 0; ch < 3; ++ch) {
      const int t = (in[ch] ^ flip) * nk + 128;
      out[ch] = static_cast<uint8_t>(nk - (((t >> 8) + t) >> 8));
    }
  }
}

struct RegionJob {
  int scale_num;
  Rect want;
  uint8_t* pixels;    // want.height() rows of capacity >= 3 * scaled width
  uint8_t* cmyk_row;  // 4 * scaled width bytes, for CMYK images
  Rect got;           // out: what was decoded
};

bool decode_rows(JpegContext& ctx, RegionJob& job) {
  jpeg_decompress_struct& cinfo = ctx.cinfo();
  if (setjmp(ctx.err().jmp)) return false;
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  cinfo.scale_num = static_cast<unsigned>(job.scale_num);
  cinfo.scale_denom = 8;
  jpeg_start_decompress(&cinfo);
  // Columns: libjpeg widens the request to iMCU boundaries and tells us where it starts. Chroma
  // upsampling treats the crop's edges as image edges, so ask for a margin and drop it.
  const int margin = 8;
  const int ask0 = std::max(0, job.want.x0 - margin);
  const int ask1 = std::min(static_cast<int>(cinfo.output_width), job.want.x1 + margin);
  JDIMENSION x0 = static_cast<JDIMENSION>(ask0);
  JDIMENSION width = static_cast<JDIMENSION>(ask1 - ask0);
  if (width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &x0, &width);
  job.got = Rect{static_cast<int>(x0), job.want.y0, static_cast<int>(x0 + cinfo.output_width),
                 job.want.y1};
  const size_t stride = static_cast<size_t>(cinfo.output_width) * 3;
  if (job.want.y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(job.want.y0));
  while (cinfo.output_scanline < static_cast<JDIMENSION>(job.want.y1)) {
    uint8_t* dst = job.pixels + (cinfo.output_scanline - job.want.y0) * stride;
    JSAMPROW row = cmyk ? job.cmyk_row : dst;
    jpeg_read_scanlines(&cinfo, &row, 1);
    if (cmyk) {
      cmyk_to_rgb(job.cmyk_row, dst, static_cast<int>(cinfo.output_width), cinfo.saw_Adobe_marker);
    }
  }
  // A full decode reads to EOI (so truncation after the last row is caught); a partial one stops
  // after the last needed row.
  if (cinfo.output_scanline == cinfo.output_height) {
    jpeg_finish_decompress(&cinfo);
  } else {
    jpeg_abort_decompress(&cinfo);
  }
  return true;
}

}  // namespace

ImageInfo jpeg_read_info(std::span<const std::byte> bytes, uint64_t max_pixels, JpegContext& ctx) {
  const ImageInfo info = start(ctx, bytes, max_pixels);
  jpeg_abort_decompress(&ctx.cinfo());
  return info;
}

DecodedRegion jpeg_decode_region(std::span<const std::byte> bytes, uint64_t max_pixels,
                                 int scale_num, Rect want, DecodeScratch& scratch) {
  if (!scratch.jpeg) scratch.jpeg = std::make_unique<JpegContext>();
  JpegContext& ctx = *scratch.jpeg;
  const ImageInfo info = start(ctx, bytes, max_pixels);
  const size_t scaled_w = static_cast<size_t>(scaled_size(info.width, scale_num));
  try {
    scratch.pixels.resize(scaled_w * 3 * static_cast<size_t>(want.height()));
    scratch.row.resize(scaled_w * 4);
  } catch (...) {
    jpeg_abort_decompress(&ctx.cinfo());
    throw;
  }
  RegionJob job{scale_num, want, scratch.pixels.data(), scratch.row.data(), {}};
  if (!decode_rows(ctx, job)) ctx.fail();
  // Report only the wanted columns: the margin's edge columns are not PIL's pixels.
  const size_t stride = static_cast<size_t>(job.got.width()) * 3;
  const Rect valid{want.x0, want.y0, want.x1, want.y1};
  return DecodedRegion{valid, scratch.pixels.data() + (valid.x0 - job.got.x0) * 3, stride};
}

}  // namespace stoker::image::internal
