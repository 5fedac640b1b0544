"""The audio wing's augmentations, drawn per sample from (seed, epoch, index): SpecAugment's masks
on the features (their structure against the unmasked features, bit for bit) and speed
perturbation (a sine's frequency and length scaled by the factor); both the same whatever the
worker count, on resume, and different from one epoch to the next.
"""

import math
import wave

import numpy as np
import pytest

import stoker

pytest.importorskip("stoker._audio", reason="this build has no audio module")
from stoker import audio  # noqa: E402

DURATIONS = (0.55, 0.8, 0.65, 0.9, 0.45, 0.7)  # distinct: a batch row's length names its sample


def write_wav(path, x, rate):
    pcm = np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


def speechy_folder(tmp_path, durations=DURATIONS, rate=16000):
    root = tmp_path / "clips"
    root.mkdir()
    rng = np.random.default_rng(0)
    for i, d in enumerate(durations):
        t = np.arange(round(d * rate)) / rate
        x = 0.3 * np.sin(2 * np.pi * (150 + 40 * i) * t * (1 + t)) + rng.normal(0, 0.02, t.shape)
        write_wav(root / f"{i:02d}.wav", x, rate)
    return root


def epoch_batches(ds, workers=1, epochs=1, key="features"):
    loader = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=5, num_workers=workers,
                               output="numpy")
    out = []
    for e in range(epochs):
        loader.set_epoch(e)
        out.append([(b[key], b[f"{key}_lens"]) for b in loader])
    return out


def runs(mask):
    """Maximal runs of True in a 1-d mask: [(start, width)]."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) -
                    np.flatnonzero(edges == 1)))


@pytest.mark.parametrize("mask_value", ["zero", "mean"])
def test_spec_augment_masks_bands_of_the_features_seeded_per_sample(tmp_path, mask_value):
    root = speechy_folder(tmp_path)
    fbank = audio.Fbank(num_mel_bins=40)
    spec = audio.SpecAugment(freq_masks=2, freq_width=8, time_masks=2, time_width=12,
                             max_time_fraction=0.5, mask_value=mask_value)
    plain = stoker.AudioDataset(root, features=fbank)
    ds = stoker.AudioDataset(root, features=fbank, augment=spec)
    by_len = {len(f): f for f in (plain[i]["features"] for i in range(len(plain)))}
    one, two = epoch_batches(ds, 1, epochs=2), epoch_batches(ds, 2, epochs=2)
    for e in range(2):  # bit-identical whatever the workers
        for (a, la), (b, lb) in zip(one[e], two[e]):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(la, lb)
    masked_epochs = []
    for epoch in one:
        masked = {}
        for feats, lens in epoch:
            for row, n in zip(feats, lens.tolist()):
                ref, got = by_len[n], row[:n]
                np.testing.assert_array_equal(row[n:], 0)  # the padding untouched
                changed = got != ref
                value = np.float32(0) if mask_value == "zero" else \
                    np.float32(ref.astype(np.float64).mean())
                if changed.any():  # every changed cell holds the one mask value
                    vals = np.unique(got[changed])
                    assert len(vals) == 1
                    np.testing.assert_allclose(vals[0], value, rtol=1e-5, atol=1e-6)
                    value = vals[0]
                cols = (got == value).all(axis=0)
                rows = (got == value).all(axis=1)
                # Each masked cell lies in a masked band of full columns or full rows, and every
                # other cell equals the unmasked features bit for bit.
                in_band = cols[None, :] | rows[:, None]
                np.testing.assert_array_equal(got[~in_band], ref[~in_band])
                assert not (changed & ~in_band).any()
                col_runs, row_runs = runs(cols), runs(rows)
                assert len(col_runs) <= 2 and sum(w for _, w in col_runs) <= 2 * 8
                assert len(row_runs) <= 2 and sum(w for _, w in row_runs) <= min(
                    2 * 12, int(0.5 * n))
                masked[n] = (cols.sum(), rows.sum())
        assert sum(c for c, _ in masked.values()) > 0 and sum(r for _, r in masked.values()) > 0
        masked_epochs.append(masked)
    assert masked_epochs[0] != masked_epochs[1]  # other masks the next epoch
    # A resumed loader masks its remaining batches as the first run did.
    loader = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=5, output="numpy")
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    resumed = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=5, output="numpy")
    resumed.load_state_dict(state)
    for b, (want, _) in zip(resumed, one[0][1:]):
        np.testing.assert_array_equal(b["features"], want)


def test_spec_augment_is_checked_and_needs_features(tmp_path):
    with pytest.raises(ValueError, match="mask_value"):
        audio.SpecAugment(mask_value="noise")
    with pytest.raises(ValueError, match="time_width"):
        audio.SpecAugment(time_width=0)
    with pytest.raises(ValueError, match="freq_masks"):
        audio.SpecAugment(freq_masks=-1)
    with pytest.raises(ValueError, match="features"):
        stoker.AudioDataset(speechy_folder(tmp_path), augment=audio.SpecAugment())


def sine_folder(tmp_path, durations, hz=1000.0, rate=16000):
    root = tmp_path / "sines"
    root.mkdir()
    for i, d in enumerate(durations):
        write_wav(root / f"{i:02d}.wav", 0.5 * np.sin(2 * np.pi * hz * np.arange(round(d * rate)) /
                                                      rate), rate)
    return root


def peak_hz(x, rate=16000):
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x)), 16 * len(x)))
    return np.argmax(spectrum) * rate / (16 * len(x))


def test_speed_resamples_as_sox_speed_one_factor(tmp_path):
    scipy_signal = pytest.importorskip("scipy.signal")
    root = sine_folder(tmp_path, (0.5,))
    x = stoker.AudioDataset(root)[0]["audio"]
    for factor, (up, down) in ((1.1, (10, 11)), (0.9, (10, 9))):
        y = stoker.AudioDataset(root, speed=(factor,))[0]["audio"]
        assert abs(len(y) - round(len(x) / factor)) <= 1
        assert peak_hz(y) == pytest.approx(1000 * factor, rel=2e-3)
        # Lhotse's PerturbSpeed: the samples resampled from round(16000 x factor) Hz to 16000.
        ref = scipy_signal.resample_poly(x.astype(np.float64), up, down)
        n = min(len(y), len(ref))
        assert np.abs(y[200:n - 200] - ref[200:n - 200]).max() < 2e-3
    same = stoker.AudioDataset(root, speed=(1.0,))[0]["audio"]
    np.testing.assert_array_equal(same, x)  # 1.0 resamples nothing


def test_speed_drawn_per_sample_and_epoch_bounds_the_budget(tmp_path):
    durations = (0.3, 0.4, 0.55, 0.75, 1.0, 1.35)  # each row's length names its sample
    ds = stoker.AudioDataset(sine_folder(tmp_path, durations), speed=(0.9, 1.0, 1.1))
    np.testing.assert_allclose(ds._lengths("seconds"), np.array(durations) / 0.9, rtol=1e-4)
    one = epoch_batches(ds, 1, epochs=2, key="audio")
    two = epoch_batches(ds, 2, epochs=2, key="audio")
    for e in range(2):
        for (a, la), (b, lb) in zip(one[e], two[e]):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(la, lb)
    drawn = []
    for epoch in one:
        factors = {}
        for batch, lens in epoch:
            ds_ = [next(d for d in durations if 0.88 < n / (d * 16000) < 1.12) for n in lens]
            # Padded to the slowest speed's length of its longest sample: a bound, never short.
            assert batch.shape[1] == max(math.ceil(round(d * 16000) / 0.9) for d in ds_)
            for row, n, d in zip(batch, lens.tolist(), ds_):
                factor = min((0.9, 1.0, 1.1), key=lambda f: abs(d * 16000 / f - n))
                assert abs(n - round(d * 16000 / factor)) <= 1
                assert peak_hz(row[:n]) == pytest.approx(1000 * factor, rel=5e-3)
                np.testing.assert_array_equal(row[n:], 0)
                factors[d] = factor
        assert sorted(factors) == sorted(durations)  # every sample once
        drawn.append(factors)
    assert drawn[0] != drawn[1] and len(set(drawn[0].values()) | set(drawn[1].values())) == 3
    budget = stoker.DataLoader(ds, batch_size=stoker.Budget(seconds=2.0), shuffle=True, seed=2,
                               output="numpy")
    seen = 0
    for b in budget:
        assert b["audio"].shape[0] * b["audio"].shape[1] <= 2.0 * 16000
        seen += len(b["audio_lens"])
    assert seen == len(durations)


def test_speed_with_features_and_masks(tmp_path):
    root = speechy_folder(tmp_path)
    ds = stoker.AudioDataset(root, speed=(0.9, 1.1),
                             features=audio.Fbank(num_mel_bins=40),
                             augment=audio.SpecAugment(freq_width=8, time_width=10))
    a, b = epoch_batches(ds, 1), epoch_batches(ds, 2)
    for (x, lx), (y, ly) in zip(a[0], b[0]):
        np.testing.assert_array_equal(x, y)
        np.testing.assert_array_equal(lx, ly)
        for row, n in zip(x, lx.tolist()):
            np.testing.assert_array_equal(row[n:], 0)
    with pytest.raises(ValueError, match="speed"):
        stoker.AudioDataset(root, speed=(0.0, 1.0))
