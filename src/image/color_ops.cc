// Colour and tone operations of ops.h. PLACEHOLDER on branch vision-base: replaced by the
// implementation before anything merges to main.
#include <stdexcept>

#include "ops.h"

namespace stoker::image::internal {
namespace {
[[noreturn]] void missing(const char* what) { throw std::logic_error(what); }
}  // namespace
void adjust_brightness(RgbView, double) { missing("adjust_brightness"); }
void adjust_contrast(RgbView, double) { missing("adjust_contrast"); }
void adjust_saturation(RgbView, double) { missing("adjust_saturation"); }
void adjust_hue(RgbView, double, OpScratch&) { missing("adjust_hue"); }
void adjust_sharpness(RgbView, double, OpScratch&) { missing("adjust_sharpness"); }
void rgb_to_grayscale(RgbView) { missing("rgb_to_grayscale"); }
void posterize(RgbView, int) { missing("posterize"); }
void solarize(RgbView, double) { missing("solarize"); }
void autocontrast(RgbView) { missing("autocontrast"); }
void equalize(RgbView) { missing("equalize"); }
void invert(RgbView) { missing("invert"); }
void gaussian_blur(RgbView, int, int, double, double, OpScratch&) { missing("gaussian_blur"); }
}  // namespace stoker::image::internal
