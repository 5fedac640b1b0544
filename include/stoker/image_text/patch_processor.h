// Qwen2-VL's dynamic-resolution image processor, natively: an image becomes a grid of patches
// whose count (and so the model's number of image tokens) depends on its size.
//
// What it computes, as Hugging Face's Qwen2VLImageProcessor (transformers 5, PIL backend):
// - its input is the image as transformers' convert_to_rgb gives it: a PNG's transparency
//   composited on white (DynamicImages::kAlpha);
// - smart_resize: height and width rounded to multiples of factor = patch_size * merge_size
//   (Python's round, half to even), then scaled by sqrt(h * w / max_pixels) (floored to the
//   factor, at least one factor) when above max_pixels, or by sqrt(min_pixels / (h * w)) (ceiled)
//   when below min_pixels; an aspect ratio above 200 is refused;
// - the image resized to that size with PIL's bicubic filter (stoker/image/resize.h, bit for bit),
//   each 8-bit value v then float32(v * rescale_factor) and (x - mean) / std in float32;
// - the grid (t, h, w) = (1, height / patch_size, width / patch_size), and h * w rows of
//   C * temporal_patch_size * patch_size^2 floats: rows ordered by merge block (block row, block
//   column, then the merge_size x merge_size patches inside it, row-major), each row channel by
//   channel, the still image repeated temporal_patch_size times, then the patch's pixels
//   row-major. The model sees h * w / merge_size^2 image tokens.
//
// Thread safety: an immutable value once constructed; every method is const and reentrant.
// Errors: InvalidArgument for bad options (naming the option) and for an image the processor
// refuses (aspect ratio over 200, a size whose patches exceed max_patches()).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "stoker/image_text/dynamic_images.h"

namespace stoker::image_text {

struct PatchProcessorOptions {
  int patch_size = 14;
  int merge_size = 2;
  int temporal_patch_size = 2;
  int64_t min_pixels = 56 * 56;
  int64_t max_pixels = 28 * 28 * 1280;
  double rescale_factor = 1.0 / 255.0;
  std::array<float, 3> mean = {0.48145466f, 0.4578275f, 0.40821073f};  // OpenAI CLIP's
  std::array<float, 3> std = {0.26862954f, 0.26130258f, 0.27577711f};
};

struct PatchGrid {
  int64_t t = 0, h = 0, w = 0;
  int64_t patches() const { return t * h * w; }
};

// As DynamicImages: rows are patches of patch_dim() floats, info "image_grid_thw" (t, h, w).
class PatchProcessor final : public DynamicImages {
 public:
  // Throws InvalidArgument naming the option: sizes must be positive, 0 < min_pixels <=
  // max_pixels, rescale_factor > 0, std non-zero.
  explicit PatchProcessor(PatchProcessorOptions options);

  const PatchProcessorOptions& options() const { return options_; }

  // smart_resize's (height, width) for an image of that size.
  std::pair<int, int> resized_size(int height, int width) const;
  // The grid of an image of that size, without decoding it.
  PatchGrid grid(int height, int width) const;
  // The model's image tokens for an image of that size: grid's h * w / merge_size^2.
  int64_t image_tokens(int height, int width) const override;
  // Floats per patch row: 3 * temporal_patch_size * patch_size^2.
  int64_t patch_dim() const;
  // An upper bound of grid().patches() for the images it accepts: max_pixels / patch_size^2
  // (grid() refuses an image whose patches exceed it, which only an extreme aspect ratio under a
  // small max_pixels can reach).
  int64_t max_patches() const;

  // Processes a decoded RGB image (height rows of 3 * width bytes) into `out`, which must hold
  // grid(height, width).patches() * patch_dim() floats; returns the grid. `scratch` is reusable
  // working memory.
  PatchGrid process(std::span<const uint8_t> rgb, int width, int height, std::span<float> out,
                    std::vector<uint8_t>& scratch) const;

  // DynamicImages.
  int64_t rows(int height, int width) const override { return grid(height, width).patches(); }
  std::vector<int64_t> row_shape() const override { return {patch_dim()}; }
  std::string info_name() const override { return "image_grid_thw"; }
  int info_size() const override { return 3; }
  void info(int height, int width, int64_t* out) const override;
  void fill(std::span<const uint8_t> rgb, int width, int height, std::span<float> out,
            std::vector<uint8_t>& scratch) const override {
    process(rgb, width, height, out, scratch);
  }

 private:
  PatchProcessorOptions options_;
  ValueTable table_;  // per channel and 8-bit value: the output
};

}  // namespace stoker::image_text
