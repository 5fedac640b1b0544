// An audio file through the audio wing: probe (the header's duration), AudioDecoder (FFmpeg's
// demuxers and decoders, a cut's seek and trim, libswresample, a speed), then the Fbank of what
// decodes and SpecAugment's masks on it, and the same clip read by an AudioSource as a loader's
// worker reads it.
//
// The input is the file, then seven bytes (its last) that choose the output rate, mono, the cut's
// offset and duration (ms), and a speed. Checked: probing, decoding and reading throw nothing but
// DecodeError or IoError; a decode that succeeds returns whole frames of its channel count; the
// features have frames(samples) x bins values, and the masks leave their shape alone; an
// AudioSource writes exactly its sample's length, and its label ids. The same bytes decoded from
// memory (a tar member's path, decoder.h) fail as the file does or give the same samples, bit for
// bit.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "fuzz_file.h"
#include "image_fuzz.h"  // require()
#include "stoker/audio/audio_source.h"
#include "stoker/audio/decoder.h"
#include "stoker/audio/features.h"
#include "stoker/audio/spec_augment.h"
#include "stoker/errors.h"
#include "stoker/random.h"

namespace {

constexpr int kRates[] = {8000, 16000, 22050, 44100, 48000};
constexpr double kSpeeds[] = {1.0, 0.9, 1.1};
// The longest audio the checks below compute features of: a header may promise hours.
constexpr size_t kMaxFeatureSamples = 16000 * 4;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using stoker::fuzz::require;
  namespace audio = stoker::audio;
  static stoker::fuzz::FuzzFile file;
  static audio::AudioDecoder decoder;  // reused, as a worker's is from sample to sample
  static audio::FeatureScratch scratch;
  FuzzedDataProvider p(data, size);
  const int rate = kRates[p.ConsumeIntegral<uint8_t>() % std::size(kRates)];
  const bool mono = p.ConsumeBool();
  const double offset = p.ConsumeIntegral<uint16_t>() % 2000 / 1000.0;
  const double duration = p.ConsumeIntegral<uint16_t>() % 3000 / 1000.0;  // 0: to the end
  const double speed = kSpeeds[p.ConsumeIntegral<uint8_t>() % std::size(kSpeeds)];
  const std::vector<uint8_t> bytes = p.ConsumeRemainingBytes<uint8_t>();
  const std::string& path = file.write(bytes.data(), bytes.size());

  audio::AudioInfo info;
  try {
    info = audio::probe(path);
  } catch (const stoker::DecodeError&) {
  } catch (const stoker::IoError&) {
  }
  std::vector<float> wave;
  int channels = 0;
  try {
    channels = decoder.decode(path, offset, duration, {rate, mono, speed}, wave);
  } catch (const stoker::DecodeError&) {
    return 0;
  } catch (const stoker::IoError&) {
    return 0;
  }
  require(channels >= 1 && (!mono || channels == 1), "a decode of no channels, or not mono");
  require(wave.size() % static_cast<size_t>(channels) == 0, "a decode of partial frames");

  {
    std::vector<float> from_memory;
    int memory_channels = 0;
    try {
      memory_channels = decoder.decode(std::as_bytes(std::span(bytes)), "member", offset, duration,
                                       {rate, mono, speed}, from_memory);
    } catch (const stoker::DecodeError&) {
      require(false, "bytes that decode as a file fail from memory");
    }
    require(memory_channels == channels && from_memory.size() == wave.size() &&
                (wave.empty() ||
                 std::memcmp(from_memory.data(), wave.data(), wave.size() * sizeof(float)) == 0),
            "bytes decode from memory unlike their file");
  }

  if (mono && !wave.empty()) {
    audio::FeatureOptions o;
    o.sample_rate = rate;
    o.num_mel_bins = 23;
    const audio::FeatureExtractor fbank(o);
    const size_t n = std::min(wave.size(), kMaxFeatureSamples);
    const int64_t frames = fbank.frames(static_cast<int64_t>(n));
    require(frames >= 0, "a negative frame count");
    std::vector<float> feats(static_cast<size_t>(frames) * fbank.bins());
    fbank.compute({wave.data(), n}, feats.data(), scratch);
    stoker::SampleRng rng(size, bytes.empty() ? 0 : bytes[0], 0);
    audio::SpecAugmentOptions masks;
    masks.freq_width = 8;
    masks.time_width = 0.3;
    masks.max_time_fraction = 1.0;
    masks.mask_mean = bytes.size() % 2 == 1;
    audio::spec_augment(masks, rng, feats.data(), frames, fbank.bins());
  }

  // The clip as a loader's worker reads it: with the header's duration (or the decode's), cut
  // to a few seconds, sped up or down, with two label ids.
  const double seconds = std::min(
      4.0, info.duration > 0 ? info.duration : static_cast<double>(wave.size()) / channels / rate);
  if (!(seconds > 0) || !mono) return 0;
  stoker::AudioOptions options;
  options.sample_rate = 16000;
  options.max_duration = 4.0;
  options.speeds = {speed};
  stoker::AudioLabels labels{{7, 8}, {0, 2}};
  const stoker::AudioSource source({{path, 0.0, seconds}}, options, std::move(labels));
  const auto& fields = source.fields();
  std::vector<std::vector<std::byte>> buffers;
  std::vector<std::byte*> slots;
  for (const auto& f : fields) buffers.emplace_back(f.sample_bytes());
  for (auto& b : buffers) slots.push_back(b.data());
  const auto state = source.make_worker_state();
  try {
    source.read({1, 2, 0}, slots, state.get());
  } catch (const stoker::DecodeError&) {
    return 0;
  } catch (const stoker::IoError&) {
    return 0;
  }
  int64_t got = 0;
  std::memcpy(&got, slots.back(), sizeof got);  // "perturbed_length"
  require(got >= 0 && static_cast<uint64_t>(got) <= source.length(0),
          "a sample longer than its stated bound");
  int64_t ids[2];
  std::memcpy(ids, slots[2], sizeof ids);
  require(ids[0] == 7 && ids[1] == 8, "label ids not as given");
  return 0;
}
