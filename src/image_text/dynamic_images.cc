#include "stoker/image_text/dynamic_images.h"

#include <cmath>

#include "stoker/errors.h"

namespace stoker::image_text {

ValueTable value_table(double rescale_factor, const std::array<float, 3>& mean,
                       const std::array<float, 3>& std, const std::string& who) {
  if (!(rescale_factor > 0 && std::isfinite(rescale_factor)))
    throw InvalidArgument(who + ": rescale_factor must be positive");
  ValueTable table;
  for (int c = 0; c < 3; ++c) {
    if (!(std[c] != 0 && std::isfinite(std[c]) && std::isfinite(mean[c])))
      throw InvalidArgument(who + ": image_std must be non-zero and image_mean finite");
    for (int v = 0; v < 256; ++v) {
      const float x = static_cast<float>(static_cast<double>(v) * rescale_factor);
      table[c][v] = (x - mean[c]) / std[c];
    }
  }
  return table;
}

}  // namespace stoker::image_text
