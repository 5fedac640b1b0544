// Speech features of a waveform, computed with libavutil's FFT (av_tx): Kaldi's filterbank
// (Fbank) and Whisper's log-mel spectrogram (LogMel). An n_fft that av_tx has no fast transform
// for (Whisper's 400) is split into interleaved subsequences of a length it has (src/audio/
// features.cc): the same spectrum, without av_tx's naive O(n^2) fallback.
//
// Fbank, as Kaldi's compute-fbank-feats and torchaudio.compliance.kaldi.fbank: frames of
// frame_length ms every frame_shift ms, snip_edges (frames only where they fit whole: 1 +
// (n - length) / shift of them), each: DC offset removed, pre-emphasis, Povey window, zero-padded
// to a power of two, power spectrum, Kaldi's mel filterbank (1127 ln(1 + f / 700), triangles from
// low_freq to high_freq), the log of each energy floored at FLT_EPSILON. No dither (the features
// are a pure function of the samples), no energy column. The waveform is taken as it is (floats
// in [-1, 1], as torchaudio and Lhotse take it), not scaled to 16-bit integers.
//
// LogMel, as transformers' WhisperFeatureExtractor: a centred STFT (the waveform reflected by
// n_fft / 2 at each end) with a periodic Hann window of n_fft samples every hop, power spectrum,
// the Slaney-normalized Slaney-scale mel filterbank from 0 to sample_rate / 2, log10 floored at
// 1e-10, the last frame dropped, floored at the maximum less 8, then (x + 4) / 4. With pad_30s the
// waveform is first padded with zeros (or cut) to 30 s, as Whisper's default is.
//
// Contract: a FeatureExtractor is immutable and safe from any number of threads, each with its
// own FeatureScratch (which holds the FFT context). Features are [frames, bins] floats, row-major.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace stoker::audio {

struct FeatureOptions {
  enum class Kind { kFbank, kLogMel };
  Kind kind = Kind::kFbank;
  int sample_rate = 16000;
  int num_mel_bins = 80;
  // Fbank
  double frame_length_ms = 25;
  double frame_shift_ms = 10;
  double preemphasis = 0.97;
  bool remove_dc_offset = true;
  double low_freq = 20;
  double high_freq = 0;  // <= 0: offset from the Nyquist frequency (Kaldi's convention)
  // LogMel
  int n_fft = 400;
  int hop_length = 160;
  bool pad_30s = false;
};

class FeatureScratch {
 public:
  FeatureScratch();
  ~FeatureScratch();
  FeatureScratch(const FeatureScratch&) = delete;
  FeatureScratch& operator=(const FeatureScratch&) = delete;

 private:
  friend class FeatureExtractor;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class FeatureExtractor {
 public:
  // REQUIRES: options that make frames of at least 2 samples and a hop of at least 1, mel bins
  // >= 1, frequencies within the Nyquist frequency (InvalidArgument otherwise).
  explicit FeatureExtractor(FeatureOptions options);

  const FeatureOptions& options() const { return options_; }
  int bins() const { return options_.num_mel_bins; }
  // Frames made from `samples` samples.
  int64_t frames(int64_t samples) const;
  // The features of `wave` into `out` (frames(wave.size()) x bins() floats).
  void compute(std::span<const float> wave, float* out, FeatureScratch& scratch) const;

 private:
  FeatureOptions options_;
  int window_length_ = 0;  // samples a frame covers
  int shift_ = 0;
  int fft_length_ = 0;
  std::vector<float> window_;
  // The filterbank, per mel bin: its first FFT bin and weights.
  std::vector<int> first_bin_;
  std::vector<std::vector<float>> weights_;
};

}  // namespace stoker::audio
