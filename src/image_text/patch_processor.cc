#include "stoker/image_text/patch_processor.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "stoker/errors.h"
#include "stoker/image/resize.h"

namespace stoker::image_text {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument("Qwen2-VL image processor: " + what);
}

}  // namespace

PatchProcessor::PatchProcessor(PatchProcessorOptions o) : options_(o) {
  require(o.patch_size > 0, "patch_size must be positive");
  require(o.merge_size > 0, "merge_size must be positive");
  require(o.temporal_patch_size > 0, "temporal_patch_size must be positive");
  require(o.min_pixels > 0 && o.min_pixels <= o.max_pixels,
          "min_pixels and max_pixels must satisfy 0 < min_pixels <= max_pixels");
  require(o.max_pixels <= (int64_t{1} << 40), "max_pixels is too large");
  table_ = value_table(o.rescale_factor, o.mean, o.std, "Qwen2-VL image processor");
}

std::pair<int, int> PatchProcessor::resized_size(int height, int width) const {
  require(height > 0 && width > 0, "the image has no pixels");
  const double factor = static_cast<double>(options_.patch_size) * options_.merge_size;
  const double aspect = static_cast<double>(std::max(height, width)) / std::min(height, width);
  require(aspect <= 200, "absolute aspect ratio must be smaller than 200, got " +
                             std::to_string(aspect) + " (" + std::to_string(width) + "x" +
                             std::to_string(height) + ")");
  // Python's round() (half to even) is nearbyint under the default rounding mode.
  double h_bar = std::nearbyint(height / factor) * factor;
  double w_bar = std::nearbyint(width / factor) * factor;
  const double pixels = static_cast<double>(height) * width;
  if (h_bar * w_bar > static_cast<double>(options_.max_pixels)) {
    const double beta = std::sqrt(pixels / static_cast<double>(options_.max_pixels));
    h_bar = std::max(factor, std::floor(height / beta / factor) * factor);
    w_bar = std::max(factor, std::floor(width / beta / factor) * factor);
  } else if (h_bar * w_bar < static_cast<double>(options_.min_pixels)) {
    const double beta = std::sqrt(static_cast<double>(options_.min_pixels) / pixels);
    h_bar = std::ceil(height * beta / factor) * factor;
    w_bar = std::ceil(width * beta / factor) * factor;
  }
  return {static_cast<int>(h_bar), static_cast<int>(w_bar)};
}

PatchGrid PatchProcessor::grid(int height, int width) const {
  const auto [h, w] = resized_size(height, width);
  PatchGrid g{1, h / options_.patch_size, w / options_.patch_size};
  require(g.patches() <= max_patches(),
          "a " + std::to_string(width) + "x" + std::to_string(height) + " image makes " +
              std::to_string(g.patches()) + " patches, more than max_pixels allows (" +
              std::to_string(max_patches()) + ")");
  return g;
}

int64_t PatchProcessor::image_tokens(int height, int width) const {
  const PatchGrid g = grid(height, width);
  return g.h * g.w / (int64_t{options_.merge_size} * options_.merge_size);
}

void PatchProcessor::info(int height, int width, int64_t* out) const {
  const PatchGrid g = grid(height, width);
  out[0] = g.t, out[1] = g.h, out[2] = g.w;
}

int64_t PatchProcessor::patch_dim() const {
  return int64_t{3} * options_.temporal_patch_size * options_.patch_size * options_.patch_size;
}

int64_t PatchProcessor::max_patches() const {
  return options_.max_pixels / (int64_t{options_.patch_size} * options_.patch_size);
}

PatchGrid PatchProcessor::process(std::span<const uint8_t> rgb, int width, int height,
                                  std::span<float> out, std::vector<uint8_t>& scratch) const {
  const PatchGrid g = grid(height, width);
  const int p = options_.patch_size, m = options_.merge_size, t = options_.temporal_patch_size;
  const int rh = static_cast<int>(g.h) * p, rw = static_cast<int>(g.w) * p;
  const int64_t dim = patch_dim();
  require(out.size() >= static_cast<size_t>(g.patches() * dim),
          "the output holds fewer floats than the image's patches");
  scratch.resize(static_cast<size_t>(rh) * rw * 3);
  image::resize_rgb(rgb, width, height, {0, 0, float(width), float(height)}, rw, rh, scratch,
                    image::ResizeFilter::kBicubic);
  const uint8_t* img = scratch.data();
  const int64_t blocks_w = g.w / m;
  float* row = out.data();
  // Rows: (block row, block column, patch row in block, patch column in block).
  for (int64_t r = 0; r < g.patches(); ++r, row += dim) {
    const int64_t block = r / (int64_t{m} * m), in_block = r % (int64_t{m} * m);
    const int64_t py0 = ((block / blocks_w) * m + in_block / m) * p;
    const int64_t px0 = ((block % blocks_w) * m + in_block % m) * p;
    // Columns: (channel, temporal copy, y, x) in the patch.
    float* col = row;
    for (int c = 0; c < 3; ++c) {
      const float* lut = table_[c].data();
      float* first = col;
      for (int y = 0; y < p; ++y) {
        const uint8_t* src = img + ((py0 + y) * rw + px0) * 3 + c;
        for (int x = 0; x < p; ++x) *col++ = lut[src[3 * x]];
      }
      for (int k = 1; k < t; ++k, col += p * p) std::copy(first, first + p * p, col);
    }
  }
  return g;
}

}  // namespace stoker::image_text
