// classify_jpeg: which files nvJPEG's batched decoders take, decided on the CPU from the markers.
//
// The rules are those of the hardware decoder (NVJPEG_BACKEND_HARDWARE: "baseline JPEG with a
// single scan; 4:1:0 and 4:1:1 not supported"), which the GPU-hybrid backend also decodes on the
// GPU; colour interpretation follows libjpeg (jdapimin.c), so that a file the CPU path would read
// as RGB or CMYK is never given to a decoder that would read it as YCbCr.
#include <cstring>

#include "stoker/gpu/decode.h"

namespace stoker::image::gpu {
namespace {

constexpr uint8_t kSOI = 0xD8, kEOI = 0xD9, kSOS = 0xDA, kAPP0 = 0xE0, kAPP14 = 0xEE;

class Reader {
 public:
  explicit Reader(std::span<const std::byte> b)
      : p_(reinterpret_cast<const uint8_t*>(b.data())), n_(b.size()) {}
  size_t size() const { return n_; }
  bool has(size_t at, size_t len) const { return at <= n_ && len <= n_ - at; }
  uint8_t u8(size_t at) const { return p_[at]; }
  int u16(size_t at) const { return (p_[at] << 8) | p_[at + 1]; }
  const uint8_t* data() const { return p_; }

 private:
  const uint8_t* p_;
  size_t n_;
};

bool is_sof(uint8_t m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }
bool is_standalone(uint8_t m) { return (m >= 0xD0 && m <= 0xD7) || m == 0x01; }  // RSTn, TEM

// From `at`, inside entropy-coded data: the offset of the next marker's 0xFF (stuffed 0xFF00,
// fill bytes and restart markers are data), or npos.
size_t next_marker(const Reader& r, size_t at) {
  const uint8_t* p = r.data();
  while (at + 1 < r.size()) {
    const void* ff = std::memchr(p + at, 0xFF, r.size() - at - 1);
    if (ff == nullptr) return std::string::npos;
    at = static_cast<const uint8_t*>(ff) - p;
    const uint8_t m = p[at + 1];
    if (m == 0x00 || m == 0xFF || (m >= 0xD0 && m <= 0xD7)) {
      at += 1;
      continue;
    }
    return at;
  }
  return std::string::npos;
}

// libjpeg's colour space guess for three components: true when it reads them as RGB.
bool libjpeg_reads_rgb(const JpegHeader& h) {
  if (h.jfif) return false;
  if (h.adobe_transform >= 0) return h.adobe_transform == 0;
  return h.component_id[0] == 'R' && h.component_id[1] == 'G' && h.component_id[2] == 'B';
}

bool gpu_subsampling(const JpegHeader& h) {
  if (h.components == 1) return true;
  for (int c = 1; c < 3; ++c)
    if (h.h_samp[c] != 1 || h.v_samp[c] != 1) return false;
  const int hs = h.h_samp[0], vs = h.v_samp[0];
  return (hs == 1 || hs == 2) && (vs == 1 || vs == 2);  // 4:4:4, 4:2:2, 4:2:0, 4:4:0
}

// Walks the markers; false when the structure is damaged before the end of the first scan.
// Sets h (frame, colour markers, scans up to EOI).
bool walk(const Reader& r, JpegHeader& h, int& first_scan_components) {
  size_t at = 2;
  bool in_scans = false;
  for (;;) {
    if (in_scans) {
      at = next_marker(r, at);
      if (at == std::string::npos) return true;  // no EOI: truncated data
    }
    // A marker: 0xFF, optional fill bytes, then its code.
    if (!r.has(at, 2) || r.u8(at) != 0xFF) return in_scans;
    while (r.has(at + 1, 1) && r.u8(at + 1) == 0xFF) ++at;
    if (!r.has(at + 1, 1)) return in_scans;
    const uint8_t m = r.u8(at + 1);
    at += 2;
    if (m == kEOI) {
      h.eoi = in_scans;
      return in_scans;  // EOI before any scan: no image
    }
    if (m == kSOI) return false;
    if (is_standalone(m)) continue;
    if (!r.has(at, 2)) return in_scans;
    const int len = r.u16(at);
    if (len < 2 || !r.has(at, len)) return in_scans;
    const size_t seg = at + 2;
    const int body = len - 2;
    if (is_sof(m)) {
      if (h.sof >= 0 || body < 6) return false;
      h.sof = m - 0xC0;
      h.precision = r.u8(seg);
      h.height = r.u16(seg + 1);
      h.width = r.u16(seg + 3);
      h.components = r.u8(seg + 5);
      if (h.components < 1 || body != 6 + 3 * h.components) return false;
      for (int c = 0; c < h.components && c < 4; ++c) {
        h.component_id[c] = r.u8(seg + 6 + 3 * c);
        h.h_samp[c] = r.u8(seg + 7 + 3 * c) >> 4;
        h.v_samp[c] = r.u8(seg + 7 + 3 * c) & 15;
      }
    } else if (m == kAPP0 && body >= 5 && std::memcmp(r.data() + seg, "JFIF", 5) == 0) {
      h.jfif = true;
    } else if (m == kAPP14 && body >= 12 && std::memcmp(r.data() + seg, "Adobe", 5) == 0) {
      h.adobe_transform = r.u8(seg + 11);
    } else if (m == kSOS) {
      if (h.sof < 0 || body < 1) return false;
      if (++h.scans == 1) first_scan_components = r.u8(seg);
      in_scans = true;
    }
    at += len;
  }
}

}  // namespace

const char* route_name(Route r) {
  switch (r) {
    case Route::kGpu:
      return "gpu";
    case Route::kNotJpeg:
      return "not_jpeg";
    case Route::kBadHeader:
      return "bad_header";
    case Route::kNotBaseline:
      return "not_baseline";
    case Route::kPrecision:
      return "precision";
    case Route::kColorSpace:
      return "color_space";
    case Route::kSubsampling:
      return "subsampling";
    case Route::kMultiScan:
      return "multi_scan";
    case Route::kNoEndMarker:
      return "no_end_marker";
    case Route::kTooLarge:
      return "too_large";
    case Route::kFileTooLarge:
      return "file_too_large";
    case Route::kGpuFailed:
      return "gpu_failed";
  }
  return "unknown";
}

Route classify_jpeg(std::span<const std::byte> file, JpegHeader* out) {
  JpegHeader h;
  const Reader r(file);
  Route route = Route::kGpu;
  int first_scan_components = 0;
  if (r.size() < 3 || r.u8(0) != 0xFF || r.u8(1) != kSOI || r.u8(2) != 0xFF) {
    route = Route::kNotJpeg;
  } else if (!walk(r, h, first_scan_components) || h.sof < 0 || h.scans == 0 || h.width == 0 ||
             h.height == 0) {
    route = Route::kBadHeader;  // height 0 too: a DNL-defined height, which libjpeg refuses
  } else if (h.sof != 0 && h.sof != 1) {
    route = Route::kNotBaseline;
  } else if (h.precision != 8) {
    route = Route::kPrecision;
  } else if (h.components != 1 && (h.components != 3 || libjpeg_reads_rgb(h))) {
    route = Route::kColorSpace;
  } else if (!gpu_subsampling(h)) {
    route = Route::kSubsampling;
  } else if (h.scans != 1 || first_scan_components != h.components) {
    route = Route::kMultiScan;
  } else if (!h.eoi) {
    route = Route::kNoEndMarker;
  }
  if (out != nullptr) *out = h;
  return route;
}

}  // namespace stoker::image::gpu
