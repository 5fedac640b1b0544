#include "stoker/audio/spec_augment.h"

#include <algorithm>
#include <cmath>

#include "stoker/errors.h"

namespace stoker::audio {

void validate(const SpecAugmentOptions& o) {
  if (o.freq_masks < 0 || o.freq_width < 0 || o.time_masks < 0)
    throw InvalidArgument("SpecAugment: mask counts and widths must be >= 0");
  if (!(o.time_width >= 1 || (o.time_width > 0 && o.time_width < 1)) ||
      !std::isfinite(o.time_width))
    throw InvalidArgument("SpecAugment: time_width must be frames >= 1 or a fraction in (0, 1)");
  if (!(o.max_time_fraction > 0 && o.max_time_fraction <= 1))
    throw InvalidArgument("SpecAugment: max_time_fraction must be in (0, 1]");
}

void spec_augment(const SpecAugmentOptions& o, SampleRng& rng, float* features, int64_t frames,
                  int bins) {
  if (frames <= 0 || bins <= 0) return;
  float value = 0;
  if (o.mask_mean) {
    double sum = 0;
    for (int64_t i = 0; i < frames * bins; ++i) sum += features[i];
    value = static_cast<float>(sum / static_cast<double>(frames * bins));
  }
  // A band of at most `limit` of `size` positions: width, then start where it fits.
  const auto band = [&rng](int64_t limit, int64_t size) {
    const int64_t width = rng.uniform_int(0, std::min(limit, size) + 1);
    const int64_t start = rng.uniform_int(0, size - width + 1);
    return std::pair{start, width};
  };
  for (int m = 0; m < o.freq_masks; ++m) {
    const auto [start, width] = band(o.freq_width, bins);
    for (int64_t t = 0; t < frames; ++t) std::fill_n(features + t * bins + start, width, value);
  }
  if (o.time_masks == 0) return;
  const double cap = o.max_time_fraction * static_cast<double>(frames);
  const double widest =
      o.time_width >= 1 ? std::floor(o.time_width) : std::floor(o.time_width * frames);
  if (widest < 1 || cap < 1) return;
  const auto masks = static_cast<int>(std::min<double>(o.time_masks, std::ceil(cap / widest)));
  const auto limit = static_cast<int64_t>(std::min(widest, std::floor(cap / masks)));
  for (int m = 0; m < masks; ++m) {
    const auto [start, width] = band(limit, frames);
    std::fill_n(features + start * bins, width * bins, value);
  }
}

}  // namespace stoker::audio
