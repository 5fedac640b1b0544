"""A wheel in a clean room: installed into a fresh virtual environment of the interpreter it is
for, with numpy from the package index and nothing else, run outside the checkout with
LD_LIBRARY_PATH empty. There it must decode a JPEG and a PNG through ImageFolder (with the
libjpeg and libpng of its own stoker.libs/, never the system's), read a token file, run the
Python-dataset wing's CPython code (the limited API of the abi3 wheel), answer `stoker --help`
and `python -m stoker.info`, and take from the system nothing beyond its manylinux policy's
libraries (ldd of every shared object it installed). A wheel with the video module (make
wheels) decodes an H.264 and an AV1 video with its own FFmpeg, frames equal to PyAV's. A wheel
with the audio module (make wheels) decodes a WAV, a FLAC and an Opus file with its own FFmpeg
(the lossless ones to the samples written) and resamples them to 16 kHz with libswresample's soxr
engine (libsoxr linked into the wheel's libswresample, none of the system's), as
scipy.signal.resample_poly does within 2e-3. With --tables: the same wheel with `[tables]`
(pyarrow from the index) reads Parquet, its stoker._arrow linking pyarrow's own libarrow and
libparquet.

    python tools/clean_room.py WHEEL [--python PYTHON] [--tables]

Run with the checkout's .venv (it makes the test images with Pillow, the videos and the FLAC and
Opus files with PyAV, and resamples the references with scipy). tests/python/test_wheel.py
(make test: the test interpreter's wheel) and tools/build_wheels.py --test (make wheels-test:
every wheel, every interpreter found for it) call room() and tables_room().
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from pathlib import Path

import numpy as np

# The room's audio, where the wheel has the audio module (make wheels): each file of
# DATA/audio at its own rate and at 16 kHz (saved for the comparison outside the room), and all
# of them as one AudioDataset batch. Part of ROOM; tests/python/test_wheel.py runs it in-process
# against the checkout's build to hold audio_problems to what it must find.
AUDIO_ROOM = textwrap.dedent("""
    def audio_seen(data):
        import glob, os
        import numpy as np
        import stoker
        from stoker import audio as A
        paths = sorted(glob.glob(os.path.join(data, "audio", "*")))
        audio = {"paths": paths, "resampler": A.resampler(),
                 "probe": [A.probe(p) for p in paths]}
        for i, (p, info) in enumerate(zip(paths, audio["probe"])):
            np.save(os.path.join(data, f"audio{i}.npy"), A.load(p, sample_rate=16000))
            np.save(os.path.join(data, f"audio{i}.own.npy"),
                    A.load(p, sample_rate=info["sample_rate"]))
        batch = next(iter(stoker.DataLoader(stoker.AudioDataset(paths, sample_rate=16000),
                                            batch_size=len(paths), output="numpy")))
        audio["batch"] = [list(batch["audio"].shape), batch["audio_lens"].tolist()]
        return audio
""")

# Runs inside the clean environment; prints one JSON line of what it saw.
ROOM = AUDIO_ROOM + textwrap.dedent("""
    import glob, json, os, subprocess, sys
    import numpy as np
    import stoker
    from importlib.metadata import version
    from stoker import transforms as T
    from stoker._native import pydata as P

    data = sys.argv[1]
    site = os.path.dirname(os.path.dirname(stoker.__file__))
    ds = stoker.ImageFolder(os.path.join(data, "images"))
    decoded = {os.path.basename(path): ds[i][0] for i, (path, _) in enumerate(ds.samples)}
    for name, image in decoded.items():
        np.save(os.path.join(data, name + ".npy"), image)
    loader = stoker.DataLoader(
        stoker.ImageFolder(os.path.join(data, "images"),
                           transform=T.Compose([T.Resize((16, 16)), T.ToTensor("uint8")])),
        batch_size=2, output="numpy", num_workers=2)
    batches = [(x.shape, y.tolist()) for x, y in loader]
    tokens = stoker.TokenDataset(os.path.join(data, "tokens.bin"), dtype="uint16", seq_len=4)
    first = [x.tolist() for x, y in stoker.DataLoader(tokens, batch_size=2, output="numpy")][0]

    # The Python-dataset wing's own CPython code (src/pydata/), without torch: columns gathered
    # from samples, __getitem__ called, an error carried with its index, a skip recorded.
    cols = P.gather_columns(("T", (("A", 0), ("O", 0))),
                            [(np.arange(3), "a"), (np.arange(3) + 1, "b")],
                            (np.ndarray,), (str,), (np.dtype(np.arange(3).dtype),))
    class Squares:
        def __getitem__(self, i):
            if i == 3:
                raise ValueError("three")
            return i * i
    fetcher = P.SampleFetcher(0, "off", None, None, [False] * 3, skip=True, size=5)
    fetched = fetcher.fetch(Squares(), 0, [0, 1, 2, 3])
    try:
        P.SampleFetcher(0, "off", None, None, [False] * 3).fetch(Squares(), 0, [3])
        raised = None
    except ValueError as e:
        raised = [str(e), getattr(e, "_stoker_index", None)]
    pydata = {"arrays": [[a.tolist() for a in c] for c in cols[0]], "objects": cols[1],
              "fetched": fetched[:3], "replaced": len(fetched) == 4,
              "skipped": [list(s) for s in fetcher.take_skipped()], "raised": raised}

    # The video module, where the wheel has one (make wheels): clips of an H.264 mp4 and an AV1
    # mkv, their frames saved for the comparison with PyAV outside the room.
    video = None
    import importlib.util
    if importlib.util.find_spec("stoker._video") is not None:
        paths = sorted(glob.glob(os.path.join(data, "videos", "*")))
        vds = stoker.VideoDataset(paths, frames=3, stride=2, timestamps=True)
        video = {"paths": paths, "stamps": [], "ffmpeg": stoker._video.ffmpeg_versions()}
        for i in range(len(vds)):
            clip, _, stamps = vds[i]
            np.save(os.path.join(data, f"clip{i}.npy"), clip)
            video["stamps"].append(stamps.tolist())

    audio = audio_seen(data) if importlib.util.find_spec("stoker._audio") is not None else None

    ldd = {}
    for so in glob.glob(os.path.join(site, "stoker*", "**", "*.so*"), recursive=True):
        ldd[so] = subprocess.run(["ldd", so], capture_output=True, text=True).stdout
    with open("/proc/self/maps") as f:
        mapped = sorted({line.split()[-1] for line in f if "/" in line})
    print(json.dumps({
        "file": stoker.__file__, "version": stoker.__version__, "metadata": version("stoker"),
        "native": stoker._native.__file__, "ldd": ldd, "mapped": mapped,
        "batches": [[list(s), y] for s, y in batches], "tokens": first, "pydata": pydata,
        "video": video, "audio": audio,
        "cuda": stoker.cuda_available(), "testing": hasattr(stoker._native, "testing"),
        "gpu_signatures": stoker._native.gpu.GpuBatchDecoder.__init__.__doc__ +
        stoker._native.gpu.set_fence_provider.__doc__,
    }))
""")

TABLES_ROOM = textwrap.dedent("""
    import io, json, subprocess, sys
    import numpy as np
    import pyarrow as pa, pyarrow.parquet as pq
    import stoker
    from stoker import transforms as T

    path, png = sys.argv[1], open(sys.argv[2], "rb").read()
    pq.write_table(pa.table({"image": [png] * 6, "label": list(range(6)),
                             "tokens": [list(range(i)) for i in range(6)]}), path,
                   row_group_size=4)
    images = stoker.TableDataset(path, image="image", label="label",
                                 transform=T.Compose([T.Resize((8, 8)), T.ToTensor("uint8")]))
    x, y = next(iter(stoker.DataLoader(images, batch_size=6, output="numpy")))
    tokens = next(iter(stoker.DataLoader(stoker.TableDataset(path, columns=["tokens"]),
                                         batch_size=6, output="numpy")))
    ldd = subprocess.run(["ldd", stoker._arrow.__file__], capture_output=True, text=True,
                         check=True).stdout
    print(json.dumps({"shape": list(x.shape), "labels": y.tolist(),
                      "lengths": tokens["tokens_length"].tolist(), "ldd": ldd,
                      "pyarrow": pa.__file__}))
""")

# What every Linux process takes from glibc beyond the policy's list: the dynamic loader (the
# ELF interpreter; TLS lives there) and the kernel's vDSO.
LOADER = ("ld-linux-x86-64.so.2", "linux-vdso.so.1")


def policy_libraries(tag):
    """The system libraries manylinux policy `tag` (e.g. manylinux_2_28) lets a wheel use,
    from auditwheel's own policy file."""
    import auditwheel
    path = Path(auditwheel.__file__).parent / "policy" / "manylinux-policy.json"
    for policy in json.loads(path.read_text()):
        if policy["name"] == tag or tag in policy.get("aliases", []):
            return set(policy["lib_whitelist"]) | set(LOADER)
    raise ValueError(f"no manylinux policy {tag} in {path}")


def wheel_policy(wheel):
    """The lowest manylinux policy in the wheel's file name: manylinux_2_28 for
    ...-manylinux_2_28_x86_64.whl."""
    plats = os.path.basename(wheel)[:-len(".whl")].split("-")[-1].split(".")
    tags = sorted((p for p in plats if p.startswith("manylinux_")),
                  key=lambda p: tuple(int(v) for v in p.split("_")[1:3]))
    if not tags:
        raise ValueError(f"{wheel}: no manylinux_X_Y platform tag")
    return "_".join(tags[0].split("_")[:3])


def clean_env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_PRELOAD", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(LD_LIBRARY_PATH="", PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    return env


def install(tmp, python, requirement):
    """A fresh venv of `python` under tmp with `requirement` (the wheel, maybe with extras) and
    its dependencies from the index. Returns (venv, its python, env)."""
    venv = Path(tmp) / "venv"
    env = clean_env()
    subprocess.run([python, "-m", "venv", str(venv)], check=True, env=env, cwd=tmp)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", requirement], check=True, env=env, cwd=tmp)
    return venv, py, env


def make_data(root, audio=False):
    """A JPEG and a PNG in two class folders, a token file, two videos and, with `audio`, three
    audio files; returns the images' pixels."""
    from PIL import Image
    rng = np.random.default_rng(0)
    pixels = {"a.png": rng.integers(0, 256, (20, 24, 3), dtype=np.uint8),
              "b.jpg": np.kron(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8),
                               np.ones((8, 8, 1), dtype=np.uint8))}
    for cls, (fname, image) in zip(("a", "b"), pixels.items()):
        (root / "images" / cls).mkdir(parents=True)
        Image.fromarray(image).save(root / "images" / cls / fname, quality=95)
    np.arange(20, dtype=np.uint16).tofile(root / "tokens.bin")
    make_videos(root / "videos")
    if audio:
        make_audio(root / "audio")
    return pixels


def make_videos(where):
    """An H.264 mp4 with B-frames and an AV1 mkv (PyAV's encoders, from the checkout's .venv)."""
    import av
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1's banner: errors only
    where.mkdir(parents=True)
    yy, xx = np.mgrid[0:48, 0:64]
    for name, codec, options in (("h264.mp4", "libx264", {}),
                                 ("av1.mkv", "libsvtav1", {"preset": "12"})):
        with av.open(str(where / name), "w") as c:
            s = c.add_stream(codec, rate=25)
            s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
            s.codec_context.gop_size = 6
            s.options = options
            for i in range(12):
                img = np.stack([(xx * 3 + i * 9) % 256, (yy * 4 + i * 5) % 256,
                                (xx + yy + i * 11) % 256], -1).astype(np.uint8)
                for packet in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                    c.mux(packet)
            for packet in s.encode():
                c.mux(packet)


# The room's audio: 0.6 s of two tones (440 Hz and 2.5 kHz, 0.25 each), as 16-bit samples.
AUDIO_SECONDS = 0.6


def tones(rate):
    t = np.arange(round(AUDIO_SECONDS * rate)) / rate
    x = 0.25 * np.sin(2 * np.pi * 440 * t) + 0.25 * np.sin(2 * np.pi * 2500 * t)
    return np.round(x * 32767).astype(np.int16)


def make_audio(where):
    """a.wav (Python's wave module) and b.flac (PyAV's FLAC encoder), 16-bit at 44.1 kHz, the same
    samples; c.opus (PyAV's libopus, in Ogg) at 48 kHz. A few kilobytes each."""
    import av
    import wave
    where.mkdir(parents=True)
    with wave.open(str(where / "a.wav"), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(44100)
        w.writeframes(tones(44100).tobytes())
    for name, fmt, codec, rate in (("b.flac", "flac", "flac", 44100),
                                   ("c.opus", "ogg", "libopus", 48000)):
        pcm = tones(rate)
        with av.open(str(where / name), "w", format=fmt) as out:
            s = out.add_stream(codec, rate=rate, layout="mono")
            if codec == "flac":
                frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16",
                                                   layout="mono")
            else:
                frame = av.AudioFrame.from_ndarray(
                    (pcm.astype(np.float32) / 32768).reshape(1, -1), format="flt", layout="mono")
            frame.sample_rate = rate
            for packet in s.encode(frame):
                out.mux(packet)
            for packet in s.encode(None):
                out.mux(packet)


def audio_problems(seen, data, libs):
    """What is wrong with the room's audio (not soxr, samples unlike those written or unlike
    scipy's resampling of them, libsoxr or libswresample not the wheel's own), in words, and a
    line for the report (the resampler, the largest difference from scipy's)."""
    from scipy.signal import resample_poly
    problems, worst = [], 0.0
    audio = seen["audio"]
    if audio["resampler"] != "soxr":
        problems.append(f"the resampler is {audio['resampler']!r}, not soxr")
    for i, (path, info) in enumerate(zip(audio["paths"], audio["probe"])):
        name = os.path.basename(path)
        opus = name.endswith(".opus")
        rate = 48000 if opus else 44100
        codec = {".wav": "pcm_s16le", ".flac": "flac", ".opus": "opus"}[Path(name).suffix]
        # An Opus file ends with its last frame, the encoder's padding counted (13 ms here)
        pad = 0.02 if opus else 1e-4
        if not (info["sample_rate"] == rate and info["codec"] == codec and info["channels"] == 1
                and 0 <= info["duration"] - AUDIO_SECONDS < pad):
            problems.append(f"{name}: probed as {info}")
        own = np.load(data / f"audio{i}.own.npy")
        written = tones(rate).astype(np.float32) / 32768
        if opus:  # lossy: the tones back from the first sample, 30 dB above the coding noise
            head = own[:len(written)]
            ok = 0 <= len(own) - len(written) < pad * rate and (
                np.sum(written ** 2) > 1000 * np.sum((head - written) ** 2))
        else:  # lossless: the samples written
            ok = np.array_equal(own, written)
        if not ok:
            problems.append(f"{name}: decoded at {rate} Hz unlike the samples written")
        got = np.load(data / f"audio{i}.npy")
        want = resample_poly(own.astype(np.float64), 160, rate // 100)
        err = (np.abs(got[200:-200] - want[200:-200]).max() if len(got) == len(want)
               else None)
        if err is None or err > 2e-3:
            problems.append(f"{name}: at 16 kHz {len(got)} samples (want {len(want)}), "
                            f"{err} from scipy's resample_poly (want <= 2e-3)")
        worst = max(worst, err or 0.0)
    # Each sample's length is its header's duration (AudioDataset pads a short decode to it)
    lens = [round(info["duration"] * 16000) for info in audio["probe"]]
    if audio["batch"] != [[len(lens), max(lens)], lens]:
        problems.append(f"AudioDataset batch: audio's shape and audio_lens {audio['batch']}, "
                        f"want {[[len(lens), max(lens)], lens]}")
    mapped = [os.path.realpath(p) for p in seen["mapped"]]
    swr = [p for p in mapped if os.path.basename(p).startswith("libswresample")]
    if not (swr and all(p.startswith(libs + "/") for p in swr)):
        problems.append(f"libswresample mapped from outside stoker.libs/: {swr}")
    soxr = [p for p in mapped if "soxr" in os.path.basename(p)]
    if soxr:
        problems.append(f"a libsoxr was loaded (the wheel's libswresample links it in): {soxr}")
    names = ", ".join(os.path.basename(p) for p in audio["paths"])
    return problems, (f"{names} decoded; resampler {audio['resampler']}, 16 kHz within "
                      f"{worst:.1e} of scipy's resample_poly")


def video_problems(seen, data, libs):
    """What is wrong with the room's clips (frames unlike PyAV's at the same timestamps, FFmpeg
    not the wheel's own), in words."""
    import av
    problems = []
    video = seen["video"]
    for i, (path, stamps) in enumerate(zip(video["paths"], video["stamps"])):
        clip = np.load(data / f"clip{i}.npy")
        with av.open(path) as c:
            ref = {round(float(f.time), 6): f.to_ndarray(format="rgb24")
                   for f in c.decode(video=0)}
        for t, frame in zip(stamps, clip):
            want = ref.get(round(t, 6))
            if want is None or np.abs(frame.transpose(1, 2, 0).astype(int) - want).mean() > 1:
                problems.append(f"{os.path.basename(path)}: the frame at {t} s is not PyAV's")
    mapped = [os.path.realpath(p) for p in seen["mapped"]
              if "libav" in os.path.basename(p) or "libsw" in os.path.basename(p)
              or "dav1d" in os.path.basename(p)]
    if not (mapped and all(p.startswith(libs + "/") for p in mapped)):
        problems.append(f"FFmpeg mapped from outside stoker.libs/: {mapped}")
    return problems


def resolved(ldd):
    """{soname: real path} of the libraries ldd found; 'not found' ones map to None."""
    out = {}
    for line in ldd.splitlines():
        parts = line.split()
        if "=>" in parts:
            target = parts[parts.index("=>") + 1]
            out[parts[0]] = None if target == "not" else os.path.realpath(target)
        elif parts and parts[0].startswith("/"):
            out[os.path.basename(parts[0])] = os.path.realpath(parts[0])  # the loader
    return out


def room(wheel, python, tmp):
    """Installs `wheel` for `python` in a clean room under tmp and runs it there. Returns
    (problems, facts): what failed, in words, and what was seen (for a report)."""
    from PIL import Image
    tmp = Path(tmp)
    name = os.path.basename(wheel)
    problems = []
    audio_report = "no audio module"
    with zipfile.ZipFile(wheel) as z:
        has_video = any(n.startswith("stoker/_video") for n in z.namelist())
        has_audio = any(n.startswith("stoker/_audio") for n in z.namelist())
    data = tmp / "data"
    pixels = make_data(data, audio=has_audio)
    venv, py, env = install(tmp, python, wheel)
    listed = subprocess.run([py, "-m", "pip", "list", "--format=json"], check=True, env=env,
                            capture_output=True, text=True).stdout
    installed = {p["name"].lower() for p in json.loads(listed)}
    if not installed <= {"stoker", "numpy", "pip", "setuptools"}:
        problems.append(f"installed more than stoker and numpy: {sorted(installed)}")

    out = subprocess.run([py, "-c", ROOM, str(data)], env=env, cwd=tmp, capture_output=True,
                         text=True)
    if out.returncode != 0:
        return [f"the room's script failed:\n{out.stderr[-3000:]}"], {}
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    site = Path(seen["file"]).parent.parent
    libs = os.path.realpath(site / "stoker.libs")
    if not seen["file"].startswith(str(venv)):
        problems.append(f"imported stoker from {seen['file']}, not the room's venv")
    if not (seen["version"] == seen["metadata"] and name.startswith(f"stoker-{seen['version']}-")):
        problems.append(f"version {seen['version']} / metadata {seen['metadata']} / {name}")

    # ldd of every shared object the wheel installed: inside the venv, or a library of the
    # policy (glibc, libgcc_s, libz, ...); nothing missing but _arrow's pyarrow (--tables).
    allowed = policy_libraries(wheel_policy(wheel))
    from_system = set()
    for so, text in seen["ldd"].items():
        for soname, path in resolved(text).items():
            if path is None:
                if not (os.path.basename(so).startswith("_arrow")
                        and soname.startswith(("libarrow", "libparquet"))):
                    problems.append(f"ldd {os.path.basename(so)}: {soname} not found")
            elif not path.startswith(str(venv) + "/"):
                if soname in allowed:
                    from_system.add(soname)
                else:
                    problems.append(f"ldd {os.path.basename(so)}: {soname} from the system "
                                    f"({path}), outside the {wheel_policy(wheel)} policy")
    native = resolved(seen["ldd"][seen["native"]])
    for lib in ("libjpeg", "libpng16"):
        paths = [p for s, p in native.items() if s.startswith(lib)]
        if not (paths and all(p and p.startswith(libs + "/") for p in paths)):
            problems.append(f"{lib} does not come from stoker.libs/: {paths}")
    if any(c in text for text in seen["ldd"].values()
           for c in ("libcuda", "libnvjpeg", "libnvrtc")):
        problems.append("a CUDA library is linked")
    # What the process mapped after decoding: the wheel's copies, not the system's.
    image_libs = [os.path.realpath(p) for p in seen["mapped"] if "libjpeg" in p or "libpng" in p]
    if not (image_libs and all(p.startswith(libs + "/") for p in image_libs)):
        problems.append(f"mapped image libraries outside stoker.libs/: {image_libs}")
    if any("libcuda" in p or "libnvjpeg" in p for p in seen["mapped"]):
        problems.append("a CUDA library was loaded")
    # No test doubles (STOKER_TESTING=OFF): no testing module, no test-only arguments on the
    # GPU bindings, no emulated GPU decode backend compiled in.
    if seen["testing"]:
        problems.append("the wheel has stoker._native.testing")
    for arg in ("emulate", "reject", "pageable"):
        if arg in seen["gpu_signatures"]:
            problems.append(f"a test-only argument {arg!r} in the GPU bindings")
    with zipfile.ZipFile(wheel) as z:
        natives = [n for n in z.namelist() if n.startswith("stoker/_native") and n.endswith(".so")]
        if len(natives) != 1 or b"EmulatedBackend" in z.read(natives[0]):
            problems.append(f"the native module is not one release build: {natives}")

    # The decodes: PNG exact; JPEG as Pillow decodes it (libjpeg, rounding in chroma upsampling).
    png = np.load(data / "a.png.npy")
    if not np.array_equal(png, pixels["a.png"]):
        problems.append("the PNG decoded to other pixels")
    jpg = np.load(data / "b.jpg.npy")
    with Image.open(data / "images" / "b" / "b.jpg") as im:
        ref = np.asarray(im.convert("RGB"))
    if not (jpg.shape == ref.shape and np.abs(jpg.astype(int) - ref).mean() < 0.5):
        problems.append("the JPEG decoded unlike Pillow")
    if seen["batches"] != [[[2, 3, 16, 16], [0, 1]]]:
        problems.append(f"ImageFolder batches: {seen['batches']}")
    if seen["tokens"] != [[0, 1, 2, 3], [4, 5, 6, 7]]:
        problems.append(f"tokens: {seen['tokens']}")
    pd = seen["pydata"]
    expected = {"arrays": [[[0, 1, 2], [1, 2, 3]]], "objects": [["a", "b"]], "fetched": [0, 1, 4],
                "replaced": True, "skipped": [[3, "ValueError: three"]], "raised": ["three", 3]}
    if pd != expected:
        problems.append(f"the Python-dataset wing: {pd}, expected {expected}")

    if has_video and seen["video"] is None:
        problems.append("the wheel has stoker._video, but the room cannot find it")
    elif has_video:
        problems += video_problems(seen, data, libs)
    if has_audio and seen["audio"] is None:
        problems.append("the wheel has stoker._audio, but the room cannot find it")
    elif has_audio:
        found, audio_report = audio_problems(seen, data, libs)
        problems += found

    # The console script, and the build report users paste into bug reports.
    cli = subprocess.run([str(venv / "bin" / "stoker"), "--help"], env=env, cwd=tmp,
                         capture_output=True, text=True)
    if cli.returncode != 0 or "demo" not in cli.stdout:
        problems.append(f"stoker --help: {cli.stderr[-1000:]}")
    info = subprocess.run([py, "-m", "stoker.info"], env=env, cwd=tmp, capture_output=True,
                          text=True)
    if info.returncode != 0 or "stoker" not in info.stdout:
        problems.append(f"python -m stoker.info: {info.stderr[-1000:]}")
    facts = {"python": subprocess.run([py, "-c", "import sys; print(sys.version.split()[0])"],
                                      capture_output=True, text=True, env=env).stdout.strip(),
             "from_system": sorted(from_system), "info": info.stdout, "audio": audio_report}
    return problems, facts


def tables_room(wheel, python, tmp):
    """`pip install WHEEL[tables]` in a clean room: TableDataset reads Parquet, stoker._arrow
    takes libarrow/libparquet from the pyarrow the index gave, no other copy. Returns problems."""
    from PIL import Image
    tmp = Path(tmp)
    _, py, env = install(tmp, python, f"{wheel}[tables]")
    png = tmp / "p.png"
    Image.fromarray(np.full((10, 12, 3), 77, np.uint8)).save(png)
    out = subprocess.run([py, "-c", TABLES_ROOM, str(tmp / "t.parquet"), str(png)], env=env,
                         cwd=tmp, capture_output=True, text=True)
    if out.returncode != 0:
        return [f"the tables room failed:\n{out.stderr[-3000:]}"]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    problems = []
    if not (seen["shape"] == [6, 3, 8, 8] and seen["labels"] == list(range(6))
            and seen["lengths"] == list(range(6))):
        problems.append(f"TableDataset read {seen}")
    pyarrow_dir = os.path.realpath(os.path.dirname(seen["pyarrow"]))
    found = resolved(seen["ldd"])
    for lib in ("libarrow.so", "libparquet.so"):
        paths = [p for s, p in found.items() if s.startswith(lib)]
        if not (paths and all(p and p.startswith(pyarrow_dir + "/") for p in paths)):
            problems.append(f"{lib} not from the room's pyarrow: {paths}")
    if any(p is None for p in found.values()):
        problems.append(f"_arrow: a library not found:\n{seen['ldd']}")
    return problems


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("wheel")
    p.add_argument("--python", default=sys.executable, help="the interpreter the room is of")
    p.add_argument("--tables", action="store_true", help="also the [tables] room")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        problems, facts = room(os.path.abspath(args.wheel), args.python, tmp)
    if args.tables and not problems:
        with tempfile.TemporaryDirectory() as tmp:
            problems = tables_room(os.path.abspath(args.wheel), args.python, tmp)
    for line in problems:
        print("FAIL", line)
    if facts:
        print(f"Python {facts['python']}: from the system {', '.join(facts['from_system'])}")
        print(f"audio: {facts['audio']}")
    print("clean room:", "passed" if not problems else f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
