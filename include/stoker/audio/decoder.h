// Audio files decoded and resampled with FFmpeg: WAV/PCM, FLAC, MP3, Opus and Vorbis (whatever
// decoders the linked libavcodec has) to float32 at a chosen rate, mono (the channels averaged) or
// with the file's channels, interleaved.
//
// Resampling is libswresample's, with its soxr engine (libsoxr, "high quality": 20-bit precision,
// its passband to 0.913 of the lower Nyquist frequency) where the linked libswresample was built
// with it, else its own windowed-sinc filter at its defaults: resampler_name() says which.
// docs/audio.md states the tolerance measured against scipy.signal.resample_poly.
//
// Encoded audio in memory (a tar member, a Parquet cell) decodes as a file does: FFmpeg reads the
// bytes through an AVIOContext (read and seek over them), probes the container by its content,
// and everything after the input is open is one path for both, so that the same bytes decode to
// the same samples either way.
//
// Contract:
// - Thread safety: probe() and resampler_name() are safe from any thread. An AudioDecoder is one
//   thread's (a worker's state); distinct decoders run concurrently.
// - A cut (offset, duration) seeks to the offset (the packet at or before it, less a short
//   pre-roll for the codecs that need one) and decodes only to its end: never the whole file for
//   a slice of it. Samples are trimmed at the file's rate, before resampling, by the frames'
//   timestamps.
// - Errors: IoError (a file that cannot be opened or read) or DecodeError naming the file and,
//   where there is one, the time in seconds (an empty file, bytes that are no audio, no audio
//   stream, an unsupported codec, corrupt data, an offset past the end).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace stoker::audio {

// What a file's header and container say, without decoding.
struct AudioInfo {
  double duration = 0;  // seconds; 0 where the container does not say
  int sample_rate = 0;
  int channels = 0;
  std::string codec;  // FFmpeg's name: "pcm_s16le", "flac", "mp3", "opus", "vorbis"
};

// Throws as AudioDecoder::decode does for a file that cannot be opened.
AudioInfo probe(const std::string& path);
// The same for encoded audio in memory; `name` names it in errors ("shard.tar:key"). The bytes
// are read during the call only.
AudioInfo probe(std::span<const std::byte> bytes, const std::string& name);

// "soxr" or "swr": libswresample's engine this build resamples with (see above).
std::string resampler_name();

// FFmpeg's libraries as linked: "libavformat 59.27.100, ...".
std::string ffmpeg_versions();

struct DecodeOptions {
  int sample_rate = 16000;  // the output rate
  bool mono = true;         // average the channels
  // Speed perturbation (sox's `speed`, Lhotse's PerturbSpeed): the audio is resampled as if its
  // rate were round(file rate x speed), so it comes out 1 / speed as long with its pitch times
  // speed. 1: none. REQUIRES: > 0.
  double speed = 1;
};

// Worker seconds spent in each stage of the last decode() calls (added to, never reset).
struct DecodeTimes {
  double decode = 0;    // demuxing and decoding
  double resample = 0;  // resampling and mixing to mono
  double decoded = 0;   // seconds of audio the decoder made, pre-roll and trimmed frames included
};

class AudioDecoder {
 public:
  AudioDecoder();
  ~AudioDecoder();
  AudioDecoder(const AudioDecoder&) = delete;
  AudioDecoder& operator=(const AudioDecoder&) = delete;

  // Decodes [offset, offset + duration) seconds of `path` (duration <= 0: to the end) into `out`
  // (replaced: frames x channels floats, interleaved) and returns the channel count (1 when
  // options.mono). The output may differ from duration x rate by the container's rounding: the
  // caller checks it against what it expected. REQUIRES: offset >= 0, options.sample_rate > 0.
  int decode(const std::string& path, double offset, double duration, const DecodeOptions& options,
             std::vector<float>& out, DecodeTimes* times = nullptr);
  // The same for encoded audio in memory (read during the call only), named `name` in errors.
  int decode(std::span<const std::byte> bytes, const std::string& name, double offset,
             double duration, const DecodeOptions& options, std::vector<float>& out,
             DecodeTimes* times = nullptr);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker::audio
