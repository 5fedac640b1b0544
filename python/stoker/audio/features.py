"""Features computed on the loader's worker threads (C++, libavutil's FFT): ``Fbank`` (Kaldi's
filterbank, as ``torchaudio.compliance.kaldi.fbank`` and Lhotse's ``Fbank``) and ``LogMel``
(Whisper's log-mel spectrogram, as transformers' ``WhisperFeatureExtractor``), and ``SpecAugment``
(their masks, seeded per sample).

Each is an immutable value: pass it as ``AudioDataset(features=...)``, or call it on a mono
float32 waveform for its ``[frames, bins]`` array. ``SpecAugment`` masks them, per sample, on the
same threads.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .._checks import is_int
from .files import audio_module


def _positive(name, value, integer=False):
    ok = is_int(value) if integer else (isinstance(value, (int, float)) and
                                        not isinstance(value, bool))
    if not ok or value <= 0:
        raise ValueError(f"{name} must be a positive {'integer' if integer else 'number'}, got "
                         f"{value!r}")


class _Features:
    name = ""  # the batch key's stem
    _kind = ""

    def _options(self, sample_rate):
        module = audio_module()
        o = module.FeatureOptions()
        o.kind = getattr(module.FeatureOptions.Kind, self._kind)
        o.sample_rate = int(sample_rate)
        for f in dataclasses.fields(self):
            if f.name != "sample_rate":
                setattr(o, f.name, getattr(self, f.name))
        return o

    def frames(self, samples, sample_rate=16000):
        """The frames made from ``samples`` samples at ``sample_rate``."""
        return self._options(sample_rate).frames(int(samples))

    def __call__(self, wave, sample_rate=16000):
        """The features of a mono waveform (float32 samples in [-1, 1] at ``sample_rate``):
        float32 ``[frames, bins]``."""
        wave = np.ascontiguousarray(wave, dtype=np.float32)
        if wave.ndim != 1:
            raise ValueError(f"{type(self).__name__} takes a mono waveform [T], got shape "
                             f"{wave.shape}")
        return audio_module().features(self._options(sample_rate), wave)


@dataclasses.dataclass(frozen=True)
class Fbank(_Features):
    """Kaldi's log mel filterbank (``compute-fbank-feats``; torchaudio.compliance.kaldi.fbank
    with its defaults but ``dither=0``): ``num_mel_bins`` log energies per frame of
    ``frame_length`` ms every ``frame_shift`` ms, frames only where they fit whole (snip_edges),
    DC offset removed, pre-emphasis, Povey window, power spectrum, mel triangles from
    ``low_freq`` to ``high_freq`` (<= 0: offset from the Nyquist frequency). No dither, so that
    features are a pure function of the audio; no energy column."""

    num_mel_bins: int = 80
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    preemphasis: float = 0.97
    remove_dc_offset: bool = True
    low_freq: float = 20.0
    high_freq: float = 0.0

    name = "features"
    _kind = "fbank"

    def __post_init__(self):
        _positive("num_mel_bins", self.num_mel_bins, integer=True)
        _positive("frame_length_ms", self.frame_length_ms)
        _positive("frame_shift_ms", self.frame_shift_ms)


@dataclasses.dataclass(frozen=True)
class LogMel(_Features):
    """Whisper's log-mel spectrogram (transformers' ``WhisperFeatureExtractor``): ``n_mels``
    Slaney mel bins of a centred STFT (``n_fft`` 400, ``hop_length`` 160, periodic Hann window),
    log10 floored at 1e-10, floored at the maximum less 8, then (x + 4) / 4; ``n_mels`` 80 or
    128 (large-v3). ``pad_30s``: the audio padded with zeros (or cut) to 30 s first, as Whisper
    pads every input (3000 frames); otherwise ``samples // hop_length`` frames."""

    n_mels: int = 80
    n_fft: int = 400
    hop_length: int = 160
    pad_30s: bool = False

    name = "features"
    _kind = "logmel"

    def __post_init__(self):
        _positive("n_mels", self.n_mels, integer=True)
        _positive("n_fft", self.n_fft, integer=True)
        _positive("hop_length", self.hop_length, integer=True)
        if self.n_fft % 2:
            raise ValueError(f"n_fft must be even, got {self.n_fft}")

    def _options(self, sample_rate):
        module = audio_module()
        o = module.FeatureOptions()
        o.kind = module.FeatureOptions.Kind.logmel
        o.sample_rate = int(sample_rate)
        o.num_mel_bins = self.n_mels
        o.n_fft = self.n_fft
        o.hop_length = self.hop_length
        o.pad_30s = self.pad_30s
        return o


@dataclasses.dataclass(frozen=True)
class SpecAugment:
    """SpecAugment's frequency and time masks on the features, drawn on the worker threads from
    each sample's (seed, epoch, index): batches are the same whatever the worker count, and a
    resumed loader masks as the first run did. Pass it as ``AudioDataset(...,
    features=Fbank(), augment=SpecAugment())``.

    As torchaudio's ``FrequencyMasking``/``TimeMasking`` and Lhotse's ``SpecAugment`` draw them:
    ``freq_masks`` bands of mel bins, each of a width drawn uniformly in ``[0, freq_width]`` and
    a start uniformly where it fits; ``time_masks`` bands of frames, each at most ``time_width``
    frames (a float in (0, 1): that fraction of the sample's frames), all of them together capped
    at ``max_time_fraction`` of the sample's frames as Lhotse's ``max_frames_mask_fraction``
    caps them (fewer or narrower masks on a short sample; 1.0: no cap). Masks may overlap.
    ``mask_value``: ``"zero"`` (torchaudio's) or ``"mean"`` (Lhotse's: the mean of the sample's
    features before masking). Only a sample's own frames are masked, never its padding. No time
    warp (docs/audio.md)."""

    freq_masks: int = 2
    freq_width: int = 27
    time_masks: int = 2
    time_width: float = 100
    max_time_fraction: float = 0.15
    mask_value: str = "zero"

    def __post_init__(self):
        for name in ("freq_masks", "freq_width", "time_masks"):
            value = getattr(self, name)
            if not is_int(value) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        w = self.time_width
        if isinstance(w, bool) or not isinstance(w, (int, float)) or \
                not (w >= 1 or 0 < w < 1) or w != w or w == float("inf"):
            raise ValueError(f"time_width must be frames >= 1 or a fraction in (0, 1), got {w!r}")
        f = self.max_time_fraction
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f <= 1:
            raise ValueError(f"max_time_fraction must be in (0, 1], got {f!r}")
        if self.mask_value not in ("zero", "mean"):
            raise ValueError(f"mask_value must be 'zero' or 'mean', got {self.mask_value!r}")

    def _options(self):
        o = audio_module().SpecAugmentOptions()
        o.freq_masks, o.freq_width, o.time_masks = self.freq_masks, self.freq_width, \
            self.time_masks
        o.time_width, o.max_time_fraction = float(self.time_width), float(self.max_time_fraction)
        o.mask_mean = self.mask_value == "mean"
        return o
