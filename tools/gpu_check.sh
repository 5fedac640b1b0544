#!/usr/bin/env bash
# The GPU check: one command for a bare GPU machine with no network.
#
#   bash tools/gpu_check.sh prepare   # here (network to Debian's packages and PyPI): downloads
#                                     # into .gpu-deps/ (git-ignored) what the GPU machine lacks
#   bash tools/gpu_check.sh run [feed|decode]
#                                     # there, with .gpu-deps/ carried: builds the extension,
#                                     # probes CUDA, runs the part's GPU tests and its benchmark
#                                     # in quick mode (no part: both); logs and JSON under $OUT
#                                     # (default build/gpu-check). feed (issue 39): the copy
#                                     # stream, pinned and device batches, the GPU conversion of
#                                     # uint8 batches, batch transforms on the GPU, pinned Python
#                                     # datasets, bench_gpu; decode (issue 40): nvJPEG and the
#                                     # NVRTC kernels, bench_gpu_decode. Each part alone fits in
#                                     # 5 minutes of the GPU machine, its build included.
#   bash tools/gpu_check.sh rehearse [feed|decode]
#                                     # here: `run` with an interpreter that holds only what the
#                                     # GPU machine has (below), linked from .venv
#
# `run` needs a Python with torch, torchvision, numpy, Pillow, nanobind, scikit-build-core, cmake
# and ninja (GPU_CHECK_PYTHON, default python3): what the GPU machine has. The rest is carried:
# - the image libraries' Debian packages, unpacked into a private prefix (never into /); the
#   extension links their shared libraries (Debian's libpng16.a is not position-independent) and
#   the prefix goes on LD_LIBRARY_PATH for the tests;
# - pytest and pytest-timeout (pure-Python wheels, unpacked onto PYTHONPATH);
# - the sample data's photographs (skimage/data of the scikit-image wheel: files only; the
#   sample builder locates the package, never imports it).
# Without a GPU it builds, runs the same tests (they skip) and reports "no GPU" in summary.json,
# exiting 0; a failed build or a failed test exits non-zero.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEPS=$ROOT/.gpu-deps
PACKAGES=(libjpeg62-turbo libjpeg62-turbo-dev libpng16-16 libpng-dev zlib1g zlib1g-dev)
# Carried from PyPI at the versions .venv holds (requirements.txt as resolved here).
TEST_WHEELS=(pytest pluggy iniconfig packaging pygments pytest-timeout)
PHOTOS_WHEEL=scikit-image

prepare() {
  mkdir -p "$DEPS"
  local sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  [ -n "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -v lock)" ] || $sudo_cmd apt-get update -qq
  (cd "$DEPS" && apt-get download -qq "${PACKAGES[@]}") || exit 1
  local py=${GPU_CHECK_PYTHON:-python3}
  local pins
  pins=($("$ROOT/.venv/bin/python" -c 'import sys
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in sys.argv[1:]))' "${TEST_WHEELS[@]}" "$PHOTOS_WHEEL")) \
    || { echo "prepare reads the versions from .venv: run make install first" >&2; exit 1; }
  rm -rf "$DEPS/wheels" "$DEPS/photos"
  local tests=("${pins[@]:0:${#TEST_WHEELS[@]}}") photos=${pins[-1]}
  "$py" -m pip download -q --no-deps --only-binary=:all: -d "$DEPS/wheels" "${tests[@]}" || exit 1
  # Every platform's wheel holds the same photographs: this Python's will do.
  local tmp
  tmp=$(mktemp -d)
  "$py" -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$photos" || exit 1
  "$py" -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("skimage/data/")])' \
    "$tmp"/*.whl "$DEPS/photos" || exit 1
  rm -rf "$tmp"
  ls -l "$DEPS" "$DEPS/wheels"
  du -sh "$DEPS"
}

# Each part's tests (pytest arguments) and whether it runs bench_gpu / bench_gpu_decode.
FEED_TESTS=(tests/python/test_gpu.py tests/python/test_gpu_feed.py tests/python/test_gpu_output.py
            tests/python/test_batch_transforms.py
            "tests/python/test_loader.py::test_pinned_batches_on_a_gpu_machine")
DECODE_TESTS=(tests/python/test_gpu_decode.py)

run() {
  local part=${1:-all}
  local tests=() feed=0 decode=0
  case "$part" in
    feed) tests=("${FEED_TESTS[@]}") feed=1 ;;
    decode) tests=("${DECODE_TESTS[@]}") decode=1 ;;
    all) tests=("${FEED_TESTS[@]}" "${DECODE_TESTS[@]}") feed=1 decode=1 ;;
    *) echo "gpu_check: no part '$part' (feed, decode, or none for both)" >&2; exit 2 ;;
  esac
  local out=${OUT:-$ROOT/build/gpu-check}
  local py=${GPU_CHECK_PYTHON:-python3}
  local prefix=/tmp/stoker-gpu-deps site=/tmp/stoker-gpu-site
  mkdir -p "$out"
  local status=0
  exec > >(tee "$out/gpu_check.log") 2>&1
  echo "== gpu_check $part $(date -u +%FT%TZ) on $(uname -n): $(nproc) cores"

  echo "== probe"
  { nvidia-smi || echo "nvidia-smi: none"; } > "$out/nvidia-smi.txt" 2>&1
  head -15 "$out/nvidia-smi.txt"
  "$py" - > "$out/probe.json" <<'EOF'
import glob, json, os, site, sys
out = {"python": sys.version.split()[0]}
try:
    import torch
    out.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
               cuda_available=torch.cuda.is_available(),
               devices=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
               if torch.cuda.is_available() else [])
except Exception as e:
    out["torch_error"] = repr(e)
libs = {}
roots = site.getsitepackages() + ["/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu",
                                  "/usr/local/nvidia/lib64"]
for name in ("libcuda.so", "libnvjpeg.so", "libnvrtc.so", "libnvrtc-builtins.so",
             "libnvidia-ml.so"):
    found = set()
    for r in roots:
        found.update(glob.glob(os.path.join(r, "**", name + "*"), recursive=True))
    libs[name] = sorted(found)[:8]
out["libraries"] = libs
print(json.dumps(out, indent=1))
EOF
  cat "$out/probe.json"
  local gpu
  gpu=$("$py" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)

  echo "== build"
  rm -rf "$prefix" && mkdir -p "$prefix"
  for f in "$DEPS"/*.deb; do dpkg -x "$f" "$prefix" || exit 1; done
  local lib=$prefix/usr/lib/x86_64-linux-gnu
  local start=$SECONDS
  rm -rf "$site"
  if ! PATH=$(dirname "$(command -v "$py")"):$PATH "$py" -m pip install -q --no-build-isolation \
      --no-deps --no-index --target "$site" -C build-dir=build/gpu-check \
      -C cmake.define.STOKER_TESTING=ON \
      -C cmake.define.JPEG_INCLUDE_DIR="$prefix/usr/include" \
      -C cmake.define.JPEG_LIBRARY="$lib/libjpeg.so" \
      -C cmake.define.PNG_PNG_INCLUDE_DIR="$prefix/usr/include" \
      -C cmake.define.PNG_LIBRARY="$lib/libpng16.so" \
      -C cmake.define.ZLIB_INCLUDE_DIR="$prefix/usr/include" \
      -C cmake.define.ZLIB_LIBRARY="$lib/libz.so" . > "$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    echo '{"build": "failed"}' > "$out/summary.json"
    exit 1
  fi
  echo "built in $((SECONDS - start)) s"
  local tools=/tmp/stoker-gpu-tools
  rm -rf "$tools" && mkdir -p "$tools" && cp -r "$DEPS/photos/skimage" "$tools/" || exit 1
  for w in "$DEPS"/wheels/*.whl; do "$py" -m zipfile -e "$w" "$tools" || exit 1; done
  export PYTHONPATH=$site:$tools LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

  echo "== GPU tests"
  "$py" -m pytest -q -p no:cacheprovider --timeout=300 -rs --junitxml="$out/tests.xml" \
    "${tests[@]}" > "$out/tests.log" 2>&1 || status=1
  tail -30 "$out/tests.log"

  if [ "$gpu" = 1 ]; then
    if [ "$feed" = 1 ]; then
      echo "== bench_gpu --quick"
      timeout 150 "$py" bench/bench_gpu.py --quick --json "$out/bench_gpu.json" \
        > "$out/bench_gpu.log" 2>&1 || status=1
      tail -40 "$out/bench_gpu.log"
    fi
    if [ "$decode" = 1 ]; then
      echo "== bench_gpu_decode --quick"
      timeout 120 "$py" bench/bench_gpu_decode.py --quick --json "$out/bench_gpu_decode.json" \
        > "$out/bench_gpu_decode.log" 2>&1 || status=1
      tail -30 "$out/bench_gpu_decode.log"
    fi
  else
    echo "== no GPU: the benchmarks are not run"
  fi
  "$py" - "$out" "$gpu" "$status" "$part" > "$out/summary.json" <<'EOF'
import json, os, sys
import xml.etree.ElementTree as ET
out, gpu, status, part = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3]), sys.argv[4]
counts = {"passed": 0, "failed": 0, "skipped": 0}
path = os.path.join(out, "tests.xml")
if os.path.exists(path):
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
print(json.dumps({"part": part, "gpu": gpu if gpu else "no GPU", "tests": counts,
                  "ok": status == 0}))
EOF
  cat "$out/summary.json"
  exit $status
}

# The GPU machine's Python, as far as this machine can play it: a venv whose site-packages links
# only the packages the GPU machine is known to hold (and their dependencies) from .venv.
# Anything else a GPU test needs must come from .gpu-deps, or the rehearsal fails as the GPU
# machine would.
rehearse() {
  [ -d "$DEPS/wheels" ] || prepare || exit 1
  local env=$ROOT/build/gpu-rehearsal-venv
  rm -rf "$env"
  "$ROOT/.venv/bin/python" -m venv --without-pip "$env" || exit 1
  local from to
  from=$("$ROOT/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  to=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  local keep='^(torch|torchgen|functorch|torchvision|numpy|PIL|pillow|nanobind|scikit_build_core'
  keep+='|cmake|ninja|nvidia|cuda|triton|typing_extensions|sympy|mpmath|networkx|jinja2'
  keep+='|markupsafe|fsspec|filelock|setuptools|_distutils_hack|distutils-precedence|pathspec'
  keep+='|packaging|pip)([-_.].*)?$'
  for entry in $(ls "$from" | grep -E "$keep"); do ln -s "$from/$entry" "$to/$entry"; done
  ln -s "$ROOT/.venv/bin/cmake" "$ROOT/.venv/bin/ninja" "$env/bin/"
  GPU_CHECK_PYTHON=$env/bin/python OUT=${OUT:-$ROOT/build/gpu-rehearsal} run "$@"
}

case "${1:-}" in
  prepare) prepare ;;
  run) run "${@:2}" ;;
  rehearse) rehearse "${@:2}" ;;
  *) echo "usage: bash tools/gpu_check.sh prepare | run [feed|decode] | rehearse [feed|decode]" >&2
     exit 2 ;;
esac
