"""The audio features against their references: ``LogMel`` against transformers'
``WhisperFeatureExtractor`` (80 and 128 bins, with and without 30-second padding), within 1e-3;
``Fbank`` against a NumPy float64 implementation written here from Kaldi's documented algorithm
(feat/feature-window.cc, feature-fbank.cc, mel-computations.cc: the steps are listed in
``kaldi_fbank``), within 1e-3 on log energies. torchaudio is not installed here, and Lhotse (whose
``Fbank`` is torchaudio's algorithm) is not importable from this environment, so the Kaldi
reference is this file's own.
"""

import numpy as np
import pytest

pytest.importorskip("stoker._audio", reason="this build has no audio module")
from stoker import audio  # noqa: E402


def speech_like(seconds, rate=16000, seed=0):
    """A few harmonics gliding in pitch plus noise, at a speech-like level: float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 60 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    x = sum(0.2 / k * np.sin(k * phase) for k in range(1, 8))
    x = x * (0.5 + 0.5 * np.sin(2 * np.pi * 2 * t) ** 2) + rng.normal(0, 0.01, t.shape)
    return x.astype(np.float32)


@pytest.mark.parametrize("n_mels, pad", [(80, False), (80, True), (128, False)])
def test_logmel_equals_whispers_feature_extractor(n_mels, pad):
    transformers = pytest.importorskip("transformers")
    x = speech_like(3.3)
    extractor = transformers.WhisperFeatureExtractor(feature_size=n_mels)
    ref = extractor(x, sampling_rate=16000, return_tensors="np",
                    padding="max_length" if pad else "longest").input_features[0].T
    got = audio.LogMel(n_mels=n_mels, pad_30s=pad)(x)
    assert got.shape == ref.shape == ((3000 if pad else len(x) // 160), n_mels)
    err = np.abs(got - ref).max()
    assert err < 1e-3, err


@pytest.mark.parametrize("n_fft", [350, 448, 1000])
def test_logmel_of_other_fft_lengths_equals_whispers(n_fft):
    """Lengths av_tx has no fast transform for (350 = 2 x 7 x 25, 1000 = 8 x 125: split into
    interleaved subsequences, src/audio/features.cc) and one it has (448 = 64 x 7)."""
    transformers = pytest.importorskip("transformers")
    x = speech_like(1.7, seed=1)
    extractor = transformers.WhisperFeatureExtractor(feature_size=80, n_fft=n_fft)
    ref = extractor(x, sampling_rate=16000, return_tensors="np",
                    padding="longest").input_features[0].T
    got = audio.LogMel(n_mels=80, n_fft=n_fft)(x)
    assert got.shape == ref.shape
    err = np.abs(got - ref).max()
    assert err < 1e-3, err


def kaldi_fbank(x, rate=16000, bins=80, low=20.0, high=0.0):
    """Kaldi's fbank with torchaudio.compliance.kaldi.fbank's defaults but dither=0, float64:
    frames of 400 samples every 160 (snip_edges: only whole frames); per frame: subtract the
    mean (remove_dc_offset), pre-emphasis x[i] -= 0.97 x[i-1] (x[0] -= 0.97 x[0]), the Povey
    window (0.5 - 0.5 cos(2 pi i / (N - 1)))^0.85, zero-padded to 512, |FFT|^2; mel triangles
    equally spaced on 1127 ln(1 + f / 700) from low_freq to high_freq over the bins below the
    Nyquist one; log of each energy floored at float32's epsilon."""
    x = x.astype(np.float64)
    n, shift = 400, 160
    frames = 1 + (len(x) - n) // shift
    idx = np.arange(n)[None, :] + shift * np.arange(frames)[:, None]
    w = x[idx]
    w = w - w.mean(axis=1, keepdims=True)
    w = np.concatenate([w[:, :1] * (1 - 0.97), w[:, 1:] - 0.97 * w[:, :-1]], axis=1)
    w = w * (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / (n - 1))) ** 0.85
    power = np.abs(np.fft.rfft(w, 512)) ** 2
    mel = lambda f: 1127.0 * np.log(1.0 + f / 700.0)  # noqa: E731
    high = high if high > 0 else rate / 2 + high
    lo, hi = mel(low), mel(high)
    delta = (hi - lo) / (bins + 1)
    fft_mel = mel(np.arange(256) * rate / 512)
    banks = np.zeros((bins, 257))
    for m in range(bins):
        left, center, right = lo + m * delta, lo + (m + 1) * delta, lo + (m + 2) * delta
        up = (fft_mel - left) / (center - left)
        down = (right - fft_mel) / (right - center)
        inside = (fft_mel > left) & (fft_mel < right)
        banks[m, :256] = np.where(inside, np.where(fft_mel <= center, up, down), 0)
    return np.log(np.maximum(power @ banks.T, np.finfo(np.float32).eps))


@pytest.mark.parametrize("bins, low, high", [(80, 20.0, 0.0), (40, 60.0, -400.0)])
def test_fbank_equals_kaldis_algorithm(bins, low, high):
    x = speech_like(2.0, seed=1)
    ref = kaldi_fbank(x, bins=bins, low=low, high=high)
    got = audio.Fbank(num_mel_bins=bins, low_freq=low, high_freq=high)(x)
    assert got.shape == ref.shape == (1 + (len(x) - 400) // 160, bins)
    err = np.abs(got - ref).max()
    assert err < 1e-3, err


def test_short_audio_makes_no_frames_and_options_are_checked():
    assert audio.Fbank()(np.zeros(399, np.float32)).shape == (0, 80)
    assert audio.LogMel()(np.zeros(1600, np.float32)).shape == (10, 80)
    with pytest.raises(ValueError, match="num_mel_bins"):
        audio.Fbank(num_mel_bins=0)
    with pytest.raises(ValueError, match="n_fft"):
        audio.LogMel(n_fft=401)
    with pytest.raises(ValueError, match="mono"):
        audio.Fbank()(np.zeros((400, 2), np.float32))
