#include "test_images.h"

#include <png.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "libjpeg.h"

namespace stoker::image::testing {

std::vector<uint8_t> pattern_rgb(int w, int h, int seed) {
  std::vector<uint8_t> v(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &v[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>((x * 255) / std::max(1, w - 1));
      p[1] = static_cast<uint8_t>((y * 255) / std::max(1, h - 1));
      p[2] = static_cast<uint8_t>(128 + 100 * std::sin((x + 2 * y + seed) * 0.11));
    }
  }
  return v;
}

std::vector<std::byte> encode_jpeg(const uint8_t* pixels, int w, int h, int components,
                                   const JpegParams& params) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);
  jpeg_create_compress(&cinfo);
  unsigned char* out = nullptr;
  unsigned long out_size = 0;
  jpeg_mem_dest(&cinfo, &out, &out_size);
  cinfo.image_width = w;
  cinfo.image_height = h;
  cinfo.input_components = components;
  cinfo.in_color_space = components == 1 ? JCS_GRAYSCALE : components == 3 ? JCS_RGB : JCS_CMYK;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, params.quality, TRUE);
  if (components == 4) {
    jpeg_set_colorspace(&cinfo, params.adobe ? JCS_YCCK : JCS_CMYK);
    cinfo.write_Adobe_marker = params.adobe;
  }
  if (!params.subsample) {
    for (int c = 0; c < cinfo.num_components; ++c) {
      cinfo.comp_info[c].h_samp_factor = 1;
      cinfo.comp_info[c].v_samp_factor = 1;
    }
  }
  if (params.progressive) jpeg_simple_progression(&cinfo);
  cinfo.restart_in_rows = params.restart_rows;
  std::vector<jpeg_scan_info> scans;
  if (params.non_interleaved && !params.progressive) {
    for (int c = 0; c < cinfo.num_components; ++c) {
      jpeg_scan_info scan{};
      scan.comps_in_scan = 1;
      scan.component_index[0] = c;
      scan.Ss = 0;
      scan.Se = 63;
      scans.push_back(scan);
    }
    cinfo.scan_info = scans.data();
    cinfo.num_scans = static_cast<int>(scans.size());
  }
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(pixels) + cinfo.next_scanline * w * components;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<std::byte> result(reinterpret_cast<std::byte*>(out),
                                reinterpret_cast<std::byte*>(out) + out_size);
  std::free(out);
  return result;
}

namespace {
void write_fn(png_structp png, png_bytep data, size_t n) {
  auto* out = static_cast<std::vector<std::byte>*>(png_get_io_ptr(png));
  const auto* p = reinterpret_cast<const std::byte*>(data);
  out->insert(out->end(), p, p + n);
}
void flush_fn(png_structp) {}
}  // namespace

std::vector<std::byte> encode_png(const uint8_t* rows, size_t rowbytes, int w, int h,
                                  int color_type, int bit_depth, bool interlace,
                                  std::span<const uint8_t> palette_rgb,
                                  std::span<const uint8_t> palette_alphas) {
  std::vector<std::byte> out;
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) std::abort();
  png_set_write_fn(png, &out, write_fn, flush_fn);
  png_set_IHDR(png, info, w, h, bit_depth, color_type,
               interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_color> pal;
  for (size_t i = 0; i + 2 < palette_rgb.size(); i += 3) {
    pal.push_back(png_color{palette_rgb[i], palette_rgb[i + 1], palette_rgb[i + 2]});
  }
  if (!pal.empty()) png_set_PLTE(png, info, pal.data(), static_cast<int>(pal.size()));
  if (!palette_alphas.empty()) {
    png_set_tRNS(png, info, palette_alphas.data(), static_cast<int>(palette_alphas.size()),
                 nullptr);
  }
  std::vector<png_bytep> row_ptrs(h);
  for (int y = 0; y < h; ++y) row_ptrs[y] = const_cast<uint8_t*>(rows) + y * rowbytes;
  png_set_rows(png, info, row_ptrs.data());
  png_write_png(png, info, PNG_TRANSFORM_IDENTITY, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

double mean_abs_diff(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += std::abs(int(a[i]) - int(b[i]));
  return a.empty() ? 0.0 : s / static_cast<double>(a.size());
}

int max_abs_diff(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  int m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(int(a[i]) - int(b[i])));
  return m;
}

std::vector<NamedFile> mixed_files() {
  const int w = 75, h = 53;
  const auto rgb = pattern_rgb(w, h, 9);
  std::vector<uint8_t> gray(w * h), cmyk(w * h * 4);
  for (int i = 0; i < w * h; ++i) gray[i] = rgb[i * 3];
  for (int i = 0; i < w * h * 4; ++i) cmyk[i] = static_cast<uint8_t>(rgb[i % (w * h * 3)] ^ i);
  const auto baseline = encode_jpeg(rgb.data(), w, h, 3, {.quality = 85, .subsample = true});
  const auto progressive =
      encode_jpeg(rgb.data(), w, h, 3, {.quality = 85, .progressive = true, .subsample = true});
  // Damage right after the scan header, so that every crop, however high, needs the damaged
  // bytes (a crop is decoded only down to its last row).
  size_t sos = 0;
  while (sos + 1 < baseline.size() &&
         !(baseline[sos] == std::byte{0xFF} && baseline[sos + 1] == std::byte{0xDA}))
    ++sos;
  auto corrupt_body = baseline;
  for (size_t i = sos + 16; i < sos + 48 && i < corrupt_body.size(); ++i)
    corrupt_body[i] = std::byte{0xFF};
  auto corrupt_header = baseline;
  for (size_t i = 0; i + 9 < corrupt_header.size(); ++i) {
    if (corrupt_header[i] == std::byte{0xFF} && corrupt_header[i + 1] == std::byte{0xC0}) {
      corrupt_header[i + 9] = std::byte{0};  // SOF0 with no components
      break;
    }
  }
  const auto png = encode_png(rgb.data(), w * 3, w, h, PNG_COLOR_TYPE_RGB, 8);
  const auto png_interlaced = encode_png(rgb.data(), w * 3, w, h, PNG_COLOR_TYPE_RGB, 8, true);
  auto truncated = [](std::vector<std::byte> f, size_t n) {
    f.resize(n);
    return f;
  };
  return {
      {"baseline", baseline, true},
      {"truncated progressive", truncated(progressive, progressive.size() / 2), false},
      {"progressive", progressive, true},
      {"corrupt body", corrupt_body, false},
      {"grayscale", encode_jpeg(gray.data(), w, h, 1, {.quality = 90}), true},
      {"corrupt header", corrupt_header, false},
      {"cmyk", encode_jpeg(cmyk.data(), w, h, 4, {.quality = 90}), true},
      {"truncated png", truncated(png, png.size() / 2), false},
      {"png", png, true},
      {"truncated baseline", truncated(baseline, sos + 24), false},
      {"interlaced png", png_interlaced, true},
      {"not an image", as_bytes(std::vector<uint8_t>(100, 7)), false},
      {"progressive again", progressive, true},
      {"baseline again", baseline, true},
  };
}

}  // namespace stoker::image::testing
