#!/usr/bin/env python3
"""Audio: stoker.AudioDataset against the peers, side by side in one run (issue 49).

Data (made once in bench/data/audio/, git-ignored): --utterances utterances of speech (160;
--quick 24) made with espeak-ng (Debian's package; installed with apt where missing) in six
voices and four rates, 2-20 s each (a log-uniform target duration, the words to fill it drawn
from Python's own docstrings, seed 0), written at espeak's 22,050 Hz and re-encoded with PyAV:
FLAC 16 kHz, WAV 16 kHz, MP3 44.1 kHz and Opus 48 kHz. Two sets:
* mixed: a third each of FLAC 16 kHz, MP3 44.1 kHz and Opus 48 kHz (utterance i in codec i % 3);
* wav-flac: half FLAC 16 kHz, half WAV 16 kHz.
And one 60-second FLAC (utterances joined) for the slice figure.

Pipeline, every contender: decode, resample to 16 kHz mono, 80-bin log mel filterbank (Kaldi's),
batches of about 200 s of audio, one shuffled epoch. Each contender runs in a measurement child
of its own (its peak RSS is the process tree's); the clock starts after the imports and the
dataset's construction (Lhotse's manifest is made before the clock too), the files are in the
page cache. Figure: seconds of audio delivered per second of wall time, the median of --repeat
for stoker and the bound; each peer configuration runs --peer-repeat times (1).
* stoker: ``AudioDataset(files, sample_rate=16000, features=Fbank(num_mel_bins=80))`` and
  ``stoker.DataLoader(batch_size=Budget(seconds=200), shuffle=True)`` (workers "auto").
* lhotse: Lhotse's ``K2SpeechRecognitionDataset(input_strategy=OnTheFlyFeatures(Fbank(80 bins)))``
  over ``CutSet.resample(16000)`` with ``DynamicBucketingSampler(max_duration=200,
  shuffle=True)``, in torch's DataLoader at 1 and 2 workers, the faster reported (lhotse and
  soundfile from ``bash bench/setup_peers.sh budget``; skipped without it).
* hf: Hugging Face ``datasets``' ``Audio(sampling_rate=16000)`` column (torchcodec decodes and
  resamples) and ``WhisperFeatureExtractor(feature_size=80)`` (its log mel, 30-second padding)
  in the collate of torch's DataLoader, batches of round(200 s / mean duration), at 1 and 2
  workers, the faster reported; beside it stoker-logmel: the same AudioDataset with
  ``features=LogMel(n_mels=80, pad_30s=True)`` (Whisper's features, Whisper's padding).
* bound: FFmpeg's decode and soxr's resample (``stoker.audio.load``, the GIL released in C++)
  of every file on a pool of one thread a usable core, features and batching excluded: the most
  any loader that decodes with FFmpeg could deliver here. Also on one thread: the scaling.
* slice: a 5-second slice 30 s into the 60-second FLAC, one call after another:
  ``stoker.audio.load(path, offset=30, duration=5)`` against ``soundfile.read(path, start,
  stop)`` (the peer environment's soundfile), per call.

Targets: stoker >= 0.85x the bound; >= 1.7x the best peer on the mixed set; >= 3x on wav-flac;
the slice faster than soundfile; the bound's scaling from 1 to 2 threads >= 1.8x; stoker's
peak RSS <= 0.5x the best peer's.

    python bench/bench_audio.py [--quick] [--utterances N] [--repeat 3] [--peer-repeat 1]
                                [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from harness import emit, machine_line, median_epochs, median_of, peer_python, read_files, \
    run_measured, write_json

HERE = os.path.abspath(__file__)
DATA = Path(__file__).resolve().parent / "data" / "audio"
BUDGET_S = 200.0
VOICES = ("en-us", "en-gb", "en-gb-scotland", "en-gb-x-rp", "en+f3", "en-us+m3")
RATES = (130, 155, 180, 205)
FORMATS = {  # name: (container/codec, rate, suffix)
    "flac16k": ("flac", 16000, ".flac"),
    "wav16k": ("pcm_s16le", 16000, ".wav"),
    "mp3_44k": ("mp3", 44100, ".mp3"),
    "opus48k": ("libopus", 48000, ".opus"),
}
TARGETS = {"bound": 0.85, "mixed": 1.7, "wav-flac": 3.0, "scaling": 1.8, "rss": 0.5}


# --- data ------------------------------------------------------------------------------------

def _words():
    """English words from Python's docstrings, in a fixed order."""
    import pydoc
    import re
    words = []
    for name in ("json", "os", "re", "collections", "argparse", "subprocess", "threading",
                 "statistics", "pathlib", "functools", "itertools", "textwrap"):
        doc = pydoc.render_doc(__import__(name), renderer=pydoc.plaintext)
        words += re.findall(r"[A-Za-z]{2,}", doc)
    return words


def _encode(src, dst, codec, rate):
    """``src`` (WAV) re-encoded by PyAV to ``codec`` at ``rate`` Hz, mono."""
    import av
    with av.open(str(src)) as inp, av.open(str(dst), "w") as out:
        stream = out.add_stream(codec, rate=rate, layout="mono")
        if codec == "mp3":
            stream.bit_rate = 96000
        resampler = av.AudioResampler(format=stream.codec_context.format, layout="mono",
                                      rate=rate)
        for frame in inp.decode(audio=0):
            for f in resampler.resample(frame):
                for packet in stream.encode(f):
                    out.mux(packet)
        for f in resampler.resample(None):
            for packet in stream.encode(f):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def make_data(n, tag):
    """The utterances in every format, and the 60-second FLAC; made once. Returns the manifest:
    {"utterances": [{"text", "duration", <format>: path}], "long": path}."""
    root = DATA / f"{tag}{n}"
    manifest = root / "manifest.json"  # written last: the data is whole when it exists
    if manifest.exists():
        return json.loads(manifest.read_text())
    if shutil.which("espeak-ng") is None:
        print("installing espeak-ng (apt-get) ...", flush=True)
        subprocess.run(["apt-get", "install", "-y", "-q", "espeak-ng"], check=True,
                       stdout=subprocess.DEVNULL)
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    words = _words()
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for fmt in FORMATS:
        (root / fmt).mkdir(exist_ok=True)
    utterances, at = [], 0
    for i in range(n):
        target = math.exp(rng.uniform(math.log(2.0), math.log(20.0)))
        voice, rate = VOICES[i % len(VOICES)], RATES[(i // len(VOICES)) % len(RATES)]
        count = max(3, int(target * rate / 60))
        text = " ".join(words[(at + k) % len(words)] for k in range(count))
        at += count
        wav = raw / f"utt{i:05d}.wav"
        subprocess.run(["espeak-ng", "-v", voice, "-s", str(rate), "-w", str(wav), text],
                       check=True)
        entry = {"text": text}
        for fmt, (codec, sr, suffix) in FORMATS.items():
            dst = root / fmt / f"utt{i:05d}{suffix}"
            _encode(wav, dst, codec, sr)
            entry[fmt] = str(dst)
        import stoker.audio
        entry["duration"] = stoker.audio.probe(entry["flac16k"])["duration"]
        utterances.append(entry)
    # The long file: utterances joined until 60 s.
    import av
    long_wav = raw / "long.wav"
    chunks, total = [], 0
    for i in range(n):
        with av.open(str(raw / f"utt{i:05d}.wav")) as c:
            for frame in c.decode(audio=0):
                chunks.append(frame.to_ndarray().reshape(-1))
        total = sum(len(c) for c in chunks)
        if total >= 60 * 22050:
            break
    pcm = np.concatenate(chunks)
    reps = math.ceil(60 * 22050 / len(pcm))
    pcm = np.tile(pcm, reps)[:60 * 22050]
    _write_wav(long_wav, pcm, 22050)
    long_flac = root / "long60.flac"
    _encode(long_wav, long_flac, "flac", 16000)
    out = {"utterances": utterances, "long": str(long_flac),
           "seconds_to_make": time.perf_counter() - t0}
    manifest.write_text(json.dumps(out))
    return out


def _write_wav(path, pcm, rate):
    import wave
    if pcm.dtype != np.int16:
        pcm = np.clip(pcm * 32767 if pcm.dtype.kind == "f" else pcm, -32768, 32767).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


def sets(manifest):
    """{set name: (files, durations)}."""
    utts = manifest["utterances"]
    mixed = [u[("flac16k", "mp3_44k", "opus48k")[i % 3]] for i, u in enumerate(utts)]
    wav_flac = [u[("flac16k", "wav16k")[i % 2]] for i, u in enumerate(utts)]
    durations = [u["duration"] for u in utts]
    return {"mixed": (mixed, durations), "wav-flac": (wav_flac, durations)}


# --- measurement children ---------------------------------------------------------------------

def child_stoker(a):
    import stoker
    from stoker.audio import Fbank, LogMel
    files = json.loads(Path(a.files).read_text())
    features = LogMel(n_mels=80, pad_30s=True) if a.features == "logmel" else Fbank(
        num_mel_bins=80)
    ds = stoker.AudioDataset(files, sample_rate=16000, features=features)
    loader = stoker.DataLoader(ds, batch_size=stoker.Budget(seconds=BUDGET_S), shuffle=True,
                               seed=0)
    t0 = time.perf_counter()
    samples = 0
    for batch in loader:
        samples += len(batch["features_lens"])
    return {"wall_s": time.perf_counter() - t0, "samples": samples}


def child_bound(a):
    from concurrent.futures import ThreadPoolExecutor
    import stoker.audio
    files = json.loads(Path(a.files).read_text())
    t0 = time.perf_counter()
    with ThreadPoolExecutor(a.threads) as pool:
        samples = sum(1 for w in pool.map(
            lambda p: stoker.audio.load(p, sample_rate=16000), files) if len(w))
    return {"wall_s": time.perf_counter() - t0, "samples": samples}


def child_lhotse(a):
    import torch
    from lhotse import CutSet, Fbank, FbankConfig, Recording, RecordingSet, \
        SupervisionSegment, SupervisionSet
    from lhotse.dataset import DynamicBucketingSampler, K2SpeechRecognitionDataset, \
        OnTheFlyFeatures
    torch.set_num_threads(1)
    files = json.loads(Path(a.files).read_text())
    texts = json.loads(Path(a.texts).read_text())
    recordings = RecordingSet.from_recordings(
        Recording.from_file(p, recording_id=f"r{i}") for i, p in enumerate(files))
    sups = SupervisionSet.from_segments(
        SupervisionSegment(id=f"s{i}", recording_id=f"r{i}", start=0.0,
                           duration=recordings[f"r{i}"].duration, text=t)
        for i, t in enumerate(texts))
    cuts = CutSet.from_manifests(recordings=recordings, supervisions=sups).resample(16000)
    sampler = DynamicBucketingSampler(cuts, max_duration=BUDGET_S, shuffle=True, seed=0,
                                      num_buckets=4)
    dataset = K2SpeechRecognitionDataset(
        input_strategy=OnTheFlyFeatures(Fbank(FbankConfig(num_mel_bins=80))))
    loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=None,
                                         num_workers=a.workers,
                                         persistent_workers=False)
    t0 = time.perf_counter()
    samples = 0
    for batch in loader:
        samples += len(batch["inputs"])
    return {"wall_s": time.perf_counter() - t0, "samples": samples}


def child_hf(a):
    import torch
    from datasets import Audio, Dataset
    from transformers import WhisperFeatureExtractor
    files = json.loads(Path(a.files).read_text())
    fe = WhisperFeatureExtractor(feature_size=80)
    ds = Dataset.from_dict({"audio": files}).cast_column("audio", Audio(sampling_rate=16000))

    def collate(rows):
        arrays = []
        for r in rows:
            audio = r["audio"]
            if hasattr(audio, "get_all_samples"):  # datasets 4.x: a torchcodec decoder
                arrays.append(audio.get_all_samples().data.mean(0).numpy())
            else:
                arrays.append(np.asarray(audio["array"], np.float32))
        out = fe(arrays, sampling_rate=16000, return_tensors="pt")
        return out["input_features"]

    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True,
                                         num_workers=a.workers, collate_fn=collate,
                                         generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    samples = 0
    for features in loader:
        samples += len(features)
    return {"wall_s": time.perf_counter() - t0, "samples": samples}


def child_slice(a):
    reps = 50
    if a.peer == "soundfile":
        import soundfile
        info = soundfile.info(a.path)
        start, stop = int(30 * info.samplerate), int(35 * info.samplerate)
        soundfile.read(a.path, start=start, stop=stop, dtype="float32")
        t0 = time.perf_counter()
        for _ in range(reps):
            x, _ = soundfile.read(a.path, start=start, stop=stop, dtype="float32")
    else:
        import stoker.audio
        stoker.audio.load(a.path, offset=30.0, duration=5.0, sample_rate=16000)
        t0 = time.perf_counter()
        for _ in range(reps):
            x = stoker.audio.load(a.path, offset=30.0, duration=5.0, sample_rate=16000)
    return {"per_call_ms": (time.perf_counter() - t0) / reps * 1e3, "samples": int(len(x))}


CHILDREN = {"stoker": child_stoker, "bound": child_bound, "lhotse": child_lhotse,
            "hf": child_hf, "slice": child_slice}


# --- the parent -------------------------------------------------------------------------------

def measure(python, args, repeat, timeout, audio_s=None, samples=None):
    """The median of ``repeat`` epochs of a child; with ``audio_s``, its seconds of audio a
    second (an epoch delivers every sample: ``samples`` of them, or the run is an error)."""
    if samples is None:  # not an epoch (the slice)
        return median_of([_run(python, args, timeout) for _ in range(repeat)])
    out = median_epochs([python, HERE, "--child", *args], repeat, samples, timeout=timeout)
    if audio_s is not None and "wall_s" in out:
        out["audio_per_s"] = audio_s / out["wall_s"]
    return out


def _run(python, args, timeout):
    try:
        return run_measured([python, HERE, "--child", *args], timeout=timeout)
    except RuntimeError as e:
        return {"error": str(e)}


def fmt_rss(b):
    return f"{b / 2**20:,.0f} MiB" if b else "-"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 24 utterances, 1 round")
    p.add_argument("--utterances", type=int, help="utterances (160; --quick 24)")
    p.add_argument("--repeat", type=int, help="rounds of stoker and the bound (median; 3, --quick 1)")
    p.add_argument("--peer-repeat", type=int, default=1,
                   help="rounds of each peer configuration (1: the fastest of its worker counts "
                        "is reported; the peers are several times slower than stoker)")
    p.add_argument("--timeout", type=float, default=900, help="seconds a child may run")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    p.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    p.add_argument("--files", help=argparse.SUPPRESS)
    p.add_argument("--texts", help=argparse.SUPPRESS)
    p.add_argument("--features", default="fbank", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=8, help=argparse.SUPPRESS)
    p.add_argument("--peer", help=argparse.SUPPRESS)
    p.add_argument("--path", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        emit(CHILDREN[a.child](a))
        return 0
    n = a.utterances or (24 if a.quick else 160)
    repeat = a.repeat or (1 if a.quick else 3)
    print(machine_line())
    try:
        import stoker._audio  # noqa: F401
    except ImportError as e:
        print(f"this stoker has no audio module ({e}): nothing to measure")
        return 1
    manifest = make_data(n, "quick-" if a.quick else "")
    utts = manifest["utterances"]
    total = sum(u["duration"] for u in utts)
    print(f"data: {n} utterances, {total:,.0f} s of speech ({total / n:.1f} s mean, "
          f"{min(u['duration'] for u in utts):.1f}-{max(u['duration'] for u in utts):.1f} s), "
          f"espeak-ng, {len(VOICES)} voices x {len(RATES)} rates; bench/data/audio/")
    peer = peer_python("budget")
    me = sys.executable
    cores = len(os.sched_getaffinity(0))
    work = DATA / "runs"
    work.mkdir(parents=True, exist_ok=True)
    texts = work / "texts.json"
    texts.write_text(json.dumps([u["text"] for u in utts]))
    figures = {"utterances": n, "audio_s": total, "sets": {}}
    mean = total / n
    hf_batch = max(1, round(BUDGET_S / mean))
    ok = True
    for name, (files, _) in sets(manifest).items():
        listing = work / f"{name}.json"
        listing.write_text(json.dumps(files))
        read_files(files)
        common = ["--files", str(listing)]
        row = {}

        def run(python, args, rounds=repeat):
            return measure(python, args, rounds, a.timeout, total, len(files))

        row["bound"] = run(me, ["bound", *common, "--threads", str(cores)])
        row["bound-1"] = run(me, ["bound", *common, "--threads", "1"])
        row["stoker"] = run(me, ["stoker", *common])
        row["stoker-logmel"] = run(me, ["stoker", *common, "--features", "logmel"])
        for w in (1, 2):
            row[f"hf-w{w}"] = run(me, ["hf", *common, "--workers", str(w), "--batch",
                                       str(hf_batch)], a.peer_repeat)
            if peer:
                row[f"lhotse-w{w}"] = run(peer, ["lhotse", *common, "--texts", str(texts),
                                                 "--workers", str(w)], a.peer_repeat)
        figures["sets"][name] = row
        print(f"\n{name}: {len(files)} files, {total:,.0f} s of audio; seconds of audio a second "
              f"(median of {repeat}), peak RSS of the process tree")
        print(f"  {'contender':<16} {'audio s/s':>10} {'vs bound':>9} {'peak RSS':>10}")
        bound = row["bound"].get("audio_per_s")
        for k, r in row.items():
            if "audio_per_s" not in r:
                print(f"  {k:<16} {'failed: ' + r.get('error', '?')[:60]}")
                continue
            vs = f"{r['audio_per_s'] / bound:.2f}x" if bound else "-"
            print(f"  {k:<16} {r['audio_per_s']:>10,.1f} {vs:>9} {fmt_rss(r['peak_rss']):>10}")
        best = lambda keys: max((row[k] for k in keys if "audio_per_s" in row[k]),  # noqa: E731
                                key=lambda r: r["audio_per_s"], default=None)
        fb_peer = best([k for k in row if k.startswith("lhotse")])
        hf_peer = best([k for k in row if k.startswith("hf")])
        s, sl = row["stoker"], row["stoker-logmel"]
        lines = []
        if "audio_per_s" in s and bound:
            r = s["audio_per_s"] / bound
            ok &= r >= TARGETS["bound"]
            lines.append(f"stoker / bound: {r:.2f}x (target >= {TARGETS['bound']})")
        target = TARGETS[name]
        if fb_peer and "audio_per_s" in s:
            r = s["audio_per_s"] / fb_peer["audio_per_s"]
            ok &= r >= target
            lines.append(f"stoker / lhotse (fbank): {r:.2f}x (target >= {target}); peak RSS "
                         f"{s['peak_rss'] / fb_peer['peak_rss']:.2f}x (target <= "
                         f"{TARGETS['rss']})")
        if hf_peer and "audio_per_s" in sl:
            r = sl["audio_per_s"] / hf_peer["audio_per_s"]
            ok &= r >= target
            lines.append(f"stoker-logmel / hf (Whisper log mel): {r:.2f}x (target >= {target}); "
                         f"peak RSS {sl['peak_rss'] / hf_peer['peak_rss']:.2f}x")
        if bound and "audio_per_s" in row["bound-1"]:
            r = bound / row["bound-1"]["audio_per_s"]
            ok &= cores < 2 or r >= TARGETS["scaling"]
            lines.append(f"bound scaling 1 -> {cores} threads: {r:.2f}x (target >= "
                         f"{TARGETS['scaling']})")
        for line in lines:
            print("  " + line)
    sl_st = measure(me, ["slice", "--peer", "stoker", "--path", manifest["long"]], repeat,
                    a.timeout)
    sl_sf = measure(peer, ["slice", "--peer", "soundfile", "--path", manifest["long"]], repeat,
                    a.timeout) if peer else {"error": "no peer environment"}
    figures["slice"] = {"stoker": sl_st, "soundfile": sl_sf}
    print("\nslice: 5 s at 30 s of a 60-second FLAC (16 kHz), per call")
    for k, r in figures["slice"].items():
        print(f"  {k:<10} " + (f"{r['per_call_ms']:.2f} ms ({r['samples']} samples)"
                               if "per_call_ms" in r else f"failed: {r.get('error')}"))
    if "per_call_ms" in sl_st and "per_call_ms" in sl_sf:
        r = sl_sf["per_call_ms"] / sl_st["per_call_ms"]
        ok &= r > 1.0
        print(f"  stoker {r:.2f}x soundfile's speed (target > 1)")
    if a.json:
        write_json(a.json, figures)
    print("\nall targets met" if ok else "\nsome targets missed (above)")
    return 0


if __name__ == "__main__":
    import record  # bench/record.py: a full run's output also goes to bench/results/
    sys.exit(record.run(main))
