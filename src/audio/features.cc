#include "stoker/audio/features.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <new>
#include <numbers>
#include <string>

#include "stoker/errors.h"

extern "C" {
#include <libavutil/mem.h>
#include <libavutil/tx.h>
}

namespace stoker::audio {
namespace {

constexpr int kWhisperSamples = 30 * 16000;  // Whisper's 30 s at its 16 kHz

double kaldi_mel(double hz) { return 1127.0 * std::log(1.0 + hz / 700.0); }

// Slaney's mel scale (librosa's htk=False, transformers' "slaney").
double slaney_mel(double hz) {
  constexpr double kMinLogHz = 1000.0, kMinLogMel = 15.0;
  const double logstep = 27.0 / std::log(6.4);
  return hz < kMinLogHz ? 3.0 * hz / 200.0 : kMinLogMel + std::log(hz / kMinLogHz) * logstep;
}

double slaney_hz(double mel) {
  constexpr double kMinLogHz = 1000.0, kMinLogMel = 15.0;
  const double logstep = std::log(6.4) / 27.0;
  return mel < kMinLogMel ? 200.0 * mel / 3.0 : kMinLogHz * std::exp(logstep * (mel - kMinLogMel));
}

struct TxFree {
  void operator()(AVTXContext* t) const { av_tx_uninit(&t); }
};
struct AvFree {
  void operator()(void* p) const { av_free(p); }
};

// How a real DFT of length n is computed with av_tx. Its fast transforms cover 2^k times one of
// 1, 3, 5, 7, 9 or 15; any other length (Whisper's n_fft of 400 = 16 x 25) falls back to a
// naive O(n^2) DFT that computes its twiddles as it goes, about 400 times slower here than the
// same work split: `parts` interleaved subsequences x[r], x[parts + r], ... (r < parts) of the
// longest fast length n / parts, each one complex FFT, combined per bin as
// X[k] = sum_r W_n^(r k) F_r[k mod (n / parts)]. parts == 1: one real FFT of n.
int split_parts(int n) {
  const int pow2 = n & -n, odd = n / pow2;
  for (int d : {15, 9, 7, 5, 3})
    if (odd % d == 0) return odd / d;
  return odd;
}

}  // namespace

struct FeatureScratch::Impl {
  int length = 0;
  int parts = 1;
  std::unique_ptr<AVTXContext, TxFree> tx;
  av_tx_fn fn = nullptr;
  std::unique_ptr<float, AvFree> in;
  std::unique_ptr<AVComplexFloat, AvFree> out;
  // Split transforms: one subsequence, each subsequence's FFT ([parts][n / parts]), and the
  // twiddles W_n^(r k) ([n / 2 + 1][parts]).
  std::unique_ptr<AVComplexFloat, AvFree> sub_in, sub_out;
  std::vector<AVComplexFloat> twiddles;
  std::vector<float> power;
  std::vector<float> padded;  // LogMel's reflected waveform
  std::vector<float> logmel;  // LogMel's [bins, frames] before the last frame is dropped

  void ready(int n) {
    if (length == n) return;
    AVTXContext* t = nullptr;
    const float scale = 1.0f;
    parts = split_parts(n);
    const int m = n / parts;
    const int ok = parts == 1 ? av_tx_init(&t, &fn, AV_TX_FLOAT_RDFT, 0, n, &scale, 0)
                              : av_tx_init(&t, &fn, AV_TX_FLOAT_FFT, 0, m, &scale, 0);
    if (ok < 0 || t == nullptr)
      throw Error("FeatureExtractor: libavutil has no FFT of length " + std::to_string(n));
    tx.reset(t);
    in.reset(static_cast<float*>(av_malloc(sizeof(float) * (n + 2))));
    out.reset(static_cast<AVComplexFloat*>(av_malloc(sizeof(AVComplexFloat) * (n / 2 + 1))));
    if (in == nullptr || out == nullptr) throw std::bad_alloc();
    if (parts > 1) {
      sub_in.reset(static_cast<AVComplexFloat*>(av_malloc(sizeof(AVComplexFloat) * m)));
      sub_out.reset(static_cast<AVComplexFloat*>(av_malloc(sizeof(AVComplexFloat) * n)));
      if (sub_in == nullptr || sub_out == nullptr) throw std::bad_alloc();
      twiddles.resize(static_cast<size_t>(n / 2 + 1) * parts);
      for (int k = 0; k <= n / 2; ++k)
        for (int r = 0; r < parts; ++r) {
          const double a = -2 * std::numbers::pi * ((static_cast<int64_t>(r) * k) % n) / n;
          twiddles[static_cast<size_t>(k) * parts + r] = {static_cast<float>(std::cos(a)),
                                                          static_cast<float>(std::sin(a))};
        }
    }
    power.resize(n / 2 + 1);
    length = n;
  }
  // The power spectrum of in[0, length) into power.
  void spectrum() {
    if (parts == 1) {
      fn(tx.get(), out.get(), in.get(), sizeof(float));
      const AVComplexFloat* c = out.get();
      for (int k = 0; k <= length / 2; ++k) power[k] = c[k].re * c[k].re + c[k].im * c[k].im;
      return;
    }
    const int m = length / parts;
    for (int r = 0; r < parts; ++r) {
      AVComplexFloat* x = sub_in.get();
      for (int j = 0; j < m; ++j) x[j] = {in.get()[j * parts + r], 0.0f};
      fn(tx.get(), sub_out.get() + static_cast<size_t>(r) * m, x, sizeof(AVComplexFloat));
    }
    const AVComplexFloat* f = sub_out.get();
    for (int k = 0; k <= length / 2; ++k) {
      const AVComplexFloat* w = twiddles.data() + static_cast<size_t>(k) * parts;
      const int km = k % m;
      float re = 0, im = 0;
      for (int r = 0; r < parts; ++r) {
        const AVComplexFloat v = f[static_cast<size_t>(r) * m + km];
        re += w[r].re * v.re - w[r].im * v.im;
        im += w[r].re * v.im + w[r].im * v.re;
      }
      power[k] = re * re + im * im;
    }
  }
};

FeatureScratch::FeatureScratch() : impl_(std::make_unique<Impl>()) {}
FeatureScratch::~FeatureScratch() = default;

FeatureExtractor::FeatureExtractor(FeatureOptions o) : options_(o) {
  if (o.sample_rate <= 0 || o.num_mel_bins < 1)
    throw InvalidArgument("FeatureExtractor: needs a positive sample rate and mel bins");
  const double nyquist = 0.5 * o.sample_rate;
  std::vector<double> centers;  // FFT bin frequencies
  if (o.kind == FeatureOptions::Kind::kFbank) {
    window_length_ = static_cast<int>(o.sample_rate * 0.001 * o.frame_length_ms);
    shift_ = static_cast<int>(o.sample_rate * 0.001 * o.frame_shift_ms);
    if (window_length_ < 2 || shift_ < 1)
      throw InvalidArgument("Fbank: frame_length and frame_shift make no frames");
    fft_length_ = 1;
    while (fft_length_ < window_length_) fft_length_ *= 2;
    window_.resize(window_length_);
    const double a = 2 * std::numbers::pi / (window_length_ - 1);
    for (int i = 0; i < window_length_; ++i)
      window_[i] = static_cast<float>(std::pow(0.5 - 0.5 * std::cos(a * i), 0.85));
    const double high = o.high_freq > 0 ? o.high_freq : nyquist + o.high_freq;
    if (!(o.low_freq >= 0 && o.low_freq < high && high <= nyquist))
      throw InvalidArgument("Fbank: needs 0 <= low_freq < high_freq <= the Nyquist frequency");
    // Kaldi's MelBanks: triangles equally spaced on its mel scale, over the FFT's bins below the
    // Nyquist one.
    const double lo = kaldi_mel(o.low_freq), hi = kaldi_mel(high);
    const double delta = (hi - lo) / (o.num_mel_bins + 1);
    const int bins = fft_length_ / 2;
    const double width = static_cast<double>(o.sample_rate) / fft_length_;
    for (int m = 0; m < o.num_mel_bins; ++m) {
      const double left = lo + m * delta, center = left + delta, right = center + delta;
      std::vector<float> w;
      int first = -1;
      for (int k = 0; k < bins; ++k) {
        const double mel = kaldi_mel(width * k);
        if (mel > left && mel < right) {
          if (first < 0) first = k;
          w.resize(k - first + 1, 0.0f);
          w[k - first] = static_cast<float>(mel <= center ? (mel - left) / (center - left)
                                                          : (right - mel) / (right - center));
        }
      }
      first_bin_.push_back(std::max(first, 0));
      weights_.push_back(std::move(w));
    }
  } else {
    if (o.n_fft < 2 || o.n_fft % 2 != 0 || o.hop_length < 1)
      throw InvalidArgument("LogMel: needs an even n_fft >= 2 and a hop >= 1");
    window_length_ = fft_length_ = o.n_fft;
    shift_ = o.hop_length;
    window_.resize(window_length_);
    for (int i = 0; i < window_length_; ++i)  // periodic Hann
      window_[i] = static_cast<float>(0.5 - 0.5 * std::cos(2 * std::numbers::pi * i / o.n_fft));
    // transformers' mel_filter_bank(norm="slaney", mel_scale="slaney") from 0 Hz to Nyquist.
    const int bins = o.n_fft / 2 + 1;
    const double lo = slaney_mel(0), hi = slaney_mel(nyquist);
    std::vector<double> edges(o.num_mel_bins + 2);
    for (size_t i = 0; i < edges.size(); ++i)
      edges[i] = slaney_hz(lo + (hi - lo) * i / (o.num_mel_bins + 1));
    for (int m = 0; m < o.num_mel_bins; ++m) {
      const double enorm = 2.0 / (edges[m + 2] - edges[m]);
      std::vector<float> w;
      int first = -1;
      for (int k = 0; k < bins; ++k) {
        const double f = nyquist * k / (bins - 1);
        const double down = (f - edges[m]) / (edges[m + 1] - edges[m]);
        const double up = (edges[m + 2] - f) / (edges[m + 2] - edges[m + 1]);
        const double v = std::max(0.0, std::min(down, up));
        if (v > 0) {
          if (first < 0) first = k;
          w.resize(k - first + 1, 0.0f);
          w[k - first] = static_cast<float>(v * enorm);
        }
      }
      first_bin_.push_back(std::max(first, 0));
      weights_.push_back(std::move(w));
    }
  }
}

int64_t FeatureExtractor::frames(int64_t samples) const {
  if (options_.kind == FeatureOptions::Kind::kFbank)
    return samples < window_length_ ? 0 : 1 + (samples - window_length_) / shift_;
  if (options_.pad_30s) samples = kWhisperSamples * options_.sample_rate / 16000;
  return samples / shift_;  // 1 + n / hop centred frames, less the last
}

void FeatureExtractor::compute(std::span<const float> wave, float* out,
                               FeatureScratch& scratch) const {
  FeatureScratch::Impl& s = *scratch.impl_;
  s.ready(fft_length_);
  const int bins = options_.num_mel_bins;
  const int64_t n_frames = frames(static_cast<int64_t>(wave.size()));
  float* in = s.in.get();
  if (options_.kind == FeatureOptions::Kind::kFbank) {
    const auto coeff = static_cast<float>(options_.preemphasis);
    for (int64_t t = 0; t < n_frames; ++t) {
      const float* x = wave.data() + t * shift_;
      std::copy(x, x + window_length_, in);
      if (options_.remove_dc_offset) {
        double sum = 0;
        for (int i = 0; i < window_length_; ++i) sum += in[i];
        const auto mean = static_cast<float>(sum / window_length_);
        for (int i = 0; i < window_length_; ++i) in[i] -= mean;
      }
      if (coeff != 0) {
        for (int i = window_length_ - 1; i > 0; --i) in[i] -= coeff * in[i - 1];
        in[0] -= coeff * in[0];
      }
      for (int i = 0; i < window_length_; ++i) in[i] *= window_[i];
      std::fill(in + window_length_, in + fft_length_ + 2, 0.0f);
      s.spectrum();
      float* row = out + t * bins;
      for (int m = 0; m < bins; ++m) {
        const std::vector<float>& w = weights_[m];
        const float* p = s.power.data() + first_bin_[m];
        float e = 0;
        for (size_t k = 0; k < w.size(); ++k) e += w[k] * p[k];
        row[m] = std::log(std::max(e, FLT_EPSILON));
      }
    }
    return;
  }
  // LogMel: the waveform (padded to 30 s, or cut), reflected by n_fft / 2 at each end.
  const int64_t n = options_.pad_30s ? kWhisperSamples * options_.sample_rate / 16000
                                     : static_cast<int64_t>(wave.size());
  if (n_frames == 0) return;
  const int half = fft_length_ / 2;
  s.padded.assign(n + 2 * half, 0.0f);
  const int64_t have = std::min<int64_t>(n, wave.size());
  std::copy(wave.begin(), wave.begin() + have, s.padded.begin() + half);
  auto at = [&](int64_t i) {  // numpy's "reflect" (no edge repeat), of the padded-to-n signal
    if (n == 1) return s.padded[half];
    while (i < 0 || i >= n) i = i < 0 ? -i : 2 * (n - 1) - i;
    return s.padded[half + i];
  };
  for (int i = 0; i < half; ++i) {
    s.padded[i] = at(i - half);
    s.padded[half + n + i] = at(n + i);
  }
  float peak = -INFINITY;
  float* logmel = out;
  for (int64_t t = 0; t < n_frames; ++t) {
    const float* x = s.padded.data() + t * shift_;
    for (int i = 0; i < fft_length_; ++i) in[i] = x[i] * window_[i];
    in[fft_length_] = in[fft_length_ + 1] = 0;
    s.spectrum();
    float* row = logmel + t * bins;
    for (int m = 0; m < bins; ++m) {
      const std::vector<float>& w = weights_[m];
      const float* p = s.power.data() + first_bin_[m];
      float e = 0;
      for (size_t k = 0; k < w.size(); ++k) e += w[k] * p[k];
      row[m] = std::log10(std::max(e, 1e-10f));
      peak = std::max(peak, row[m]);
    }
  }
  const float floor = peak - 8.0f;
  for (int64_t i = 0; i < n_frames * bins; ++i)
    logmel[i] = (std::max(logmel[i], floor) + 4.0f) / 4.0f;
}

}  // namespace stoker::audio
