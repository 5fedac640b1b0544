"""Where decode="cuda" finds nvJPEG and NVRTC with no CUDA toolkit installed: the directories of
the pip wheels PyTorch installs (CUDA 13: nvidia/cu13/lib; CUDA 12: nvidia/nvjpeg/lib,
nvidia/cuda_nvrtc/lib), torch/lib, torchvision.libs, then the toolkit's places (docs/gpu.md).
Tested with fake site-packages and fake libraries built here by the C compiler: no GPU needed.
The stoker wheel itself carries nothing of CUDA (tests/python/test_wheel.py checks that)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from stoker.gpu import decode as gpu_decode

NVJPEG_API = ["nvjpegCreateEx", "nvjpegDestroy", "nvjpegJpegStateCreate",
              "nvjpegJpegStateDestroy", "nvjpegDecodeBatchedInitialize", "nvjpegDecodeBatched",
              "nvjpegDecode", "nvjpegJpegStreamCreate", "nvjpegJpegStreamDestroy",
              "nvjpegJpegStreamParseHeader", "nvjpegDecodeBatchedSupported"]
NVRTC_API = ["nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetProgramLogSize",
             "nvrtcGetProgramLog", "nvrtcGetPTXSize", "nvrtcGetPTX", "nvrtcDestroyProgram",
             "nvrtcGetErrorString"]


def make_dirs(root, *rels):
    for rel in rels:
        os.makedirs(os.path.join(root, rel), exist_ok=True)


def test_search_order_over_fake_site_packages(tmp_path, monkeypatch):
    user, site = str(tmp_path / "user-site"), str(tmp_path / "site-packages")
    # nvidia is a namespace package: each site-packages may hold part of it.
    make_dirs(user, "nvidia/nvjpeg/lib")
    make_dirs(site, "nvidia/cu13/lib", "nvidia/nvjpeg/lib", "nvidia/cuda_nvrtc/lib",
              "nvidia/cuda_runtime/lib", "torch/lib", "torchvision", "torchvision.libs")
    for pkg in ("torch", "torchvision"):
        open(os.path.join(site, pkg, "__init__.py"), "w").close()
    own, cuda_home = str(tmp_path / "own"), str(tmp_path / "cuda")
    make_dirs(own, ".")
    make_dirs(cuda_home, "lib64")
    monkeypatch.setenv("STOKER_CUDA_LIBRARY_PATH", f"{own}:{tmp_path / 'missing'}")
    monkeypatch.setenv("CUDA_HOME", cuda_home)
    monkeypatch.delenv("CUDA_PATH", raising=False)

    system = [d for d in ("/usr/local/cuda/lib64",
                          f"/usr/local/cuda/targets/{os.uname().machine}-linux/lib")
              if os.path.isdir(d)]
    assert gpu_decode.library_dirs([user, site]) == [
        own,                                             # the user's own, first
        f"{user}/nvidia/nvjpeg/lib",                     # site-packages in sys.path's order
        f"{site}/nvidia/cu13/lib",                       # CUDA 13 wheels: one directory
        f"{site}/nvidia/nvjpeg/lib",                     # CUDA 12 wheels: one per library
        f"{site}/nvidia/cuda_nvrtc/lib",
        f"{site}/torch/lib",
        f"{site}/torchvision.libs",                      # auditwheel-renamed copies
        f"{cuda_home}/lib64",
        *system,
    ]  # missing directories are left out; nvidia/cuda_runtime is not searched (no cudart used)


def build_fake(path, symbols):
    """A shared library exporting `symbols` (each a function returning 0), soname its file name."""
    src = str(path) + ".c"
    with open(src, "w") as f:
        f.writelines(f"int {s}(void) {{ return 0; }}\n" for s in symbols)
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # the ASan lane's
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(path), src,
                    f"-Wl,-soname,{os.path.basename(path)}"], check=True, env=env)
    os.remove(src)


# Runs in a fresh interpreter: nvJPEG and NVRTC are opened once per process.
FIND = """
import json, sys
from stoker import _native
from stoker.gpu import decode
nvjpeg, nvrtc = _native.gpu.gpu_decode_libraries(decode.library_dirs(sys.argv[1:]))
with open("/proc/self/maps") as f:
    mapped = sorted({line.split()[-1] for line in f if "libnvrtc-builtins" in line})
print(json.dumps({"nvjpeg": nvjpeg, "nvrtc": nvrtc, "builtins": mapped}))
"""


def find_in_child(*sites):
    env = {k: v for k, v in os.environ.items()
           if k not in ("STOKER_CUDA_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH")}
    out = subprocess.run([sys.executable, "-c", FIND, *sites], env=env, capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler for the fakes")
def test_the_native_loader_takes_the_wheels_libraries_in_that_order(tmp_path):
    # CUDA 12 wheels, and a decoy copy in torch/lib behind them.
    site = tmp_path / "cu12" / "site-packages"
    make_dirs(site, "nvidia/nvjpeg/lib", "nvidia/cuda_nvrtc/lib", "torch/lib")
    build_fake(site / "nvidia/nvjpeg/lib/libnvjpeg.so.12", NVJPEG_API)
    build_fake(site / "nvidia/cuda_nvrtc/lib/libnvrtc.so.12", NVRTC_API)
    build_fake(site / "nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.8", ["nvrtcBuiltins"])
    build_fake(site / "torch/lib/libnvjpeg.so.12", NVJPEG_API)
    found = find_in_child(str(site))
    assert found["nvjpeg"] == f"{site}/nvidia/nvjpeg/lib/libnvjpeg.so.12"
    assert found["nvrtc"] == f"{site}/nvidia/cuda_nvrtc/lib/libnvrtc.so.12"
    # NVRTC opens its builtins by bare name, which no search path reaches: loaded beside it.
    assert found["builtins"] == [f"{site}/nvidia/cuda_nvrtc/lib/libnvrtc-builtins.so.12.8"]

    # CUDA 13 wheels (one directory) win over CUDA 12 ones in the same site-packages.
    make_dirs(site, "nvidia/cu13/lib")
    build_fake(site / "nvidia/cu13/lib/libnvjpeg.so.13", NVJPEG_API)
    build_fake(site / "nvidia/cu13/lib/libnvrtc.so.13", NVRTC_API)
    found = find_in_child(str(site))
    assert found["nvjpeg"] == f"{site}/nvidia/cu13/lib/libnvjpeg.so.13"
    assert found["nvrtc"] == f"{site}/nvidia/cu13/lib/libnvrtc.so.13"

    # A library lacking the API (nvjpeg2k matches the prefix) is passed over, and with nothing
    # else the error names every place tried.
    empty = tmp_path / "none" / "site-packages"
    make_dirs(empty, "nvidia/nvjpeg/lib")
    build_fake(empty / "nvidia/nvjpeg/lib/libnvjpeg2k.so.0", ["nvjpeg2kCreate"])
    env = {k: v for k, v in os.environ.items() if k != "STOKER_CUDA_LIBRARY_PATH"}
    out = subprocess.run([sys.executable, "-c", FIND, str(empty)], env=env, capture_output=True,
                         text=True)
    if out.returncode == 0:  # a real nvJPEG on the loader's path (a CUDA machine): not this case
        pytest.skip("a real nvJPEG is on the dynamic loader's search path")
    assert "lacks nvjpegCreateEx" in out.stderr and "nvidia-nvjpeg" in out.stderr, out.stderr
