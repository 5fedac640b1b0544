// DynamicImages: a Hugging Face image processor whose images take a number of tokens and of
// pixel rows that depends on their size: Qwen2-VL's patches (patch_processor.h), LLaVA-NeXT's
// tiles (tile_processor.h). What VLMSource asks of such a processor, from an image's size alone
// (read from its header) and then from its decoded pixels.
//
// Contract:
// - Thread safety: implementations are immutable once constructed; every method is const and
//   reentrant.
// - Sizes are (height, width) of the image as decoded. The methods that take a size throw
//   InvalidArgument for a size the processor refuses (naming it); image_tokens(), rows() and
//   info() agree on which.
// - Pixels are those of image::decode with kAlpha: Hugging Face's processors composite a
//   transparent PNG on white (transformers' convert_to_rgb).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "stoker/image/decode.h"

namespace stoker::image_text {

// Each 8-bit value's float32 after Hugging Face's rescale and normalize, per channel, in
// numpy's order: float32(v * rescale_factor in float64), then (x - mean) / std in float32.
using ValueTable = std::array<std::array<float, 256>, 3>;
// Throws InvalidArgument, its message prefixed by `who`, for a rescale_factor that is not
// positive and finite, a zero or non-finite std, or a non-finite mean.
ValueTable value_table(double rescale_factor, const std::array<float, 3>& mean,
                       const std::array<float, 3>& std, const std::string& who);

class DynamicImages {
 public:
  virtual ~DynamicImages() = default;

  // How the images it processes are decoded.
  static constexpr image::Alpha kAlpha = image::Alpha::kOverWhite;

  // The model's image tokens for an image of that size.
  virtual int64_t image_tokens(int height, int width) const = 0;
  // The pixel rows (float32, each of row_shape()) it makes of such an image.
  virtual int64_t rows(int height, int width) const = 0;
  virtual std::vector<int64_t> row_shape() const = 0;
  // The per-image values the model takes beside the pixels: info_size() int64 values named
  // info_name() ("image_grid_thw": Qwen2-VL's (t, h, w); "image_sizes": LLaVA-NeXT's (height,
  // width)), written to out.
  virtual std::string info_name() const = 0;
  virtual int info_size() const = 0;
  virtual void info(int height, int width, int64_t* out) const = 0;
  // Processes a decoded RGB image (height rows of 3 * width bytes) into `out`, which must hold
  // rows(height, width) rows. `scratch` is reusable working memory.
  virtual void fill(std::span<const uint8_t> rgb, int width, int height, std::span<float> out,
                    std::vector<uint8_t>& scratch) const = 0;
};

}  // namespace stoker::image_text
