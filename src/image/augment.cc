// Construction and validation of the augmentation transforms of augment.h.
#include "stoker/image/augment.h"

#include <cmath>
#include <string>

#include "stoker/errors.h"

namespace stoker::image {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument(what);
}

bool probability(double p) { return p >= 0 && p <= 1; }

void check_range(const std::optional<std::pair<double, double>>& r, double lo, double hi,
                 const std::string& what) {
  if (!r) return;
  require(std::isfinite(r->first) && std::isfinite(r->second) && lo <= r->first &&
              r->first <= r->second && r->second <= hi,
          what);
}

void check_fill(const Fill& fill, const std::string& name) {
  if (!fill) return;
  for (float v : *fill) require(std::isfinite(v), name + ": fill values must be finite");
}

void check_center(const std::optional<std::array<double, 2>>& c, const std::string& name) {
  if (!c) return;
  require(std::isfinite((*c)[0]) && std::isfinite((*c)[1]), name + ": center must be finite");
}

}  // namespace

RandomVerticalFlip::RandomVerticalFlip(double p) : p(p) { validate(); }

void RandomVerticalFlip::validate() const {
  require(probability(p), "RandomVerticalFlip: p must be in [0, 1]");
}

Pad::Pad(int left, int top, int right, int bottom, std::array<uint8_t, 3> fill, PadMode mode)
    : left(left), top(top), right(right), bottom(bottom), fill(fill), mode(mode) {
  validate();
}

void Pad::validate() const {
  require(left >= 0 && top >= 0 && right >= 0 && bottom >= 0 && left <= 1 << 16 &&
              top <= 1 << 16 && right <= 1 << 16 && bottom <= 1 << 16,
          "Pad: paddings must be between 0 and 65536");
}

RandomCrop::RandomCrop(int height, int width, Pad padding, bool pad_if_needed)
    : height(height), width(width), padding(padding), pad_if_needed(pad_if_needed) {
  validate();
}

void RandomCrop::validate() const {
  require(height > 0 && width > 0, "RandomCrop: height and width must be positive");
  padding.validate();
}

ColorJitter::ColorJitter(Range brightness, Range contrast, Range saturation, Range hue)
    : brightness(brightness), contrast(contrast), saturation(saturation), hue(hue) {
  validate();
}

void ColorJitter::validate() const {
  const double inf = HUGE_VAL;
  check_range(brightness, 0, inf, "ColorJitter: brightness must be a range within [0, inf)");
  check_range(contrast, 0, inf, "ColorJitter: contrast must be a range within [0, inf)");
  check_range(saturation, 0, inf, "ColorJitter: saturation must be a range within [0, inf)");
  check_range(hue, -0.5, 0.5, "ColorJitter: hue must be a range within [-0.5, 0.5]");
}

RandomGrayscale::RandomGrayscale(double p) : p(p) { validate(); }

void RandomGrayscale::validate() const {
  require(probability(p), "RandomGrayscale: p must be in [0, 1]");
}

GaussianBlur::GaussianBlur(int kernel_width, int kernel_height, std::pair<double, double> sigma)
    : kernel_width(kernel_width), kernel_height(kernel_height), sigma(sigma) {
  validate();
}

void GaussianBlur::validate() const {
  require(kernel_width > 0 && kernel_height > 0 && kernel_width % 2 == 1 &&
              kernel_height % 2 == 1 && kernel_width <= 1023 && kernel_height <= 1023,
          "GaussianBlur: kernel sizes must be odd and positive (at most 1023)");
  require(std::isfinite(sigma.second) && 0 < sigma.first && sigma.first <= sigma.second,
          "GaussianBlur: sigma must satisfy 0 < sigma.min <= sigma.max");
}

RandomRotation::RandomRotation(std::pair<double, double> degrees, Interpolation interpolation,
                               Fill fill, std::optional<std::array<double, 2>> center)
    : degrees(degrees), interpolation(interpolation), fill(fill), center(center) {
  validate();
}

void RandomRotation::validate() const {
  require(std::isfinite(degrees.first) && std::isfinite(degrees.second) &&
              degrees.first <= degrees.second,
          "RandomRotation: degrees must be a finite (min, max) range");
  check_fill(fill, "RandomRotation");
  check_center(center, "RandomRotation");
}

RandomAffine::RandomAffine(std::pair<double, double> degrees, Range translate, Range scale,
                           Range shear_x, Range shear_y, Interpolation interpolation, Fill fill,
                           std::optional<std::array<double, 2>> center)
    : degrees(degrees),
      translate(translate),
      scale(scale),
      shear_x(shear_x),
      shear_y(shear_y),
      interpolation(interpolation),
      fill(fill),
      center(center) {
  validate();
}

void RandomAffine::validate() const {
  require(std::isfinite(degrees.first) && std::isfinite(degrees.second) &&
              degrees.first <= degrees.second,
          "RandomAffine: degrees must be a finite (min, max) range");
  check_range(translate, 0, 1, "RandomAffine: translate fractions must be within [0, 1]");
  check_range(scale, 1e-9, HUGE_VAL, "RandomAffine: scale must be a positive range");
  check_range(shear_x, -HUGE_VAL, HUGE_VAL, "RandomAffine: shear must be finite ranges");
  check_range(shear_y, -HUGE_VAL, HUGE_VAL, "RandomAffine: shear must be finite ranges");
  check_fill(fill, "RandomAffine");
  check_center(center, "RandomAffine");
}

TrivialAugmentWide::TrivialAugmentWide(int num_magnitude_bins, Interpolation interpolation,
                                       Fill fill)
    : num_magnitude_bins(num_magnitude_bins), interpolation(interpolation), fill(fill) {
  validate();
}

void TrivialAugmentWide::validate() const {
  require(num_magnitude_bins >= 2 && num_magnitude_bins <= 1 << 16,
          "TrivialAugmentWide: num_magnitude_bins must be between 2 and 65536");
  check_fill(fill, "TrivialAugmentWide");
}

RandAugment::RandAugment(int num_ops, int magnitude, int num_magnitude_bins,
                         Interpolation interpolation, Fill fill)
    : num_ops(num_ops),
      magnitude(magnitude),
      num_magnitude_bins(num_magnitude_bins),
      interpolation(interpolation),
      fill(fill) {
  validate();
}

void RandAugment::validate() const {
  require(num_ops >= 0 && num_ops <= 64, "RandAugment: num_ops must be between 0 and 64");
  require(num_magnitude_bins >= 2 && num_magnitude_bins <= 1 << 16,
          "RandAugment: num_magnitude_bins must be between 2 and 65536");
  require(magnitude >= 0 && magnitude < num_magnitude_bins,
          "RandAugment: magnitude must be in [0, num_magnitude_bins)");
  check_fill(fill, "RandAugment");
}

AutoAugment::AutoAugment(AutoAugmentPolicy policy, Interpolation interpolation, Fill fill)
    : policy(policy), interpolation(interpolation), fill(fill) {
  validate();
}

void AutoAugment::validate() const { check_fill(fill, "AutoAugment"); }

RandomErasing::RandomErasing(double p, std::pair<double, double> scale,
                             std::pair<double, double> ratio, std::array<float, 3> value,
                             bool random_value)
    : p(p), scale(scale), ratio(ratio), value(value), random_value(random_value) {
  validate();
}

void RandomErasing::validate() const {
  require(probability(p), "RandomErasing: p must be in [0, 1]");
  require(0 <= scale.first && scale.first <= scale.second && scale.second <= 1,
          "RandomErasing: scale must satisfy 0 <= min <= max <= 1");
  require(0 < ratio.first && ratio.first <= ratio.second && std::isfinite(ratio.second),
          "RandomErasing: ratio must satisfy 0 < min <= max");
  for (float v : value) require(std::isfinite(v), "RandomErasing: value must be finite");
}

RandomApply::RandomApply(double p, int count) : p(p), count(count) { validate(); }

void RandomApply::validate() const {
  require(probability(p), "RandomApply: p must be in [0, 1]");
  require(count >= 1, "RandomApply: it must cover at least one transform");
}

}  // namespace stoker::image
