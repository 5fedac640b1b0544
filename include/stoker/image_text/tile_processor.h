// LLaVA-NeXT's any-resolution image processor, natively: an image becomes a base tile (the whole
// image resized to tile x tile) and the tiles of a grid chosen by its size, so the model's number
// of image tokens depends on the size.
//
// What it computes, as Hugging Face's LlavaNextImageProcessor (transformers 5, PIL backend) and
// LlavaNextProcessor:
// - the best resolution among `pinpoints` (height, width): the one that keeps the most of the
//   image's pixels when it is scaled to fit inside, ties to the one that wastes the fewest
//   (select_best_resolution);
// - the image resized (PIL's bicubic, stoker/image/resize.h, bit for bit) to fit that resolution
//   with its aspect ratio (the scaled side ceiled: get_patch_output_size), pasted in the middle
//   of a black canvas of it (the odd pixel after), cut into tile x tile tiles row by row; before
//   them the whole image resized to tile x tile;
// - each 8-bit value v then float32(v * rescale_factor) and (x - mean) / std in float32, tiles
//   [3, tile, tile] (CHW);
// - image tokens (LlavaNextProcessor): (tile / patch_size)^2 + additional_tokens for the base
//   tile, plus the grid's patches less the rows or columns of padding the aspect ratio leaves
//   (rounded as transformers rounds them), plus one newline token per remaining row; one fewer
//   with drop_cls (vision_feature_select_strategy "default").
// As DynamicImages: rows are tiles of [3, tile, tile], info "image_sizes" (height, width).
//
// Thread safety: an immutable value once constructed; every method is const and reentrant.
// Errors: InvalidArgument for bad options (naming the option) and for an image of no pixels.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "stoker/image_text/dynamic_images.h"

namespace stoker::image_text {

struct TileProcessorOptions {
  // (height, width) of each resolution, multiples of tile (LLaVA-v1.6's by default).
  std::vector<std::array<int, 2>> pinpoints = {
      {336, 672}, {672, 336}, {672, 672}, {1008, 336}, {336, 1008}};
  int tile = 336;             // crop_size: a tile's side
  int patch_size = 14;        // the vision tower's: tokens per tile side are tile / patch_size
  int additional_tokens = 1;  // num_additional_image_tokens (the CLS token)
  bool drop_cls = true;       // vision_feature_select_strategy "default": one token fewer
  double rescale_factor = 1.0 / 255.0;
  std::array<float, 3> mean = {0.48145466f, 0.4578275f, 0.40821073f};  // OpenAI CLIP's
  std::array<float, 3> std = {0.26862954f, 0.26130258f, 0.27577711f};
};

class TileProcessor final : public DynamicImages {
 public:
  // Throws InvalidArgument naming the option: tile and patch_size positive, pinpoints not empty
  // and each a positive multiple of tile, rescale_factor > 0, std non-zero.
  explicit TileProcessor(TileProcessorOptions options);

  const TileProcessorOptions& options() const { return options_; }

  // The pinpoint (height, width) chosen for an image of that size.
  std::pair<int, int> best_resolution(int height, int width) const;
  // The size (height, width) the image is resized to inside it.
  std::pair<int, int> resized_size(int height, int width) const;
  // The tiles of an image of that size, the base one included.
  int64_t tiles(int height, int width) const;
  // The most tiles an image makes: 1 + the largest pinpoint's.
  int64_t max_tiles() const;

  // DynamicImages.
  int64_t image_tokens(int height, int width) const override;
  int64_t rows(int height, int width) const override { return tiles(height, width); }
  std::vector<int64_t> row_shape() const override { return {3, options_.tile, options_.tile}; }
  std::string info_name() const override { return "image_sizes"; }
  int info_size() const override { return 2; }
  void info(int height, int width, int64_t* out) const override;
  void fill(std::span<const uint8_t> rgb, int width, int height, std::span<float> out,
            std::vector<uint8_t>& scratch) const override;

 private:
  TileProcessorOptions options_;
  ValueTable table_;  // per channel and 8-bit value: the output
};

}  // namespace stoker::image_text
