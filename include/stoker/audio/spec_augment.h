// SpecAugment (Park et al., 2019): frequency and time masks on a sample's features, as
// torchaudio's FrequencyMasking/TimeMasking and Lhotse's SpecAugment draw them, from the sample's
// own SampleRng, so that the masks depend on (seed, epoch, index) only: the same whatever the
// worker count, and the same again after a resume.
//
// Per sample of `frames` x `bins` features, in this order:
// - freq_masks frequency masks: each a width w drawn uniformly in [0, min(freq_width, bins)] and
//   a start uniformly in [0, bins - w]; the w columns are set to the mask value in every frame.
// - time masks: Lhotse's cap first. The widest a mask may be is time_width frames (or, for a
//   time_width in (0, 1), that fraction of the sample's frames, floored), and all of them
//   together at most max_time_fraction of the frames: n = min(time_masks, ceil(cap / widest))
//   masks (cap = max_time_fraction x frames), each at most min(widest, floor(cap / n)) frames,
//   drawn as the frequency masks are along the frames.
// Masks may overlap, as in both libraries. The mask value is 0, or (mask_mean) the mean of the
// sample's features before any mask (Lhotse's). No time warp.
//
// Contract: a pure function of its arguments; only the sample's own frames are touched (never
// the padding after them).
#pragma once

#include <cstdint>

#include "stoker/random.h"

namespace stoker::audio {

struct SpecAugmentOptions {
  int freq_masks = 2;
  int freq_width = 27;  // bins
  int time_masks = 2;
  double time_width = 100;          // >= 1: frames; in (0, 1): a fraction of the sample's frames
  double max_time_fraction = 0.15;  // Lhotse's max_frames_mask_fraction; 1: no cap
  bool mask_mean = false;           // the mask value: the sample's mean, else 0
};

// REQUIRES: options that SpecAugmentOptions::validate() accepts.
void spec_augment(const SpecAugmentOptions& options, SampleRng& rng, float* features,
                  int64_t frames, int bins);

// Throws InvalidArgument for counts or widths < 0, a time_width that is neither >= 1 nor in
// (0, 1), or a max_time_fraction outside (0, 1].
void validate(const SpecAugmentOptions& options);

}  // namespace stoker::audio
