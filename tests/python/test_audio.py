"""The audio wing: decoding and resampling (FFmpeg, libswresample) against the samples written,
scipy's resampler and each codec; cuts that decode only their slice; files, NeMo and Lhotse
manifests as AudioDataset batches; every sample once an epoch, worker independence, resume and a
Budget(seconds=...) epoch; bad input named or skipped. The features' references are in
test_audio_features.py.

Test audio is made here: sine sweeps and noise written as WAV by Python's ``wave`` module and
encoded to FLAC, MP3, Opus and Vorbis with PyAV (its wheel has the encoders).
"""

import gzip
import json
import wave

import numpy as np
import pytest

import stoker

pytest.importorskip("stoker._audio", reason="this build has no audio module")
from stoker import audio  # noqa: E402


def sweep(seconds, rate, f0=100.0, f1=6000.0, channels=1, noise=0.0, seed=0):
    """A linear sine sweep from f0 to f1 Hz at amplitude 0.5 (channel c at (c + 1) x the
    frequency, capped below the Nyquist), plus uniform noise: float64 [T, channels]."""
    t = np.arange(int(round(seconds * rate))) / rate
    phase = 2 * np.pi * (f0 * t + (f1 - f0) * t * t / (2 * seconds))
    out = np.stack([0.5 * np.sin(phase * (c + 1)) for c in range(channels)], axis=1)
    if noise:
        out += np.random.default_rng(seed).uniform(-noise, noise, out.shape)
    return out


def write_wav(path, x, rate):
    """16-bit PCM; returns the samples as decoded (int16 / 32768)."""
    pcm = np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(pcm.shape[1])
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return pcm.astype(np.float32) / 32768


CODECS = {"flac": ("flac", "flac", "s16"), "mp3": ("mp3", "libmp3lame", "fltp"),
          "opus": ("ogg", "libopus", "flt"), "ogg": ("ogg", "vorbis", "fltp")}


def encode(path, x, rate, codec):
    """x (float [T, channels]) encoded with PyAV into ``path`` (its suffix names the codec)."""
    av = pytest.importorskip("av")
    fmt, name, sample_fmt = CODECS[codec]
    if name == "vorbis":  # FFmpeg's own Vorbis encoder: stereo only, and "experimental"
        x = np.repeat(x[:, :1], 2, axis=1)
    layout = "mono" if x.shape[1] == 1 else "stereo"
    with av.open(str(path), "w", format=fmt) as out:
        s = out.add_stream(name, rate=rate, layout=layout)
        if name == "vorbis":
            s.codec_context.options = {"strict": "experimental"}
        if sample_fmt == "s16":
            # packed: the channels interleaved, [1, T x channels]
            data = np.clip(np.round(x * 32767), -32768, 32767).astype(np.int16).reshape(1, -1)
        elif sample_fmt == "flt":
            data = x.astype(np.float32).reshape(1, -1)
        else:
            data = np.ascontiguousarray(x.T.astype(np.float32))
        frame = av.AudioFrame.from_ndarray(
            data if sample_fmt != "s16" else data.reshape(1, -1), format=sample_fmt,
            layout=layout)
        frame.sample_rate = rate
        for p in s.encode(frame):
            out.mux(p)
        for p in s.encode(None):
            out.mux(p)
    return path


def peak_hz(x, rate):
    spectrum = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    return np.argmax(spectrum) * rate / len(x)


# ------------------------------------------------------------------------- decoding, resampling


def test_wav_decodes_to_its_samples_and_probes_from_the_header(tmp_path):
    x = sweep(1.5, 22050, channels=2)
    want = write_wav(tmp_path / "a.wav", x, 22050)
    info = audio.probe(tmp_path / "a.wav")
    assert info == {"duration": pytest.approx(1.5, abs=1e-4), "sample_rate": 22050,
                    "channels": 2, "codec": "pcm_s16le"}
    got = audio.load(tmp_path / "a.wav", sample_rate=22050, mono=False)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(audio.load(tmp_path / "a.wav", sample_rate=22050),
                               want.mean(axis=1), atol=1e-7)


@pytest.mark.parametrize("codec", list(CODECS))
def test_each_codec_decodes_resamples_and_cuts(codec, tmp_path):
    rate = 48000 if codec == "opus" else 44100
    x = sweep(3.0, rate, f0=440, f1=440)  # a steady tone: its peak survives every codec
    path = encode(tmp_path / f"a.{codec}", x, rate, codec)
    whole = audio.load(path)
    # FFmpeg's experimental Vorbis encoder (the only one in PyAV's wheel) writes wrong granule
    # positions: its files' durations and timestamps are wrong, so only decoding is checked
    vorbis = codec == "ogg"
    if not vorbis:  # an MP3's or Opus's header counts its last frame's padding: within 0.01 s
        assert audio.probe(path)["duration"] == pytest.approx(3.0, abs=0.01)
        assert len(whole) == 48000
    assert peak_hz(whole[4000:20000], 16000) == pytest.approx(440, abs=2)
    if vorbis:
        return
    cut = audio.load(path, offset=1.25, duration=0.5)
    assert len(cut) == pytest.approx(8000, abs=2)
    assert peak_hz(cut, 16000) == pytest.approx(440, abs=4)
    # the cut is the same stretch of audio as the whole file's, to the sample (the resampler's
    # edges aside: it starts afresh at a cut)
    np.testing.assert_allclose(cut[400:-400], whole[20000 + 400:28000 - 400], atol=1e-3)


def test_a_cut_at_the_files_rate_is_its_slice_exactly(tmp_path):
    x = sweep(4.0, 16000, noise=0.1)
    want = write_wav(tmp_path / "a.wav", x, 16000)[:, 0]
    encode(tmp_path / "a.flac", x, 16000, "flac")
    for name in ("a.wav", "a.flac"):
        cut = audio.load(tmp_path / name, offset=2.5, duration=0.75)
        np.testing.assert_array_equal(cut, want[40000:52000])


def test_a_flac_opens_by_its_marker_and_cuts_exactly_wherever_it_starts(tmp_path):
    """A FLAC is opened by its "fLaC" marker and its STREAMINFO without probing, and a cut seeks
    to the block it starts in (no pre-roll): the same samples as the slice, at a block's edge or
    inside one, from the file, its bytes, its bytes behind an ID3 tag (probed), and a WAV
    misnamed .flac (probed by its content, not its name)."""
    x = sweep(3.0, 16000, noise=0.1)
    want = write_wav(tmp_path / "a.wav", x, 16000)[:, 0]
    flac = encode(tmp_path / "a.flac", x, 16000, "flac").read_bytes()
    block = int.from_bytes(flac[8:10], "big")  # STREAMINFO's (fixed) block size
    tagged = b"ID3\x04\x00\x00\x00\x00\x00\x00" + flac  # an empty ID3v2 tag before it
    (tmp_path / "wav.flac").write_bytes((tmp_path / "a.wav").read_bytes())
    for source in (tmp_path / "a.flac", flac, tagged, tmp_path / "wav.flac"):
        assert audio.probe(source)["sample_rate"] == 16000
        for at in (0, block, block + 1, 16000, 46400):  # on a block's edge, past it, inside
            cut = audio.load(source, offset=at / 16000, duration=0.1)
            np.testing.assert_array_equal(cut, want[at:at + 1600])
    # A cut inside one block decodes that block alone (with a pre-roll, the two before it too)
    start = 20 * block + 160
    (tmp_path / "cut.json").write_text(json.dumps(
        {"audio_filepath": "a.flac", "offset": start / 16000, "duration": 0.005}))
    ds = stoker.AudioDataset(str(tmp_path / "cut.json"))
    np.testing.assert_array_equal(ds[0]["audio"], want[start:start + 80])
    assert ds.stats()["decoded_seconds"] == pytest.approx(block / 16000)
    with pytest.raises(OSError, match="is a directory"):  # IoError, as a missing file
        audio.load(tmp_path)


def test_flac_frames_found_by_their_headers_whatever_the_rate_channels_and_stated_total(
        tmp_path):
    """A native FLAC is fed to the decoder frame by frame from its own headers, and a cut seeks
    by interpolating over the bytes (src/audio/flac_frames.h): stereo at 44.1 kHz (side-channel
    coding, a rate code of its own), a STREAMINFO whose total is 0 (unknown: the seek walks the
    frames), a stream cut short mid-frame (its last whole frames decode, then the error names
    the time), and a cut past the end; every cut equals the slice of the PCM it was made from."""
    x = sweep(4.0, 44100, channels=2, noise=0.05, seed=3)
    want = write_wav(tmp_path / "s.wav", x, 44100)
    flac = encode(tmp_path / "s.flac", x, 44100, "flac").read_bytes()
    assert flac[:4] == b"fLaC" and flac[4] & 0x7F == 0  # STREAMINFO first
    unknown = bytearray(flac)
    unknown[8 + 13] &= 0xF0  # STREAMINFO's total samples: 0, unknown
    unknown[8 + 14:8 + 18] = b"\0\0\0\0"
    for source in (tmp_path / "s.flac", flac, bytes(unknown)):
        for at in (0, 1, 4095, 4096, 4097, 44100, 3 * 44100 + 17, len(want) - 300):
            cut = audio.load(source, offset=at / 44100, duration=0.2, sample_rate=44100,
                             mono=False)
            np.testing.assert_array_equal(cut, want[at:at + 8820])
        whole = audio.load(source, sample_rate=44100, mono=False)
        np.testing.assert_array_equal(whole, want)
    with pytest.raises(stoker.DecodeError, match=r"<bytes>: offset t=4.500 s is past the end"):
        audio.load(flac, offset=4.5, duration=0.1, sample_rate=44100)
    cut_short = flac[:len(flac) * 3 // 4]
    with pytest.raises(stoker.DecodeError, match=r"<bytes>: corrupt audio near t=2\.\d+ s"):
        audio.load(cut_short, sample_rate=44100)
    np.testing.assert_array_equal(  # what comes before the cut is whole
        audio.load(cut_short, offset=1.0, duration=0.5, sample_rate=44100, mono=False),
        want[44100:44100 + 22050])


@pytest.mark.parametrize("rate, up, down", [(44100, 160, 441), (48000, 1, 3), (8000, 2, 1)])
def test_resampling_matches_scipy_resample_poly(rate, up, down, tmp_path):
    """libswresample's soxr engine against scipy.signal.resample_poly (Kaiser window, beta 5)
    to 16 kHz, on a sweep from 100 Hz to 6 kHz (3.2 kHz at 8 kHz): both keep the passband, so
    they agree to the tolerance docs/audio.md states (2e-3) away from the edges."""
    signal = pytest.importorskip("scipy.signal")
    x = sweep(2.0, rate, f1=min(6000.0, 0.4 * rate))
    want = write_wav(tmp_path / "a.wav", x, rate)[:, 0]
    got = audio.load(tmp_path / "a.wav")
    ref = signal.resample_poly(want.astype(np.float64), up, down)
    assert len(got) == len(ref) == 32000
    err = np.abs(got[200:-200] - ref[200:-200]).max()
    assert err < 2e-3, (audio.resampler(), err)


# ------------------------------------------------------------------------- datasets


def make_folder(tmp_path, durations=(0.5, 1.0, 0.75, 1.25, 0.25), rate=22050):
    root = tmp_path / "clips"
    root.mkdir()
    for i, d in enumerate(durations):
        write_wav(root / f"{i:02d}.wav", sweep(d, rate, noise=0.05, seed=i), rate)
    return root


def batches(loader, key="audio"):
    return [(np.asarray(b[key]), np.asarray(b[f"{key}_lens"]), b.get("text")) for b in loader]


def test_a_folder_batches_padded_audio_with_lengths(tmp_path):
    ds = stoker.AudioDataset(make_folder(tmp_path))
    assert len(ds) == 5
    np.testing.assert_allclose(ds._lengths("seconds"), [0.5, 1.0, 0.75, 1.25, 0.25], atol=1e-4)
    b = next(iter(stoker.DataLoader(ds, batch_size=2, output="numpy")))
    assert set(b) == {"audio", "audio_lens"}
    assert b["audio"].dtype == np.float32 and b["audio"].shape == (2, 16000)
    assert b["audio_lens"].tolist() == [8000, 16000]
    np.testing.assert_array_equal(b["audio"][0, 8000:], 0)
    np.testing.assert_allclose(b["audio"][0, :8000], ds[0]["audio"])


def test_every_sample_once_an_epoch_the_same_whatever_the_workers_and_resumes(tmp_path):
    ds = stoker.AudioDataset(make_folder(tmp_path, durations=(0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)))
    runs = [batches(stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=3, num_workers=w,
                                      output="numpy")) for w in (1, 3)]
    for (a, la, _), (b, lb, _) in zip(*runs):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)
    assert sorted(int(n) for _, lens, _ in runs[0] for n in lens) == \
        [3200, 4800, 6400, 8000, 9600, 11200, 12800]
    loader = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=3, output="numpy")
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    state = loader.state_dict()
    del it
    resumed = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=3, output="numpy")
    resumed.load_state_dict(state)
    rest = batches(resumed)
    assert len(head) + len(rest) == len(runs[0])
    for (a, la, _), (b, lb, _) in zip(batches(head) + rest, runs[0]):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(la, lb)


def test_a_budget_of_seconds_plans_the_epoch_from_the_headers(tmp_path):
    durations = (0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1)
    ds = stoker.AudioDataset(make_folder(tmp_path, durations=durations))
    loader = stoker.DataLoader(ds, batch_size=stoker.Budget(seconds=2.0), shuffle=True, seed=1,
                               output="numpy")
    seen = []
    for audio_, lens, _ in batches(loader):
        assert audio_.shape[0] * audio_.shape[1] <= 2.0 * 16000  # the padded cost
        seen += lens.tolist()
    assert sorted(seen) == sorted(round(d * 16000) for d in durations)
    assert ds.stats()["decoded_seconds"] == pytest.approx(sum(durations), abs=0.05)


def test_nemo_manifest_cuts_and_transcripts(tmp_path):
    x = sweep(20.0, 16000, noise=0.05)
    want = write_wav(tmp_path / "long.wav", x, 16000)[:, 0]
    encode(tmp_path / "long.flac", x, 16000, "flac")
    lines = [{"audio_filepath": "long.flac", "duration": 0.5, "offset": 12.0, "text": "twelve"},
             {"audio_filepath": str(tmp_path / "long.wav"), "duration": 1.0, "text": "start"},
             {"audio_filepath": "long.flac", "duration": 0.25, "offset": 3.0, "text": "three"}]
    manifest = tmp_path / "train.json"
    manifest.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    ds = stoker.AudioDataset(manifest, max_duration=0.75)
    np.testing.assert_allclose(ds._lengths("seconds"), [0.5, 0.75, 0.25])
    b = next(iter(stoker.DataLoader(ds, batch_size=3, output="numpy")))
    assert b["text"] == ["twelve", "start", "three"]
    assert b["audio_lens"].tolist() == [8000, 12000, 4000]
    np.testing.assert_array_equal(b["audio"][0, :8000], want[192000:200000])
    np.testing.assert_array_equal(b["audio"][1, :12000], want[:12000])
    # the cuts decoded their slices (a packet before, and a pre-roll), never the whole 20 s
    assert ds.stats()["decoded_seconds"] < 0.5 + 0.75 + 0.25 + 3 * 0.5, ds.stats()


def test_lhotse_cutset_manifest(tmp_path):
    x = sweep(6.0, 16000, noise=0.05)
    want = write_wav(tmp_path / "rec.wav", x, 16000)[:, 0]
    rec = {"id": "rec", "sources": [{"type": "file", "channels": [0],
                                     "source": str(tmp_path / "rec.wav")}],
           "sampling_rate": 16000, "num_samples": 96000, "duration": 6.0, "channel_ids": [0]}
    cuts = [{"id": f"c{i}", "start": start, "duration": dur, "channel": 0, "type": "MonoCut",
             "supervisions": [{"id": f"s{i}", "recording_id": "rec", "start": 0.0,
                               "duration": dur, "channel": 0, "text": t} for t in texts],
             "recording": rec}
            for i, (start, dur, texts) in enumerate([(1.0, 0.5, ["hello", "there"]),
                                                     (4.5, 1.0, ["again"]), (0.0, 0.25, [])])]
    path = tmp_path / "cuts.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(c) + "\n" for c in cuts)
    ds = stoker.AudioDataset(path)
    b = next(iter(stoker.DataLoader(ds, batch_size=3, output="numpy")))
    assert b["text"] == ["hello there", "again", None]
    assert b["audio_lens"].tolist() == [8000, 16000, 4000]
    np.testing.assert_array_equal(b["audio"][1], want[72000:88000])
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({**cuts[0], "type": "MixedCut"}) + "\n")
    with pytest.raises(ValueError, match="MixedCut"):
        stoker.AudioDataset(path)


def test_features_batches_and_the_loaders_stats(tmp_path):
    ds = stoker.AudioDataset(make_folder(tmp_path), features=audio.Fbank(num_mel_bins=40),
                             text=[f"clip {i}" for i in range(5)])
    loader = stoker.DataLoader(ds, batch_size=5, output="numpy")
    b = next(iter(loader))
    assert set(b) == {"features", "features_lens", "text"}
    assert b["features_lens"].tolist() == [1 + (n - 400) // 160
                                           for n in (8000, 16000, 12000, 20000, 4000)]
    assert b["features"].shape == (5, max(b["features_lens"]), 40)
    np.testing.assert_allclose(b["features"][1, :b["features_lens"][1]],
                               audio.Fbank(num_mel_bins=40)(audio.load(ds.path(1))), atol=1e-5)
    stats = loader.stats()["audio"]
    assert stats["clips"] == 5 and stats["features_seconds"] > 0
    assert stats["resampler"] == audio.resampler()
    report = stoker.diagnose(loader, max_batches=1, seconds=1)
    figures = report["figures"]["source_figures"]
    assert {f["stage"] for f in figures} >= {"decode", "resample", "features"}
    assert all(f["advice"] for f in figures if f["stage"])


# ------------------------------------------------------------------------- bad input


@pytest.fixture
def bad_folder(tmp_path):
    root = make_folder(tmp_path, durations=(0.5, 0.5, 0.5))
    x = sweep(1.0, 16000)
    # (a WAV whose data is shorter than its header says is read as FFmpeg reads it: to the end
    # of the file; a manifest's duration catches it, as the test below shows)
    encode(root / "truncated.flac", x, 16000, "flac")
    data = (root / "truncated.flac").read_bytes()
    (root / "truncated.flac").write_bytes(data[:len(data) // 3])
    (root / "empty.wav").write_bytes(b"")
    (root / "corrupt.flac").write_bytes(np.random.default_rng(0).bytes(5000))
    write_wav(root / "codec.wav", x, 16000)  # its format tag made one no decoder knows
    data = bytearray((root / "codec.wav").read_bytes())
    data[20:22] = (0x7777).to_bytes(2, "little")
    (root / "codec.wav").write_bytes(bytes(data))
    bad = {"truncated.flac": "truncated", "empty.wav": "empty", "corrupt.flac": "",
           "codec.wav": "cannot decode (codec tag 0x7777)"}
    return root, {str(root / k): v for k, v in bad.items()}


def test_bad_files_raise_naming_the_file_or_are_skipped_and_counted(bad_folder):
    root, bad = bad_folder
    ds = stoker.AudioDataset(root)
    it = iter(stoker.DataLoader(ds, batch_size=1, num_workers=2, output="numpy"))
    failed, good = {}, 0
    while True:
        try:
            next(it)
            good += 1
        except StopIteration:
            break
        except stoker.SampleError as e:
            failed[e.path] = e
    assert good == 3
    assert set(failed) == set(bad)
    for path, e in failed.items():
        assert path in str(e) and isinstance(e.__cause__, stoker.DecodeError), str(e)
        assert bad[path] in str(e), str(e)
    loader = stoker.DataLoader(ds, batch_size=2, num_workers=2, on_error="skip", output="numpy")
    assert sum(len(b["audio"]) for b in loader) == len(ds)
    assert loader.stats()["skipped"] == len(bad)


def test_a_manifest_that_disagrees_with_the_audio_or_cuts_past_its_end(tmp_path):
    write_wav(tmp_path / "a.wav", sweep(2.0, 16000), 16000)
    lines = [{"audio_filepath": "a.wav", "duration": 3.0},            # 1 s more than there is
             {"audio_filepath": "a.wav", "duration": 0.5, "offset": 5.0},  # past the end
             {"audio_filepath": "a.wav", "duration": 2.05}]           # within the tolerance
    (tmp_path / "m.jsonl").write_text("\n".join(json.dumps(r) for r in lines))
    ds = stoker.AudioDataset(tmp_path / "m.jsonl")
    errors = {}
    for i in range(2):
        try:
            ds[i]
        except stoker.DecodeError as e:
            errors[i] = str(e)
    assert "a.wav" in errors[0] and "decoded 2.000 s" in errors[0] and "3.000 s" in errors[0]
    assert "a.wav" in errors[1] and "past the end" in errors[1] and "t=5.000 s" in errors[1]
    assert len(ds[2]["audio"]) == 32800  # padded with zeros to its stated duration


@pytest.mark.parametrize("codec", ["flac", "mp3", "opus"])
def test_corrupt_frames_mid_stream_are_named_or_concealed_never_a_crash(codec, tmp_path):
    rate = 48000 if codec == "opus" else 16000
    path = encode(tmp_path / f"a.{codec}", sweep(4.0, rate, noise=0.1), rate, codec)
    data = bytearray(path.read_bytes())
    for i in np.random.default_rng(1).integers(len(data) // 3, 2 * len(data) // 3, 200):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    ds = stoker.AudioDataset([path])
    try:
        sample = ds[0]
    except stoker.DecodeError as e:  # a frame the decoder refuses, or audio that ends early
        assert str(path) in str(e) and " s" in str(e), str(e)
    else:  # the decoder concealed it: the sample has its length
        assert len(sample["audio"]) == round(ds._lengths("seconds")[0] * 16000)


def test_stereo_kept_or_averaged_and_a_file_of_other_channels_named(tmp_path):
    root = tmp_path / "st"
    root.mkdir()
    want = [write_wav(root / f"{i}.wav", sweep(0.5, 16000, channels=2, noise=0.1, seed=i), 16000)
            for i in range(2)]
    ds = stoker.AudioDataset(root, mono=False)
    b = next(iter(stoker.DataLoader(ds, batch_size=2, output="numpy")))
    assert b["audio"].shape == (2, 8000, 2)
    np.testing.assert_array_equal(b["audio"][1], want[1])
    mono = next(iter(stoker.DataLoader(stoker.AudioDataset(root), batch_size=2, output="numpy")))
    np.testing.assert_allclose(mono["audio"][0], want[0].mean(axis=1), atol=1e-7)
    write_wav(root / "2.wav", sweep(0.5, 16000), 16000)
    with pytest.raises(stoker.DecodeError, match="2.wav: has 1 channels, not 2"):
        stoker.AudioDataset(root, mono=False)[2]


def test_the_dataset_pickles_as_its_spec(tmp_path):
    import pickle
    ds = stoker.AudioDataset(make_folder(tmp_path), features=audio.LogMel(n_mels=8),
                             max_duration=1.0)
    again = pickle.loads(pickle.dumps(ds))
    assert again._identity() == ds._identity() and again.features == ds.features
    np.testing.assert_array_equal(again[3]["features"], ds[3]["features"])
    assert again[3]["features"].shape == (100, 8)  # 1.25 s cut to max_duration


def test_a_relative_path_with_a_colon_is_a_file_not_a_protocol(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    want = write_wav(tmp_path / "take:2.wav", sweep(0.25, 16000), 16000)[:, 0]
    np.testing.assert_array_equal(stoker.AudioDataset(["take:2.wav"])[0]["audio"], want)


# ------------------------------------------------------------------------- tokenized transcripts


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE trained here, run by stoker.Tokenizer."""
    tokenizers = pytest.importorskip("tokenizers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    words = "the quick brown fox jumps over a lazy dog déjà vu naïve 中文 🙂 12345".split()
    rng = np.random.default_rng(0)
    tok.train_from_iterator(
        [" ".join(rng.choice(words, 12)) for _ in range(200)],
        trainer=tokenizers.trainers.BpeTrainer(
            vocab_size=300, show_progress=False,
            initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet()))
    return stoker.Tokenizer.from_hf(tok)


TRANSCRIPTS = ["the quick brown fox", "", "déjà vu 中文 🙂",
               "a lazy dog jumps over the fox twice", "12345", "naïve"]


def test_transcripts_tokenized_once_batch_as_labels(tmp_path, tokenizer):
    root = make_folder(tmp_path, durations=(0.3, 0.4, 0.5, 0.6, 0.7, 0.8))
    ds = stoker.AudioDataset(root, text=TRANSCRIPTS, tokenizer=tokenizer,
                             features=audio.Fbank(num_mel_bins=16))
    want = [tokenizer.encode(t) for t in TRANSCRIPTS]
    assert ds[2]["labels"].tolist() == want[2] and ds[2]["labels_lens"] == len(want[2])
    assert ds[1]["labels"].tolist() == []
    runs = []
    for workers in (1, 2):
        loader = stoker.DataLoader(ds, batch_size=2, shuffle=True, seed=7, num_workers=workers,
                                   output="numpy")
        runs.append(list(loader))
    seen = []
    for a, b in zip(*runs):
        assert set(a) == {"features", "features_lens", "text", "labels", "labels_lens"}
        for key in ("features", "labels", "labels_lens"):
            np.testing.assert_array_equal(a[key], b[key])
        assert a["labels"].dtype == np.int64
        assert a["labels"].shape == (2, max(max(a["labels_lens"]), 1))
        for text, ids, n in zip(a["text"], a["labels"], a["labels_lens"].tolist()):
            ids_want = want[TRANSCRIPTS.index(text)]
            assert n == len(ids_want) and ids[:n].tolist() == ids_want
            assert (ids[n:] == -100).all()
            seen.append(text)
    assert sorted(seen) == sorted(TRANSCRIPTS)  # every sample once
    import pickle
    again = pickle.loads(pickle.dumps(ds))  # the ids travel, not the tokenizer
    assert again[2]["labels"].tolist() == want[2]


def test_a_transcript_that_is_not_utf8_is_named_by_its_sample(tmp_path, tokenizer):
    root = make_folder(tmp_path, durations=(0.3, 0.4, 0.5))
    manifest = tmp_path / "train.json"
    lines = [b'{"audio_filepath": "clips/00.wav", "duration": 0.3, "text": "fine"}',
             b'{"audio_filepath": "clips/01.wav", "duration": 0.4, "text": "caf\xe9 au lait"}',
             b'{"audio_filepath": "clips/02.wav", "duration": 0.5, "text": "fine too"}']
    manifest.write_bytes(b"\n".join(lines) + b"\n")
    raw = stoker.AudioDataset(manifest)  # without a tokenizer: read, the bytes kept as escapes
    assert raw.texts[1] == "caf\udce9 au lait"
    with pytest.raises(stoker.DecodeError, match=r"sample 1 \(.*01\.wav\).*not valid UTF-8"):
        stoker.AudioDataset(manifest, tokenizer=tokenizer)
    with pytest.raises(stoker.DecodeError, match=r"sample 2 \(.*02\.wav\)"):
        stoker.AudioDataset(root, text=["a", "b", b"\xff\xfe"], tokenizer=tokenizer)
    with pytest.raises(ValueError, match="has none"):
        stoker.AudioDataset(root, tokenizer=tokenizer)
