"""AudioDataset over Lhotse Shar (stoker/audio/shar.py): cuts shards (cuts.NNNNNN.jsonl.gz) and
recording tar shards (<cut_id>.<format> then <cut_id>.json, .nodata/.nometa for a cut without
audio), as Lhotse's CutSet.from_shar reads them. The Shar here is written with the standard
library in SharWriter's layout (the main test environment has no Lhotse); where Lhotse is
importable, one written by Lhotse's own SharWriter is read as CutSet.from_shar reads it.

Each sample equals its member decoded as a file (bit for bit), a cut's start and duration cut
it; every cut once an epoch whatever the workers, resume, Budget(seconds=); bad Shars named."""

import gzip
import io
import json
import os
import pickle
import re
import tarfile
import warnings

import numpy as np
import pytest

import stoker

pytest.importorskip("stoker._audio", reason="this build has no audio module")
from stoker import audio  # noqa: E402
from test_audio import encode, sweep, write_wav  # noqa: E402
from test_audio_sources import batches, same, same_as_local  # noqa: E402

# (cut id, codec, seconds stored, rate, start, duration, transcript): two shards of three cuts
CUTS = [("utt-a", "flac", 0.50, 16000, 0.0, 0.50, "hello there"),
        ("spk1.utt-b", "wav", 0.40, 16000, 0.0, 0.40, None),  # a dot in the id, no supervision
        ("utt-c", "opus", 0.60, 48000, 0.0, 0.60, "third"),
        ("utt-d", "mp3", 0.55, 22050, 0.0, 0.55, "a b"),
        ("utt-e", "flac", 0.70, 16000, 0.20, 0.30, "sliced"),  # start > 0: a stretch of it
        ("utt-f", "wav", 0.45, 8000, 0.0, 0.45, "last one")]


def add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def cut_json(cut_id, start, duration, rate, text):
    """A cut as SharWriter writes it: its recording a placeholder of type "shar"."""
    sups = [] if text is None else [
        {"id": f"{cut_id}-sup", "recording_id": cut_id, "start": 0.0, "duration": duration,
         "channel": 0, "text": w} for w in text.split(" ", 1)]
    return {"id": cut_id, "start": start, "duration": duration, "channel": 0,
            "supervisions": sups,
            "recording": {"id": cut_id, "sources": [{"type": "shar", "channels": [0],
                                                     "source": ""}],
                          "sampling_rate": rate, "num_samples": round(duration * rate),
                          "duration": duration, "channel_ids": [0]},
            "type": "MonoCut"}


def write_cuts(path, cuts, raw_lines=()):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for c in cuts:
            f.write(json.dumps(c) + "\n")
        for line in raw_lines:
            f.write(line + "\n")
    return str(path)


def write_recordings(path, members):
    """members: (cut id, ext or "nodata", bytes); each followed by its .json (or .nometa)."""
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for cut_id, ext, data in members:
            add(tar, f"{cut_id}.{ext}", data)
            if ext == "nodata":
                add(tar, f"{cut_id}.nometa", b"")
            else:
                add(tar, f"{cut_id}.json", json.dumps({"id": cut_id}).encode() + b"\n")
    return str(path)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The stored audio as files (files/<id>.<ext>) and as a Shar of 2 shards (shar/)."""
    root = tmp_path_factory.mktemp("audio_shar")
    (root / "files").mkdir()
    (root / "shar").mkdir()
    files, shards = [], [([], []), ([], [])]
    for i, (cut_id, codec, seconds, rate, start, duration, text) in enumerate(CUTS):
        x = sweep(seconds, rate, noise=0.05, seed=i)
        path = root / "files" / f"{cut_id}.{codec}"
        write_wav(path, x, rate) if codec == "wav" else encode(path, x, rate, codec)
        files.append(str(path))
        cuts, members = shards[i // 3]
        cuts.append(cut_json(cut_id, start, duration, rate, text))
        members.append((cut_id, codec, path.read_bytes()))
    fields = {"cuts": [], "recording": []}
    for s, (cuts, members) in enumerate(shards):
        fields["cuts"].append(write_cuts(root / "shar" / f"cuts.{s:06d}.jsonl.gz", cuts))
        fields["recording"].append(
            write_recordings(root / "shar" / f"recording.{s:06d}.tar", members))
    (root / "shar" / "features.000000.tar").write_bytes(b"")  # another field: not read
    return {"root": root, "dir": str(root / "shar"), "files": files, "fields": fields,
            "shards": shards}


def test_shar_cuts_are_their_members_decoded_with_their_transcripts(made):
    ds = stoker.AudioDataset(made["dir"])
    assert len(ds) == len(CUTS)
    assert [ds.path(i) for i in range(len(ds))] == \
        [f"{made['fields']['recording'][i // 3]}:{c[0]}" for i, c in enumerate(CUTS)]
    assert ds.texts == [c[6] for c in CUTS]
    np.testing.assert_array_equal(ds._lengths("seconds"), [c[5] for c in CUTS])
    for i, (cut_id, _, _, _, start, duration, _) in enumerate(CUTS):
        want = audio.load(made["files"][i], offset=start, duration=duration)
        np.testing.assert_array_equal(ds[i]["audio"], want)  # bit-identical
    assert len(ds[4]["audio"]) == round(0.30 * 16000)
    by_fields = stoker.AudioDataset(made["fields"], text=False)  # Lhotse's fields= form
    assert by_fields._identity() == ds._identity() and by_fields.texts is None
    again = pickle.loads(pickle.dumps(ds))
    assert again._identity() == ds._identity() and again.texts == ds.texts


def test_shar_epochs_hold_every_cut_once_whatever_the_workers_and_resume(made):
    ds = stoker.AudioDataset(made["fields"])
    kw = dict(batch_size=2, shuffle=True, seed=3, output="numpy")
    runs = [batches(stoker.DataLoader(ds, num_workers=w, **kw)) for w in (1, 2)]
    same(*runs)
    assert sorted(t for _, _, texts in runs[0] for t in texts if t) == \
        sorted(c[6] for c in CUTS if c[6])
    want = sorted(round(c[5] * 16000) for c in CUTS)
    assert sorted(int(n) for _, lens, _ in runs[0] for n in lens) == want
    loader = stoker.DataLoader(ds, **kw)
    it = iter(loader)
    head = [next(it)]
    state = loader.state_dict()
    del it
    resumed = stoker.DataLoader(ds, **kw)
    resumed.load_state_dict(state)
    same(batches(head) + batches(resumed), runs[0])
    seen = []
    for x, lens, _ in batches(stoker.DataLoader(ds, batch_size=stoker.Budget(seconds=1.0),
                                                shuffle=True, seed=1, output="numpy")):
        assert x.shape[0] * x.shape[1] <= 1.0 * 16000
        seen += lens.tolist()
    assert sorted(seen) == want


def bad_shar(root, cuts, members, raw_lines=()):
    root.mkdir()
    write_cuts(root / "cuts.000000.jsonl.gz", cuts, raw_lines)
    write_recordings(root / "recording.000000.tar", members)
    return str(root), f"{root}/recording.000000.tar"


def test_cuts_without_their_audio_are_named_or_skipped_and_counted(made, tmp_path):
    (a, b, c), (m_a, m_b, m_c) = made["shards"][0]
    d = cut_json("utt-z", 0.0, 0.5, 16000, "gone")  # in the cuts, not in the tar at all
    root, tar = bad_shar(tmp_path / "s", [a, b, d, c],
                         [m_a, (b["id"], "nodata", b""), m_c])
    with pytest.raises(ValueError,
                       match=rf"{re.escape(tar)}:spk1\.utt-b: a cut without audio \(\.nodata\)"):
        stoker.AudioDataset(root)
    ds = stoker.AudioDataset(root, missing="skip")
    assert [ds.path(i) for i in range(len(ds))] == [f"{tar}:utt-a", f"{tar}:utt-c"]
    assert ds.stats()["skipped_keys"] == 2
    assert sorted(ds.skipped) == [f"{tar}:spk1.utt-b: a cut without audio (.nodata)",
                                  f"{tar}:utt-z: no audio member (<cut_id>.flac, .wav, .opus, "
                                  f".mp3, ...)"]
    np.testing.assert_array_equal(ds[1]["audio"], audio.load(made["files"][2], duration=0.6))
    # A member that is no audio is named when read, as any tar member is
    root, tar = bad_shar(tmp_path / "junk", [a, c], [m_a, (c["id"], "opus", b"junk" * 500)])
    loader = stoker.DataLoader(stoker.AudioDataset(root), batch_size=1, output="numpy")
    with pytest.raises(stoker.SampleError, match=rf"{re.escape(tar)}:utt-c") as e:
        list(loader)
    assert isinstance(e.value.__cause__, stoker.DecodeError)


def test_a_multicut_keeps_its_channels_or_averages_them(tmp_path):
    """A MultiCut of 2 channels, in a member named .original (as SharWriter(format="original")
    names it: the codec is told by the content)."""
    path = encode(tmp_path / "st.flac", sweep(0.4, 16000, channels=2), 16000, "flac")
    cut = dict(cut_json("two", 0.0, 0.4, 16000, "both"), type="MultiCut", channel=[0, 1])
    cut["recording"]["channel_ids"] = [0, 1]
    root, _ = bad_shar(tmp_path / "s", [cut], [("two", "original", path.read_bytes())])
    kept = stoker.AudioDataset(root, mono=False)
    assert kept.channels == 2 and kept.texts == ["both"]
    np.testing.assert_array_equal(kept[0]["audio"], audio.load(path, mono=False))
    np.testing.assert_array_equal(stoker.AudioDataset(root)[0]["audio"], audio.load(path))


def test_shards_out_of_step_or_unreadable_are_named(made, tmp_path):
    (a, b, c), (m_a, m_b, m_c) = made["shards"][0]
    root, tar = bad_shar(tmp_path / "order", [a, b, c], [m_a, m_c, m_b])
    with pytest.raises(ValueError,
                       match=rf"{re.escape(tar)}: cut 'spk1\.utt-b' comes after cut 'utt-c'"):
        stoker.AudioDataset(root)
    root, tar = bad_shar(tmp_path / "other", [a, c], [m_a, m_b, m_c])
    with pytest.raises(ValueError, match=rf"{re.escape(tar)}: member 'spk1\.utt-b' is no cut "
                                         rf"of .*cuts\.000000\.jsonl\.gz"):
        stoker.AudioDataset(root)
    root, _ = bad_shar(tmp_path / "twice", [a, b, a], [m_a, m_b])
    with pytest.raises(ValueError, match=r"cuts\.000000\.jsonl\.gz:3: cut id 'utt-a' is there "
                                         r"twice"):
        stoker.AudioDataset(root)
    root, _ = bad_shar(tmp_path / "line", [a, b], [m_a, m_b], raw_lines=['{"id": "utt-c", '])
    with pytest.raises(ValueError, match=r"cuts\.000000\.jsonl\.gz:3: not JSON"):
        stoker.AudioDataset(root)
    root, _ = bad_shar(tmp_path / "gz", [a], [m_a])
    data = open(f"{root}/cuts.000000.jsonl.gz", "rb").read()
    open(f"{root}/cuts.000000.jsonl.gz", "wb").write(data[:len(data) // 2])
    with pytest.raises(ValueError, match=r"cuts\.000000\.jsonl\.gz: not a readable gzip file"):
        stoker.AudioDataset(root)
    mixed = dict(made["fields"], recording=made["fields"]["recording"][:1])
    with pytest.raises(ValueError, match="2 cuts shards but 1 recording shards"):
        stoker.AudioDataset(mixed)
    with pytest.raises(ValueError, match="no recording shards"):
        stoker.AudioDataset({"cuts": made["fields"]["cuts"]})
    mixed_cut = dict(a, type="MixedCut")
    root, _ = bad_shar(tmp_path / "mixed", [mixed_cut], [m_a])
    with pytest.raises(ValueError, match=r"cuts\.000000\.jsonl\.gz:1 \(cut 'utt-a'\): a "
                                         r"MixedCut"):
        stoker.AudioDataset(root)


def test_remote_shar_equals_the_local_one(made, s3_server, monkeypatch, tmp_path):
    pytest.importorskip("obstore")
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("STOKER_CACHE_DIR", str(tmp_path / "cache"))
    files = made["fields"]["cuts"] + made["fields"]["recording"]
    s3_server.put("shar", {os.path.basename(p): open(p, "rb").read() for p in files})
    url = {k: [f"s3://shar/{os.path.basename(p)}" for p in v] for k, v in made["fields"].items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        remote = stoker.AudioDataset(url)
    local = stoker.AudioDataset(made["fields"])
    same_as_local(remote, local, [f"s3://shar/recording.{i // 3:06d}.tar:{c[0]}"
                                  for i, c in enumerate(CUTS)])
    kw = dict(batch_size=2, shuffle=True, seed=4, output="numpy")
    for directory in ("s3://shar", "s3://shar/"):  # listed, as a local directory is
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            listed = stoker.AudioDataset(directory)
        assert [listed.path(i) for i in range(len(listed))] == \
            [remote.path(i) for i in range(len(remote))]
        same(batches(stoker.DataLoader(listed, **kw)), batches(stoker.DataLoader(local, **kw)))


def test_a_shar_written_by_lhotse_reads_as_cutset_from_shar(made, tmp_path):
    """Lhotse's own SharWriter over cuts truncated from a FLAC and a WAV recording (where Lhotse
    is importable: not in the main test environment; checked by hand, docs/audio.md)."""
    lhotse = pytest.importorskip("lhotse")
    from lhotse.shar import SharWriter
    cuts = []
    for i in (0, 1):  # utt-a.flac 0.5 s, spk1.utt-b.wav 0.4 s
        rec = lhotse.Recording.from_file(made["files"][i], recording_id=f"rec{i}")
        cut = rec.to_cut().truncate(offset=0.1, duration=0.25)
        cut.supervisions = [lhotse.SupervisionSegment(id=f"sup{i}", recording_id=rec.id,
                                                      start=0.0, duration=0.25, text=f"text {i}")]
        cuts.append(cut)
    out = tmp_path / "lhotse_shar"
    out.mkdir()
    with SharWriter(str(out), fields={"recording": "flac"}, shard_size=1) as w:
        for cut in cuts:
            w.write(cut)
    theirs = list(lhotse.CutSet.from_shar(in_dir=str(out)))
    ds = stoker.AudioDataset(str(out))
    assert [ds.path(i).rsplit(":", 1)[1] for i in range(len(ds))] == [c.id for c in theirs]
    assert ds.texts == ["text 0", "text 1"]
    np.testing.assert_array_equal(ds._lengths("seconds"), [c.duration for c in theirs])
    for i, cut in enumerate(theirs):
        np.testing.assert_array_equal(ds[i]["audio"], cut.load_audio()[0])
