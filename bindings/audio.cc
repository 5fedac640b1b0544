// The extension module stoker._audio: the audio wing (src/audio/), apart from stoker._native
// because it links FFmpeg's libraries (libswresample among them), which a user without audio need
// not have. Its AudioSource derives from stoker._native's Source, whose module it imports first;
// nanobind shares the types and the exception translation (errors.cc) between the modules.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <span>

#include "stoker/audio/audio_members.h"
#include "stoker/audio/audio_source.h"
#include "stoker/audio/decoder.h"
#include "stoker/audio/features.h"
#include "stoker/audio/spec_augment.h"
#include "stoker/errors.h"
#include "stoker/shard_cache.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace stoker::python {
namespace {

using FloatArray = nb::ndarray<nb::numpy, float>;
using Int64Array = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using ByteArray = nb::ndarray<const uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

FloatArray to_numpy(std::vector<float> data, std::vector<size_t> shape) {
  auto* v = new std::vector<float>(std::move(data));
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  return FloatArray(v->data(), shape.size(), shape.data(), owner);
}

nb::dict info_dict(const audio::AudioInfo& info) {
  nb::dict out;
  out["duration"] = info.duration;
  out["sample_rate"] = info.sample_rate;
  out["channels"] = info.channels;
  out["codec"] = info.codec;
  return out;
}

// A file by its path, or encoded audio in memory (bytes).
nb::dict probe(const nb::object& source) {
  audio::AudioInfo info;
  if (nb::isinstance<nb::bytes>(source)) {
    const auto data = nb::borrow<nb::bytes>(source);
    const std::span<const std::byte> bytes(static_cast<const std::byte*>(data.data()), data.size());
    nb::gil_scoped_release release;
    info = audio::probe(bytes, "<bytes>");
  } else {
    const std::string path = nb::cast<std::string>(source);
    nb::gil_scoped_release release;
    info = audio::probe(path);
  }
  return info_dict(info);
}

std::vector<audio::TarMemberRef> tar_refs(
    const std::vector<std::tuple<uint32_t, uint64_t, uint64_t>>& refs) {
  std::vector<audio::TarMemberRef> out;
  out.reserve(refs.size());
  for (const auto& [shard, offset, size] : refs) out.push_back({shard, offset, size});
  return out;
}

// A file by its path, or encoded audio in memory (bytes).
FloatArray decode(const nb::object& source, double offset, double duration, int sample_rate,
                  bool mono) {
  std::vector<float> out;
  int channels = 0;
  if (nb::isinstance<nb::bytes>(source)) {
    const auto data = nb::borrow<nb::bytes>(source);  // held: the bytes outlive the call
    const std::span<const std::byte> bytes(static_cast<const std::byte*>(data.data()), data.size());
    nb::gil_scoped_release release;
    audio::AudioDecoder decoder;
    channels = decoder.decode(bytes, "<bytes>", offset, duration, {sample_rate, mono}, out);
  } else {
    const std::string path = nb::cast<std::string>(source);
    nb::gil_scoped_release release;
    audio::AudioDecoder decoder;
    channels = decoder.decode(path, offset, duration, {sample_rate, mono}, out);
  }
  const size_t frames = out.size() / channels;
  return mono ? to_numpy(std::move(out), {frames})
              : to_numpy(std::move(out), {frames, static_cast<size_t>(channels)});
}

FloatArray features(const audio::FeatureOptions& options,
                    nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu> wave) {
  const audio::FeatureExtractor x(options);
  const auto frames = static_cast<size_t>(x.frames(static_cast<int64_t>(wave.shape(0))));
  std::vector<float> out(frames * x.bins());
  {
    nb::gil_scoped_release release;
    audio::FeatureScratch scratch;
    x.compute({wave.data(), wave.shape(0)}, out.data(), scratch);
  }
  return to_numpy(std::move(out), {frames, static_cast<size_t>(x.bins())});
}

}  // namespace
}  // namespace stoker::python

NB_MODULE(_audio, m) {
  using namespace stoker;
  using namespace stoker::python;
  nb::module_::import_("stoker._native");  // Source, the exception translator

  m.def("ffmpeg_versions", &audio::ffmpeg_versions,
        "FFmpeg's libraries as linked: 'libavformat 59.27.100, ...'.");
  m.def("resampler", &audio::resampler_name,
        "libswresample's engine this build resamples with: 'soxr' or 'swr'.");
  m.def("probe", &probe, "source"_a,
        "An audio file's (a path) or encoded audio's (bytes) duration (seconds), sample_rate, "
        "channels and codec, from its header and "
        "container, without decoding.");
  m.def("decode", &decode, "source"_a, "offset"_a = 0.0, "duration"_a = 0.0,
        "sample_rate"_a = 16000, "mono"_a = true,
        "[offset, offset + duration) seconds of the file at a path, or of encoded audio in bytes "
        "(duration <= 0: to the end) as float32 at sample_rate: [T] mono, else [T, channels].");

  nb::class_<audio::AudioMembers>(m, "AudioMembers",
                                  "Encoded audio inside other files, by index "
                                  "(stoker/audio/audio_members.h).")
      .def("__len__", &audio::AudioMembers::size)
      .def(
          "probe",
          [](const audio::AudioMembers& members, const std::vector<std::string>& names,
             int threads) {
            std::vector<audio::MemberInfo> infos;
            {
              nb::gil_scoped_release release;
              infos = audio::probe_members(members, names, threads);
            }
            nb::list out;
            for (const audio::MemberInfo& i : infos)
              out.append(i.error.empty() ? nb::object(info_dict(i.info))
                                         : nb::object(nb::str(i.error.c_str())));
            return out;
          },
          "names"_a, "threads"_a = 1,
          "Each member's header (a dict as probe()'s), or the message why it cannot be read.");
  m.def(
      "tar_members",
      [](std::vector<std::string> shards,
         const std::vector<std::tuple<uint32_t, uint64_t, uint64_t>>& refs) {
        return std::shared_ptr<audio::AudioMembers>(
            std::make_shared<audio::TarAudioMembers>(std::move(shards), tar_refs(refs)));
      },
      "shards"_a, "members"_a,
      "Members of local tar shards: (shard index, data offset, size) each.");
  m.def(
      "remote_tar_members",
      [](std::shared_ptr<ShardCache> cache,
         const std::vector<std::tuple<uint32_t, uint64_t, uint64_t>>& refs) {
        return std::shared_ptr<audio::AudioMembers>(
            std::make_shared<audio::TarAudioMembers>(std::move(cache), tar_refs(refs)));
      },
      "cache"_a, "members"_a,
      "Members of remote tar shards (a stoker._native.remote.ShardCache): (shard index, data "
      "offset, size) each.");
  m.def(
      "buffer_members",
      [](ByteArray data, Int64Array offsets) {
        std::vector<std::byte> bytes(data.shape(0));
        if (!bytes.empty()) std::memcpy(bytes.data(), data.data(), bytes.size());
        std::vector<uint64_t> at;
        at.reserve(offsets.shape(0));
        for (size_t i = 0; i < offsets.shape(0); ++i) {
          if (offsets.data()[i] < 0) throw InvalidArgument("buffer_members: offsets must be >= 0");
          at.push_back(static_cast<uint64_t>(offsets.data()[i]));
        }
        return std::shared_ptr<audio::AudioMembers>(
            std::make_shared<audio::BufferAudioMembers>(std::move(bytes), std::move(at)));
      },
      "data"_a, "offsets"_a,
      "Members in one buffer (uint8): member i is data[offsets[i]:offsets[i + 1]].");

  nb::class_<audio::FeatureOptions> opts(m, "FeatureOptions");
  nb::enum_<audio::FeatureOptions::Kind>(opts, "Kind")
      .value("fbank", audio::FeatureOptions::Kind::kFbank)
      .value("logmel", audio::FeatureOptions::Kind::kLogMel);
  opts.def(nb::init<>())
      .def_rw("kind", &audio::FeatureOptions::kind)
      .def_rw("sample_rate", &audio::FeatureOptions::sample_rate)
      .def_rw("num_mel_bins", &audio::FeatureOptions::num_mel_bins)
      .def_rw("frame_length_ms", &audio::FeatureOptions::frame_length_ms)
      .def_rw("frame_shift_ms", &audio::FeatureOptions::frame_shift_ms)
      .def_rw("preemphasis", &audio::FeatureOptions::preemphasis)
      .def_rw("remove_dc_offset", &audio::FeatureOptions::remove_dc_offset)
      .def_rw("low_freq", &audio::FeatureOptions::low_freq)
      .def_rw("high_freq", &audio::FeatureOptions::high_freq)
      .def_rw("n_fft", &audio::FeatureOptions::n_fft)
      .def_rw("hop_length", &audio::FeatureOptions::hop_length)
      .def_rw("pad_30s", &audio::FeatureOptions::pad_30s)
      .def("frames", [](const audio::FeatureOptions& o, int64_t samples) {
        return audio::FeatureExtractor(o).frames(samples);
      });
  nb::class_<audio::SpecAugmentOptions>(m, "SpecAugmentOptions")
      .def(nb::init<>())
      .def_rw("freq_masks", &audio::SpecAugmentOptions::freq_masks)
      .def_rw("freq_width", &audio::SpecAugmentOptions::freq_width)
      .def_rw("time_masks", &audio::SpecAugmentOptions::time_masks)
      .def_rw("time_width", &audio::SpecAugmentOptions::time_width)
      .def_rw("max_time_fraction", &audio::SpecAugmentOptions::max_time_fraction)
      .def_rw("mask_mean", &audio::SpecAugmentOptions::mask_mean);

  m.def("features", &features, "options"_a, "wave"_a,
        "The features of a mono float32 waveform: [frames, bins] float32.");

  nb::class_<AudioSource, Source>(m, "AudioSource")
      .def(nb::new_([](const std::vector<std::tuple<std::string, double, double, int64_t>>& clips,
                       int sample_rate, bool mono, int channels, double max_duration,
                       double duration_tolerance, std::optional<audio::FeatureOptions> features,
                       std::optional<audio::SpecAugmentOptions> augment, std::vector<double> speeds,
                       std::optional<Int64Array> label_ids, std::optional<Int64Array> label_offsets,
                       std::shared_ptr<audio::AudioMembers> members) {
             std::vector<AudioClip> cs;
             cs.reserve(clips.size());
             for (const auto& [path, offset, duration, member] : clips)
               cs.push_back({path, offset, duration, member});
             AudioOptions o;
             o.sample_rate = sample_rate;
             o.mono = mono;
             o.channels = channels;
             o.max_duration = max_duration;
             o.duration_tolerance = duration_tolerance;
             o.features = features;
             o.augment = augment;
             o.speeds = std::move(speeds);
             AudioLabels labels;  // ids + offsets, as NumPy made them (dataset.py)
             if (label_ids && label_offsets) {
               labels.ids.assign(label_ids->data(), label_ids->data() + label_ids->shape(0));
               labels.offsets.reserve(label_offsets->shape(0));
               for (size_t i = 0; i < label_offsets->shape(0); ++i) {
                 const int64_t at = label_offsets->data()[i];
                 if (at < 0) throw InvalidArgument("AudioSource: label offsets must be >= 0");
                 labels.offsets.push_back(static_cast<uint64_t>(at));
               }
             }
             return std::make_shared<AudioSource>(std::move(cs), o, std::move(labels),
                                                  std::move(members));
           }),
           "clips"_a, "sample_rate"_a, "mono"_a, "channels"_a, "max_duration"_a,
           "duration_tolerance"_a, "features"_a.none(), "augment"_a.none() = nb::none(),
           "speeds"_a = std::vector<double>{}, "label_ids"_a.none() = nb::none(),
           "label_offsets"_a.none() = nb::none(), "members"_a.none() = nb::none(),
           "Clips (stoker/audio/audio_source.h): (path, offset seconds, duration seconds, member) "
           "each; member -1: the audio file at path; >= 0: that member of members (AudioMembers), "
           "which path names.")
      .def("stats", [](const AudioSource& s) {
        const AudioStats a = s.stats();
        nb::dict out;
        out["clips"] = a.clips;
        out["seconds"] = a.seconds;
        out["decoded_seconds"] = a.decoded_seconds;
        out["decode_seconds"] = a.decode_seconds;
        out["resample_seconds"] = a.resample_seconds;
        out["features_seconds"] = a.features_seconds;
        return out;
      });
}
