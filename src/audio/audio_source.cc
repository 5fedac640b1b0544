#include "stoker/audio/audio_source.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker {
namespace {

struct AudioWorker final : WorkerState {
  audio::AudioDecoder decoder;
  audio::FeatureScratch scratch;
  std::vector<float> wave;
  std::vector<std::byte> member;  // a member's bytes, where they are copied (tar shards)
};

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", s);
  return buf;
}

int64_t nanos(std::chrono::steady_clock::duration d) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(d).count();
}

}  // namespace

AudioSource::AudioSource(std::vector<AudioClip> clips, AudioOptions options, AudioLabels labels,
                         std::shared_ptr<const audio::AudioMembers> members)
    : clips_(std::move(clips)),
      options_(std::move(options)),
      labels_(std::move(labels)),
      members_(std::move(members)) {
  const AudioOptions& o = options_;
  if (o.sample_rate <= 0 || !(o.max_duration > 0) || o.channels < 1 || !(o.duration_tolerance >= 0))
    throw InvalidArgument(
        "AudioSource: needs a positive sample rate, max_duration and channels, and a "
        "duration_tolerance >= 0");
  for (double f : o.speeds) {
    if (!(f > 0) || !std::isfinite(f))
      throw InvalidArgument("AudioSource: speed factors must be positive, got " +
                            std::to_string(f));
  }
  for (const AudioClip& c : clips_) {
    if (!(c.duration > 0) || !(c.offset >= 0) || !std::isfinite(c.duration))
      throw InvalidArgument("AudioSource: " + c.path +
                            ": a clip needs a duration > 0 and an "
                            "offset >= 0 (got offset " +
                            seconds_text(c.offset) + " s, duration " + seconds_text(c.duration) +
                            " s)");
    if (c.member >= 0 && (!members_ || static_cast<uint64_t>(c.member) >= members_->size()))
      throw InvalidArgument("AudioSource: " + c.path + ": member " + std::to_string(c.member) +
                            " of " + std::to_string(members_ ? members_->size() : 0));
  }
  max_samples_ = static_cast<uint64_t>(std::llround(o.max_duration * o.sample_rate));
  if (!o.speeds.empty()) slowest_ = *std::min_element(o.speeds.begin(), o.speeds.end());
  const auto bound = static_cast<int64_t>(bound_samples(max_samples_));
  if (o.augment && !o.features)
    throw InvalidArgument("AudioSource: SpecAugment masks features: it needs features");
  if (o.features) {
    if (o.features->sample_rate != o.sample_rate || !o.mono)
      throw InvalidArgument("AudioSource: features need mono audio at their own sample rate");
    features_.emplace(*o.features);
    if (o.augment) audio::validate(*o.augment);
    const int64_t frames = features_->frames(bound);
    fields_.push_back({"features",
                       kFloat32,
                       {std::max<int64_t>(frames, 1), features_->bins()},
                       /*ragged=*/true});
  } else if (o.mono) {
    fields_.push_back({"audio", kFloat32, {bound}, true});
  } else {
    fields_.push_back({"audio", kFloat32, {bound, o.channels}, true});
  }
  fields_.push_back({"index", kInt64, {}});
  if (!labels_.offsets.empty()) {
    const std::vector<uint64_t>& at = labels_.offsets;
    if (at.size() != clips_.size() + 1 || at.front() != 0 || at.back() != labels_.ids.size() ||
        !std::is_sorted(at.begin(), at.end()))
      throw InvalidArgument(
          "AudioSource: label offsets must be one more than the clips, from 0, non-decreasing, "
          "to the number of ids");
    uint64_t most = 1;  // a field of at least one id, so that no shape is empty
    for (size_t i = 0; i + 1 < at.size(); ++i) most = std::max(most, at[i + 1] - at[i]);
    fields_.push_back({"labels", kInt64, {static_cast<int64_t>(most)}});
    fields_.push_back({"labels_lens", kInt64, {}});
  }
  if (!o.speeds.empty()) {
    length_slot_ = fields_.size();
    fields_.push_back({"perturbed_length", kInt64, {}});
  }
}

uint64_t AudioSource::samples(uint64_t index) const {
  const auto n = static_cast<uint64_t>(std::llround(clips_[index].duration * options_.sample_rate));
  return std::min(n, max_samples_);
}

uint64_t AudioSource::bound_samples(uint64_t samples) const {
  if (options_.speeds.empty()) return samples;
  return static_cast<uint64_t>(std::ceil(static_cast<double>(samples) / slowest_));
}

uint64_t AudioSource::length(uint64_t index) const {
  const uint64_t n = bound_samples(samples(index));
  return features_ ? static_cast<uint64_t>(features_->frames(static_cast<int64_t>(n))) : n;
}

std::unique_ptr<WorkerState> AudioSource::make_worker_state() const {
  return std::make_unique<AudioWorker>();
}

void AudioSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                       WorkerState* state) const {
  auto& w = static_cast<AudioWorker&>(*state);
  const AudioClip& clip = clips_[key.index];
  SampleRng rng(key.seed, key.epoch, key.index);
  const uint64_t want = samples(key.index);
  const double seconds = static_cast<double>(want) / options_.sample_rate;
  const std::vector<double>& speeds = options_.speeds;
  const double speed =
      speeds.empty() ? 1.0 : speeds[rng.uniform_int(0, static_cast<int64_t>(speeds.size()))];
  // At a speed, `seconds` of the file come out 1 / speed as long.
  const uint64_t out = speeds.empty() ? want : static_cast<uint64_t>(std::llround(want / speed));
  audio::DecodeTimes times;
  const audio::DecodeOptions how{options_.sample_rate, options_.mono, speed};
  const int channels = clip.member >= 0
                           ? w.decoder.decode(members_->bytes(static_cast<uint64_t>(clip.member),
                                                              w.member, clip.path),
                                              clip.path, clip.offset, seconds, how, w.wave, &times)
                           : w.decoder.decode(clip.path, clip.offset, seconds, how, w.wave, &times);
  if (channels != (options_.mono ? 1 : options_.channels)) {
    throw DecodeError(clip.path + ": has " + std::to_string(channels) + " channels, not " +
                      std::to_string(options_.channels) +
                      " as the first file's (pass mono=True to average them)");
  }
  const uint64_t got = w.wave.size() / channels;
  if (static_cast<double>(got) + options_.duration_tolerance * options_.sample_rate / speed <
      static_cast<double>(out)) {
    throw DecodeError(clip.path + ": decoded " +
                      seconds_text(static_cast<double>(got) * speed / options_.sample_rate) +
                      " s from t=" + seconds_text(clip.offset) + " s, where its duration says " +
                      seconds_text(seconds) + " s (to t=" + seconds_text(clip.offset + seconds) +
                      " s): a truncated file, or a manifest that disagrees with the audio");
  }
  w.wave.resize(out * channels, 0.0f);  // within the tolerance: padded, or cut to the duration
  // The rows this sample has, and the rows its slot has (length(): the slowest speed's).
  uint64_t rows = out;
  const uint64_t slot_rows = length(key.index);
  size_t row_floats = static_cast<size_t>(channels);
  if (features_) {
    const auto t0 = std::chrono::steady_clock::now();
    auto* feats = reinterpret_cast<float*>(slots[0]);
    features_->compute(w.wave, feats, w.scratch);
    rows = static_cast<uint64_t>(features_->frames(static_cast<int64_t>(out)));
    row_floats = static_cast<size_t>(features_->bins());
    if (options_.augment) {
      audio::spec_augment(*options_.augment, rng, feats, static_cast<int64_t>(rows),
                          features_->bins());
    }
    features_ns_ += nanos(std::chrono::steady_clock::now() - t0);
  } else if (!w.wave.empty()) {  // (a clip shorter than half a sample has none: no source)
    std::memcpy(slots[0], w.wave.data(), w.wave.size() * sizeof(float));
  }
  if (slot_rows > rows) {  // a faster speed than the slowest: zeros to the slot's length
    std::memset(slots[0] + rows * row_floats * sizeof(float), 0,
                (slot_rows - rows) * row_floats * sizeof(float));
  }
  const auto index = static_cast<int64_t>(key.index);
  std::memcpy(slots[1], &index, sizeof index);
  if (!labels_.offsets.empty()) {
    const uint64_t from = labels_.offsets[key.index], to = labels_.offsets[key.index + 1];
    auto* ids = reinterpret_cast<int64_t*>(slots[2]);
    std::copy(labels_.ids.begin() + static_cast<ptrdiff_t>(from),
              labels_.ids.begin() + static_cast<ptrdiff_t>(to), ids);
    std::fill(ids + (to - from), ids + fields_[2].shape[0], kLabelPad);
    const auto n = static_cast<int64_t>(to - from);
    std::memcpy(slots[3], &n, sizeof n);
  }
  if (!speeds.empty()) {
    const auto n = static_cast<int64_t>(rows);
    std::memcpy(slots[length_slot_], &n, sizeof n);
  }
  clips_read_ += 1;
  samples_read_ += out;
  decoded_us_ += static_cast<int64_t>(times.decoded * 1e6);
  decode_ns_ += static_cast<int64_t>(times.decode * 1e9);
  resample_ns_ += static_cast<int64_t>(times.resample * 1e9);
}

AudioStats AudioSource::stats() const {
  AudioStats s;
  s.clips = clips_read_.load();
  s.seconds = static_cast<double>(samples_read_.load()) / options_.sample_rate;
  s.decoded_seconds = decoded_us_.load() * 1e-6;
  s.decode_seconds = decode_ns_.load() * 1e-9;
  s.resample_seconds = resample_ns_.load() * 1e-9;
  s.features_seconds = features_ns_.load() * 1e-9;
  return s;
}

}  // namespace stoker
