"""The audio wing's augmentations, drawn per sample from (seed, epoch, index): SpecAugment's masks
on the features (their structure against the unmasked features, bit for bit) and speed
perturbation (a sine's frequency and length scaled by the factor); both the same whatever the
worker count, on resume, and different from one epoch to the next.
"""

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
