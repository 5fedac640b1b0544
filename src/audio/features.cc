#include "stoker/audio/features.h"

#include <algorithm>
#include <bit>
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

// The natural log of a positive normal float, in a form the compiler vectorizes over a row of
// bins (glibc's logf is a call per value: a fifth of Fbank's time). Cephes' logf: x = m 2^e with
// m in [sqrt(1/2), sqrt(2)), log(m) by its degree-9 polynomial in m - 1: within 8e-6 of logf from
// FLT_EPSILON to 1e30 (Kaldi's log energies are compared within 1e-3).
inline float log_positive(float x) {
  const auto bits = std::bit_cast<uint32_t>(x);
  const uint32_t mant = bits & 0x007FFFFFu;
  // -1 where the mantissa is below sqrt(1/2)'s (0x3F3504F3), else 0: integer masks, no branch.
  const int32_t low = static_cast<int32_t>(mant - 0x003504F3u) >> 31;
  const auto fe = static_cast<float>(static_cast<int32_t>(bits >> 23) - 126 + low);
  const float m =
      std::bit_cast<float>(mant | (0x3F000000u + (static_cast<uint32_t>(low) & 0x00800000u))) -
      1.0f;
  const float z = m * m;
  float y = 7.0376836292e-2f;
  y = y * m - 1.1514610310e-1f;
  y = y * m + 1.1676998740e-1f;
  y = y * m - 1.2420140846e-1f;
  y = y * m + 1.4249322787e-1f;
  y = y * m - 1.6668057665e-1f;
  y = y * m + 2.0000714765e-1f;
  y = y * m - 2.4999993993e-1f;
  y = y * m + 3.3333331174e-1f;
  y = y * m * z;
  y += -2.12194440e-4f * fe;
  y += -0.5f * z;
  return m + y + 0.693359375f * fe;
}

// Each mel filter's energy, at least `floor`, into row[0, filters): the filter's weights times
// the power spectrum from its first bin, summed in four lanes (which the compiler vectorizes, as
// it cannot one sequential float sum).
void mel_energies(const std::vector<std::vector<float>>& weights, const std::vector<int>& first,
                  const float* power, float floor, float* row) {
  for (size_t m = 0; m < weights.size(); ++m) {
    const float* w = weights[m].data();
    const float* p = power + first[m];
    const size_t taps = weights[m].size();
    float lane[4] = {0, 0, 0, 0};
    size_t k = 0;
    for (; k + 4 <= taps; k += 4)
      for (size_t j = 0; j < 4; ++j) lane[j] += w[k + j] * p[k + j];
    for (; k < taps; ++k) lane[0] += w[k] * p[k];
    row[m] = std::max((lane[0] + lane[1]) + (lane[2] + lane[3]), floor);
  }
}

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
    const int n = window_length_;
    const float* win = window_.data();
    for (int64_t t = 0; t < n_frames; ++t) {
      const float* x = wave.data() + t * shift_;
      // DC offset, pre-emphasis and the window in one pass, each sample written once: with y =
      // x - mean, in[i] = (y[i] - coeff y[i-1]) w[i] = (x[i] - coeff x[i-1] - mean (1 - coeff))
      // w[i], and in[0] = y[0] (1 - coeff) w[0]. The sums run in independent lanes, so that the
      // compiler vectorizes them.
      float mean = 0;
      if (options_.remove_dc_offset) {
        double lane[4] = {0, 0, 0, 0};
        int i = 0;
        for (; i + 4 <= n; i += 4)
          for (int j = 0; j < 4; ++j) lane[j] += x[i + j];
        for (; i < n; ++i) lane[0] += x[i];
        mean = static_cast<float>((lane[0] + lane[1] + lane[2] + lane[3]) / n);
      }
      const float shift = mean * (1 - coeff);
      in[0] = (x[0] - mean) * (1 - coeff) * win[0];
      for (int i = 1; i < n; ++i) in[i] = (x[i] - coeff * x[i - 1] - shift) * win[i];
      std::fill(in + n, in + fft_length_ + 2, 0.0f);
      s.spectrum();
      float* row = out + t * bins;
      mel_energies(weights_, first_bin_, s.power.data(), FLT_EPSILON, row);
      for (int m = 0; m < bins; ++m) row[m] = log_positive(row[m]);
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
    mel_energies(weights_, first_bin_, s.power.data(), 1e-10f, row);
    constexpr float kLog10E = 0.43429448190325176f;
    for (int m = 0; m < bins; ++m) {
      row[m] = log_positive(row[m]) * kLog10E;
      peak = std::max(peak, row[m]);
    }
  }
  const float floor = peak - 8.0f;
  for (int64_t i = 0; i < n_frames * bins; ++i)
    logmel[i] = (std::max(logmel[i], floor) + 4.0f) / 4.0f;
}

}  // namespace stoker::audio
