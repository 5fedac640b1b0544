// Geometric operations of ops.h. PLACEHOLDER on branch vision-base: replaced by the
// implementation before anything merges to main.
#include <stdexcept>

#include "ops.h"

namespace stoker::image::internal {
void affine(RgbView, RgbView, double, std::array<double, 2>, double, std::array<double, 2>,
            Interpolation, const Fill&, std::optional<std::array<double, 2>>) {
  throw std::logic_error("affine");
}
void rotate(RgbView, RgbView, double, Interpolation, const Fill&,
            std::optional<std::array<double, 2>>) {
  throw std::logic_error("rotate");
}
void pad(RgbView, RgbView, int, int, int, int, PadMode, std::array<uint8_t, 3>) {
  throw std::logic_error("pad");
}
}  // namespace stoker::image::internal
