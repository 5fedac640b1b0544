#include "stoker/image_text/tile_processor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "stoker/errors.h"
#include "stoker/image/resize.h"

namespace stoker::image_text {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument("LLaVA-NeXT image processor: " + what);
}

// Python's int(round(x, 7)): rounded to 7 decimals (to drop float noise), then truncated.
int64_t python_int_round7(double x) { return static_cast<int64_t>(std::nearbyint(x * 1e7) / 1e7); }

}  // namespace

TileProcessor::TileProcessor(TileProcessorOptions o) : options_(std::move(o)) {
  const TileProcessorOptions& p = options_;
  require(p.tile > 0, "crop_size must be positive");
  require(p.patch_size > 0 && p.patch_size <= p.tile, "patch_size must be in [1, crop_size]");
  require(p.additional_tokens >= 0, "num_additional_image_tokens must not be negative");
  require(!p.pinpoints.empty(), "image_grid_pinpoints is empty");
  for (const auto& [h, w] : p.pinpoints)
    require(
        h > 0 && w > 0 && h % p.tile == 0 && w % p.tile == 0 && h <= (1 << 16) && w <= (1 << 16),
        "image_grid_pinpoints must be multiples of crop_size (" + std::to_string(p.tile) +
            "), got " + std::to_string(h) + "x" + std::to_string(w));
  table_ = value_table(p.rescale_factor, p.mean, p.std, "LLaVA-NeXT image processor");
}

std::pair<int, int> TileProcessor::best_resolution(int height, int width) const {
  require(height > 0 && width > 0, "the image has no pixels");
  std::pair<int, int> best{0, 0};
  int64_t most = 0, least_wasted = std::numeric_limits<int64_t>::max();
  const int64_t pixels = int64_t{height} * width;
  for (const auto& [h, w] : options_.pinpoints) {
    const double scale = std::min(static_cast<double>(w) / width, static_cast<double>(h) / height);
    const auto dw = static_cast<int64_t>(width * scale), dh = static_cast<int64_t>(height * scale);
    const int64_t effective = std::min(dw * dh, pixels);
    const int64_t wasted = int64_t{h} * w - effective;
    if (effective > most || (effective == most && wasted < least_wasted)) {
      most = effective;
      least_wasted = wasted;
      best = {h, w};
    }
  }
  return best;
}

std::pair<int, int> TileProcessor::resized_size(int height, int width) const {
  const auto [th, tw] = best_resolution(height, width);
  const double scale_w = static_cast<double>(tw) / width,
               scale_h = static_cast<double>(th) / height;
  if (scale_w < scale_h) return {std::min(static_cast<int>(std::ceil(height * scale_w)), th), tw};
  return {th, std::min(static_cast<int>(std::ceil(width * scale_h)), tw)};
}

int64_t TileProcessor::tiles(int height, int width) const {
  const auto [h, w] = best_resolution(height, width);
  return 1 + int64_t{h / options_.tile} * (w / options_.tile);
}

int64_t TileProcessor::max_tiles() const {
  int64_t most = 0;
  for (const auto& [h, w] : options_.pinpoints)
    most = std::max(most, int64_t{h / options_.tile} * (w / options_.tile));
  return 1 + most;
}

int64_t TileProcessor::image_tokens(int height, int width) const {
  const TileProcessorOptions& o = options_;
  const auto [bh, bw] = best_resolution(height, width);
  const int64_t side = o.tile / o.patch_size;  // patches along a tile's side
  int64_t current_h = side * (bh / o.tile), current_w = side * (bw / o.tile);
  // LlavaNextProcessor._get_unpadded_features: the rows or columns of padding removed.
  const double aspect = static_cast<double>(width) / height;
  const double current_aspect = static_cast<double>(current_w) / current_h;
  if (aspect > current_aspect) {
    const int64_t new_h = python_int_round7(height * (static_cast<double>(current_w) / width));
    current_h -= (current_h - new_h) / 2 * 2;
  } else {
    const int64_t new_w = python_int_round7(width * (static_cast<double>(current_h) / height));
    current_w -= (current_w - new_w) / 2 * 2;
  }
  const int64_t tokens = current_h * current_w + current_h + side * side + o.additional_tokens;
  return o.drop_cls ? tokens - 1 : tokens;
}

void TileProcessor::info(int height, int width, int64_t* out) const {
  best_resolution(height, width);  // refuses an image of no pixels
  out[0] = height, out[1] = width;
}

void TileProcessor::fill(std::span<const uint8_t> rgb, int width, int height, std::span<float> out,
                         std::vector<uint8_t>& scratch) const {
  const int t = options_.tile;
  const auto [bh, bw] = best_resolution(height, width);
  const auto [rh, rw] = resized_size(height, width);
  const size_t tile_floats = size_t{3} * t * t;
  require(out.size() >= static_cast<size_t>(tiles(height, width)) * tile_floats,
          "the output holds fewer floats than the image's tiles");
  const image::ResizeBox all{0, 0, static_cast<float>(width), static_cast<float>(height)};
  // scratch: the base tile (t x t), then the canvas (bh x bw), then the resized image.
  const size_t base_bytes = size_t{3} * t * t, canvas_bytes = size_t{3} * bh * bw;
  scratch.resize(base_bytes + canvas_bytes + size_t{3} * rh * rw);
  std::span<uint8_t> base(scratch.data(), base_bytes);
  std::span<uint8_t> canvas(scratch.data() + base_bytes, canvas_bytes);
  std::span<uint8_t> resized(scratch.data() + base_bytes + canvas_bytes, size_t{3} * rh * rw);
  image::resize_rgb(rgb, width, height, all, t, t, base, image::ResizeFilter::kBicubic);
  image::resize_rgb(rgb, width, height, all, rw, rh, resized, image::ResizeFilter::kBicubic);
  std::fill(canvas.begin(), canvas.end(), uint8_t{0});
  const int paste_y = (bh - rh) / 2, paste_x = (bw - rw) / 2;
  for (int y = 0; y < rh; ++y)
    std::memcpy(canvas.data() + ((size_t{1} * (paste_y + y) * bw) + paste_x) * 3,
                resized.data() + size_t{3} * y * rw, size_t{3} * rw);
  // Tile k of [3, t, t]: the base, then the canvas's row by row.
  const auto write = [&](const uint8_t* src, size_t stride, float* dst) {
    for (int c = 0; c < 3; ++c) {
      const float* lut = table_[c].data();
      for (int y = 0; y < t; ++y) {
        const uint8_t* p = src + y * stride + c;
        for (int x = 0; x < t; ++x) *dst++ = lut[p[3 * x]];
      }
    }
  };
  float* dst = out.data();
  write(base.data(), size_t{3} * t, dst);
  dst += tile_floats;
  for (int ty = 0; ty < bh / t; ++ty)
    for (int tx = 0; tx < bw / t; ++tx, dst += tile_floats)
      write(canvas.data() + (size_t{1} * ty * t * bw + size_t{1} * tx * t) * 3, size_t{3} * bw,
            dst);
}

}  // namespace stoker::image_text
