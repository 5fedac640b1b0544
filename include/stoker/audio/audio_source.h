// AudioSource: recordings and cuts of audio files, decoded, resampled and (optionally) turned into
// features by the worker threads, straight into batch slots.
//
// Sample i is clip i: `duration` seconds of a file from `offset` (a whole recording: offset 0 and
// its duration from the header), or of a member of the source's AudioMembers (a tar shard's
// member, a table's cell: audio_members.h), decoded from memory the same way. Fields:
// - "audio": float32, ragged, [samples] (mono) or [samples, channels]: the clip at
//   AudioOptions::sample_rate; or, with AudioOptions::features, "features": float32, ragged,
//   [frames, bins];
// - "index": int64 scalar, the clip's index (the Python side looks its transcript up by it);
// - with labels (AudioLabels), "labels": int64 [the most ids a clip has], the clip's token ids
//   and kLabelPad after them, and "labels_lens": int64 scalar, how many ids it has;
// - with AudioOptions::speeds, "perturbed_length": int64 scalar, the sample's rows (samples or
//   frames) at the speed drawn for it: length() is then a bound, the rows at the slowest speed,
//   and the rows between the two are zeros.
// length(i) is round(duration x sample_rate) samples (or the frames of that many), divided by
// the slowest speed factor and rounded up where there are speeds: from the header or the
// manifest, never from decoding, so that a Budget plans an epoch without reading. A clip that
// decodes to fewer samples than it should by at most duration_tolerance seconds is padded with
// zeros; one longer is cut.
// With AudioOptions::speeds, a factor is drawn per sample from its SampleRng and the clip comes
// out 1 / factor as long (decoder.h); with AudioOptions::augment, SpecAugment masks the features
// (spec_augment.h), drawing after the speed.
//
// Contract:
// - Thread safety: immutable but for its counters (atomic); read() is safe from any number of
//   threads, each with its own WorkerState (a decoder and the features' scratch).
// - Errors: read() throws IoError or DecodeError (decoder.h), naming the file and the time, and
//   DecodeError for a clip that decodes to more than duration_tolerance seconds less than its
//   duration says (a truncated file, a manifest that disagrees with the audio) and for a file with
//   other than AudioOptions::channels channels (mono = false). The loader names the sample.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stoker/audio/audio_members.h"
#include "stoker/audio/decoder.h"
#include "stoker/audio/features.h"
#include "stoker/audio/spec_augment.h"
#include "stoker/source.h"

namespace stoker {

struct AudioClip {
  std::string path;     // the file; for a member, its name in errors ("shard.tar:key")
  double offset = 0;    // seconds into the file
  double duration = 0;  // seconds, > 0
  int64_t member = -1;  // >= 0: the audio is this member of the source's AudioMembers
};

struct AudioOptions {
  int sample_rate = 16000;
  bool mono = true;
  int channels = 1;                 // without mono: the channels every file has
  double max_duration = 0;          // seconds: the longest clip (> 0); longer clips are cut to it
  double duration_tolerance = 0.1;  // seconds a clip may decode short of its duration
  std::optional<audio::FeatureOptions> features;
  // SpecAugment's masks on the features (spec_augment.h), drawn from the sample's SampleRng.
  // REQUIRES: features.
  std::optional<audio::SpecAugmentOptions> augment;
  // Speed perturbation (decoder.h's DecodeOptions::speed): a factor per sample and epoch, drawn
  // uniformly from these by the sample's SampleRng. Empty: none. REQUIRES: each > 0.
  std::vector<double> speeds;
};

// A transcript's token ids per clip, tokenized by the caller (the audio wing knows no tokenizer):
// clip i's are ids[offsets[i], offsets[i + 1]). Empty offsets: no labels.
struct AudioLabels {
  std::vector<int64_t> ids;
  std::vector<uint64_t> offsets;  // clips + 1 of them, from 0, non-decreasing, to ids.size()
};

// What "labels" holds after a clip's ids: the index PyTorch's cross-entropy (and Hugging Face's
// speech models) ignore.
inline constexpr int64_t kLabelPad = -100;

struct AudioStats {
  uint64_t clips = 0;
  double seconds = 0;           // audio delivered
  double decoded_seconds = 0;   // audio decoded (a cut's pre-roll and trimmed frames too)
  double decode_seconds = 0;    // worker time demuxing and decoding
  double resample_seconds = 0;  // worker time resampling and mixing
  double features_seconds = 0;  // worker time computing features
};

class AudioSource final : public Source {
 public:
  // REQUIRES: every clip's duration > 0 and offset >= 0, options.sample_rate > 0,
  // options.max_duration > 0, channels >= 1, labels' offsets empty or as AudioLabels says
  // (InvalidArgument otherwise), members given where a clip names one (and holding it).
  AudioSource(std::vector<AudioClip> clips, AudioOptions options, AudioLabels labels = {},
              std::shared_ptr<const audio::AudioMembers> members = nullptr);

  uint64_t size() const override { return clips_.size(); }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  std::string path(uint64_t index) const override { return clips_[index].path; }
  uint64_t length(uint64_t index) const override;
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  std::unique_ptr<WorkerState> make_worker_state() const override;

  // Samples of clip `index` at the output rate, before any speed perturbation.
  uint64_t samples(uint64_t index) const;
  const AudioOptions& options() const { return options_; }
  AudioStats stats() const;

 private:
  std::vector<AudioClip> clips_;
  AudioOptions options_;
  AudioLabels labels_;
  std::shared_ptr<const audio::AudioMembers> members_;
  size_t length_slot_ = 0;  // the slot of "perturbed_length" (with speeds)
  std::optional<audio::FeatureExtractor> features_;
  std::vector<FieldSpec> fields_;
  uint64_t max_samples_ = 0;
  double slowest_ = 1;  // the slowest speed factor

  // The most samples `samples` of a clip come out as at any of the speeds.
  uint64_t bound_samples(uint64_t samples) const;

  mutable std::atomic<uint64_t> clips_read_{0};
  mutable std::atomic<uint64_t> samples_read_{0};
  mutable std::atomic<int64_t> decoded_us_{0};  // microseconds of audio decoded
  mutable std::atomic<int64_t> decode_ns_{0};
  mutable std::atomic<int64_t> resample_ns_{0};
  mutable std::atomic<int64_t> features_ns_{0};
};

}  // namespace stoker
