#!/usr/bin/env bash
# Environments for the peers of bench/bench_images.py, one virtual environment each under
# .venv-peers/ (never .venv, which `make test` uses). `make bench-peers` runs this; it is
# idempotent (an environment whose stamp file exists is kept) and a peer that fails to install
# is reported and skipped by the benchmark, not fatal.
#
#   torchvision  torch DataLoader + torchvision transforms on Pillow, and torchdata.nodes
#   pillow-simd  the same with Pillow-SIMD (built from source with AVX2)
#   dali         NVIDIA DALI's CPU pipeline (nvidia-dali-cuda120, device_id=None)
#   spdl         SPDL (FFmpeg decoding; Debian's FFmpeg libraries from apt)
#   tfdata       tf.data (tensorflow-cpu)
#   llm          the peers of bench/bench_llm.py: Grain (packing, mix), LitData
#                (CombinedStreamingDataset), megatron-core (its IndexedDataset reader)
#
# torch: PyPI's torch wheel pulls in CUDA libraries; the CPU build in /opt/wheels (the one
# `make install` uses) is installed instead, and torchvision / torchdata without dependencies
# (torchvision 0.28.0 is the release built for torch 2.13.0).
set -u
cd "$(dirname "$0")/.."
ROOT=.venv-peers
PY=${PYTHON:-python3}
TORCH_WHEEL=$(ls /opt/wheels/torch-2.13.0+cpu-*.whl 2>/dev/null | head -1)
mkdir -p "$ROOT"

log() { printf '== %s\n' "$*"; }

# make_env NAME COMMAND...: a fresh environment, then COMMAND run with its pip as $PIP.
make_env() {
  local name=$1
  shift
  local dir=$ROOT/$name
  if [ -f "$dir/.ok" ]; then
    log "$name: ready ($dir)"
    return 0
  fi
  log "$name: installing into $dir"
  rm -rf "$dir"
  "$PY" -m venv "$dir" && "$dir/bin/python" -m pip install -q --upgrade pip &&
    PIP="$dir/bin/python -m pip install -q" "$@" && touch "$dir/.ok" && log "$name: ok" ||
    log "$name: FAILED (the benchmark skips it)"
}

torch_cpu() {
  if [ -n "$TORCH_WHEEL" ]; then
    $PIP "$TORCH_WHEEL"
  else
    $PIP torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
  fi
}

env_torchvision() {
  torch_cpu && $PIP numpy psutil pillow requests urllib3 &&
    $PIP --no-deps torchvision==0.28.0 torchdata==0.11.0
}

env_pillow_simd() {
  # Pillow-SIMD builds from source: libjpeg-turbo, zlib and a compiler from apt.
  torch_cpu && $PIP numpy psutil &&
    CC="cc -mavx2" $PIP --no-binary :all: pillow-simd &&
    $PIP --no-deps torchvision==0.28.0
}

env_dali() {
  $PIP numpy psutil nvidia-dali-cuda120
}

env_spdl() {
  $PIP numpy psutil spdl==0.8.0
}

env_tfdata() {
  $PIP numpy psutil tensorflow-cpu
}

env_llm() {
  # LitData without its dependencies: they pull PyPI's CUDA torch and torchvision (gigabytes)
  # over the CPU torch; what its streaming reader imports is listed instead.
  # megatron-core likewise (its IndexedDataset and builder need numpy, torch and packaging).
  torch_cpu && $PIP numpy psutil grain packaging &&
    $PIP --no-deps litdata lightning-utilities boto3 botocore s3transfer jmespath tifffile \
      obstore filelock requests urllib3 idna certifi charset-normalizer python-dateutil six \
      megatron-core
}

if command -v apt-get >/dev/null; then
  # Pillow-SIMD's build and SPDL's FFmpeg (Debian 12: FFmpeg 5.1).
  need=()
  for p in build-essential libjpeg62-turbo-dev zlib1g-dev libpng-dev libavcodec59 \
    libavformat59 libavfilter8 libavutil57 libswscale6 libswresample4 libavdevice59; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    log "apt: ${need[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}") \
      >/dev/null || log "apt-get failed: pillow-simd and spdl may not install"
  fi
fi

make_env torchvision env_torchvision
make_env pillow-simd env_pillow_simd
make_env dali env_dali
make_env spdl env_spdl
make_env tfdata env_tfdata
make_env llm env_llm
