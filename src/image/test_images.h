// Test helpers: synthetic images and in-memory JPEG/PNG encoders (libjpeg, libpng).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace stoker::image::testing {

// A smooth RGB pattern with some texture, w * h * 3 bytes; `seed` varies it.
std::vector<uint8_t> pattern_rgb(int w, int h, int seed = 0);

struct JpegParams {
  int quality = 100;
  bool progressive = false;
  bool subsample = false;        // 4:2:0 chroma (libjpeg's default) instead of 4:4:4
  bool adobe = true;             // for 4 components: write the Adobe marker (PIL then inverts CMYK)
  int restart_rows = 0;          // restart markers every this many MCU rows (0: none)
  bool non_interleaved = false;  // sequential, one scan per component (multi-scan baseline)
};

// components: 1 (gray), 3 (RGB) or 4 (CMYK).
std::vector<std::byte> encode_jpeg(const uint8_t* pixels, int w, int h, int components,
                                   const JpegParams& params = {});

// rows: h rows of `rowbytes` raw PNG samples (packed for bit depths < 8, big-endian for 16).
// palette_alphas: a tRNS chunk of the palette's first alphas.
std::vector<std::byte> encode_png(const uint8_t* rows, size_t rowbytes, int w, int h,
                                  int color_type, int bit_depth, bool interlace = false,
                                  std::span<const uint8_t> palette_rgb = {},
                                  std::span<const uint8_t> palette_alphas = {});

inline std::vector<std::byte> as_bytes(const std::vector<uint8_t>& v) {
  return std::vector<std::byte>(reinterpret_cast<const std::byte*>(v.data()),
                                reinterpret_cast<const std::byte*>(v.data()) + v.size());
}

// Every kind of file a worker may meet, good and bad (truncated, corrupt body or header, not an
// image), in an order that switches codec, colour space and progressive mode from one file to
// the next: baseline, progressive, grayscale and CMYK JPEG, plain and interlaced PNG.
struct NamedFile {
  std::string name;
  std::vector<std::byte> bytes;
  bool good;
};
std::vector<NamedFile> mixed_files();

double mean_abs_diff(std::span<const uint8_t> a, std::span<const uint8_t> b);
int max_abs_diff(std::span<const uint8_t> a, std::span<const uint8_t> b);

}  // namespace stoker::image::testing
