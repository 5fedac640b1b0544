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
// The coefficient controller and input controller hooks (ScanCut below).
#include <jpegint.h>

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

void JpegContextDeleter::operator()(JpegContext* c) const { delete c; }

std::unique_ptr<JpegContext, JpegContextDeleter> make_jpeg_context() {
  return std::unique_ptr<JpegContext, JpegContextDeleter>(new JpegContext());
}

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

// Multi-scan (progressive) files: every scan covers the whole image, and libjpeg entropy-decodes
// all of them before the first row comes out. No scan's data below the region is needed, so once
// a scan reaches `stop_row` its rest is skipped: a byte search for the marker that ends it, no
// Huffman decoding. The rows kept (up to stop_row, which includes the iMCU row below the region
// that chroma upsampling reads) have every scan's coefficients, so their pixels are exactly
// those of a full decode.
struct ScanCut {
  int (*consume)(j_decompress_ptr);  // libjpeg's consume_data
  JDIMENSION stop_row;               // the first iMCU row no output row needs
};

// Moves the source to the marker that ends the current scan's entropy-coded data: the first
// 0xFF not followed by a stuffed 0x00, a fill 0xFF or a restart marker. At the end of the data
// when there is none (the marker reader then reports the file as truncated).
void skip_to_marker(jpeg_source_mgr* src) {
  const JOCTET* p = src->next_input_byte;
  const JOCTET* const end = p + src->bytes_in_buffer;
  for (;;) {
    p = static_cast<const JOCTET*>(std::memchr(p, 0xFF, static_cast<size_t>(end - p)));
    if (p == nullptr) {
      p = end;
      break;
    }
    const JOCTET* q = p + 1;
    while (q < end && *q == 0xFF) ++q;
    if (q == end) {
      p = end;
      break;
    }
    if (*q != 0x00 && (*q < 0xD0 || *q > 0xD7)) {
      p = q - 1;
      break;
    }
    p = q + 1;
  }
  src->bytes_in_buffer -= static_cast<size_t>(p - src->next_input_byte);
  src->next_input_byte = p;
}

int consume_cut(j_decompress_ptr cinfo) {
  const auto* cut = static_cast<const ScanCut*>(cinfo->client_data);
  if (cinfo->input_iMCU_row < cut->stop_row) return cut->consume(cinfo);
  // The entropy decoder stops at a marker it meets; then the source is already past it.
  if (cinfo->unread_marker == 0) skip_to_marker(cinfo->src);
  // As after a whole scan, so that the output side never waits for rows that will not come.
  cinfo->input_iMCU_row = cinfo->total_iMCU_rows;
  (*cinfo->inputctl->finish_input_pass)(cinfo);
  return JPEG_SCAN_COMPLETED;
}

struct RegionJob {
  int scale_num;
  Rect want;
  JpegOptions options;
  uint8_t* pixels;    // want.height() rows of capacity >= 3 * scaled width
  uint8_t* cmyk_row;  // 4 * scaled width bytes, for CMYK images
  uint8_t** rows;     // want.height() row pointers
  Rect got;           // out: what was decoded
};

bool decode_rows(JpegContext& ctx, RegionJob& job) {
  jpeg_decompress_struct& cinfo = ctx.cinfo();
  if (setjmp(ctx.err().jmp)) return false;
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  cinfo.scale_num = static_cast<unsigned>(job.scale_num);
  cinfo.scale_denom = 8;
  cinfo.dct_method = job.options.fast_idct ? JDCT_IFAST : JDCT_ISLOW;
  cinfo.do_fancy_upsampling = job.options.fancy_upsampling ? TRUE : FALSE;
  // Scaled height (jdiv_round_up, as libjpeg computes output_height).
  const long out_h = (static_cast<long>(cinfo.image_height) * job.scale_num + 7) / 8;
  const bool cut_scans = jpeg_has_multiple_scans(&cinfo) && job.want.y1 < out_h;
  ScanCut cut{nullptr, 0};
  if (cut_scans) {
    cinfo.buffered_image = TRUE;       // input is consumed by the loop below, not by start
    cinfo.do_block_smoothing = FALSE;  // only ever applies to incomplete coefficients anyway
  }
  jpeg_start_decompress(&cinfo);
  if (cut_scans) {
#if JPEG_LIB_VERSION >= 70
    const int dct_rows = cinfo.min_DCT_v_scaled_size;
#else
    const int dct_rows = cinfo.min_DCT_scaled_size;
#endif
    const JDIMENSION lines = static_cast<JDIMENSION>(cinfo.max_v_samp_factor * dct_rows);
    const JDIMENSION last = (static_cast<JDIMENSION>(job.want.y1) - 1) / lines;
    cut = ScanCut{cinfo.coef->consume_data, std::min(cinfo.total_iMCU_rows, last + 2)};
    cinfo.client_data = &cut;
    cinfo.coef->consume_data = consume_cut;  // later scans: start_input_pass installs this
    if (cinfo.inputctl->consume_input == cut.consume) cinfo.inputctl->consume_input = consume_cut;
    int status;
    do {
      status = jpeg_consume_input(&cinfo);
    } while (status != JPEG_REACHED_EOI && status != JPEG_SUSPENDED);
    cinfo.client_data = nullptr;
    if (status == JPEG_SUSPENDED) ERREXIT(&cinfo, JERR_INPUT_EMPTY);  // impossible in memory
    jpeg_start_output(&cinfo, cinfo.input_scan_number);
  }
  // Columns: libjpeg widens the request to iMCU boundaries and tells us where it starts. Chroma
  // upsampling treats the crop's edges as image edges, so ask for a margin and drop it.
  const int margin = 2;
  const int ask0 = std::max(0, job.want.x0 - margin);
  const int ask1 = std::min(static_cast<int>(cinfo.output_width), job.want.x1 + margin);
  JDIMENSION x0 = static_cast<JDIMENSION>(ask0);
  JDIMENSION width = static_cast<JDIMENSION>(ask1 - ask0);
  if (width < cinfo.output_width) jpeg_crop_scanline(&cinfo, &x0, &width);
  job.got = Rect{static_cast<int>(x0), job.want.y0, static_cast<int>(x0 + cinfo.output_width),
                 job.want.y1};
  const size_t stride = static_cast<size_t>(cinfo.output_width) * 3;
  const int n = job.want.height();
  for (int i = 0; i < n; ++i) job.rows[i] = job.pixels + i * stride;
  // Rows above the region: entropy-decoded only (no IDCT, upsampling or colour conversion).
  if (job.want.y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(job.want.y0));
  const JDIMENSION y1 = static_cast<JDIMENSION>(job.want.y1);
  if (cmyk) {
    while (cinfo.output_scanline < y1) {
      uint8_t* dst = job.rows[cinfo.output_scanline - job.want.y0];
      JSAMPROW row = job.cmyk_row;
      jpeg_read_scanlines(&cinfo, &row, 1);
      cmyk_to_rgb(job.cmyk_row, dst, static_cast<int>(cinfo.output_width), cinfo.saw_Adobe_marker);
    }
  } else {
    while (cinfo.output_scanline < y1) {
      const JDIMENSION done = cinfo.output_scanline - static_cast<JDIMENSION>(job.want.y0);
      jpeg_read_scanlines(&cinfo, job.rows + done, y1 - cinfo.output_scanline);
    }
  }
  // A full decode reads to EOI (so truncation after the last row is caught); a partial one stops
  // after the last needed row: the rows below are never entropy-decoded.
  if (cinfo.output_scanline == cinfo.output_height) {
    jpeg_finish_decompress(&cinfo);
  } else {
    jpeg_abort_decompress(&cinfo);
  }
  return true;
}

}  // namespace

ImageInfo jpeg_open(JpegContext& ctx, std::span<const std::byte> bytes, uint64_t max_pixels) {
  jpeg_abort_decompress(&ctx.cinfo());  // whatever the last image left behind
  return start(ctx, bytes, max_pixels);
}

void jpeg_reset(JpegContext& ctx) { jpeg_abort_decompress(&ctx.cinfo()); }

DecodedRegion jpeg_decode(JpegContext& ctx, int scale_num, Rect want, const JpegOptions& options,
                          std::vector<uint8_t>& pixels, std::vector<uint8_t>& row,
                          std::vector<uint8_t*>& rows) {
  const jpeg_decompress_struct& c = ctx.cinfo();
  const size_t scaled_w =
      static_cast<size_t>(scaled_size(static_cast<int>(c.image_width), scale_num));
  try {
    pixels.resize(scaled_w * 3 * static_cast<size_t>(want.height()));
    if (c.jpeg_color_space == JCS_CMYK || c.jpeg_color_space == JCS_YCCK) row.resize(scaled_w * 4);
    rows.resize(static_cast<size_t>(want.height()));
  } catch (...) {
    jpeg_abort_decompress(&ctx.cinfo());
    throw;
  }
  RegionJob job{scale_num, want, options, pixels.data(), row.data(), rows.data(), {}};
  if (!decode_rows(ctx, job)) ctx.fail();
  // Report only the wanted columns: the margin's edge columns are not PIL's pixels.
  const size_t stride = static_cast<size_t>(job.got.width()) * 3;
  return DecodedRegion{want, pixels.data() + (want.x0 - job.got.x0) * 3, stride};
}

}  // namespace stoker::image::internal
