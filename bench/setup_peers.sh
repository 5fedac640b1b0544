#!/usr/bin/env bash
# Environments for the peers of bench/bench_images.py and bench/bench_recipes.py, one virtual
# environment each under .venv-peers/ (never .venv, which `make test` uses). `make bench-peers`
# runs this; it is idempotent (an environment whose stamp file exists is kept) and a peer that
# fails to install is reported and skipped by the benchmark, not fatal.
#
#   bash bench/setup_peers.sh              every environment
#   bash bench/setup_peers.sh dali ffcv    only those (and only the apt packages they need)
#
#   torchvision  torch DataLoader + torchvision transforms on Pillow, and torchdata.nodes
#   pillow-simd  the same with Pillow-SIMD (built from source with AVX2)
#   dali         NVIDIA DALI's CPU pipeline (nvidia-dali-cuda120, device_id=None)
#   spdl         SPDL (FFmpeg decoding; Debian's FFmpeg libraries from apt)
#   tfdata       tf.data (tensorflow-cpu)
#   ffcv         FFCV (bench_recipes.py): built from its sdist against Debian's OpenCV and
#                libturbojpeg (apt), with numba; the last attempt's log: .venv-peers/ffcv.log
#   llm          the peers of bench/bench_llm.py: Grain (packing, mix), LitData
#                (CombinedStreamingDataset), megatron-core (its IndexedDataset reader)
#   remote       the peers of bench/bench_remote.py, streaming from S3 (a local moto server):
#                WebDataset 1.0.2, Mosaic Streaming 0.13.0, LitData 0.2.76, with boto3,
#                Pillow and torchvision for their decode and transforms
#   budget       the peer of bench/bench_budget.py and bench/bench_audio.py that .venv lacks:
#                Lhotse (lhotse 1.33.0, with soundfile and scipy; torch, the CPU build, under it)
#   sft          the peer's packer in bench/bench_text.py's SFT part: TRL's pack_dataset
#                (trl 1.16.0, without its dependencies) in .venv-peers/sft/site, which the bench
#                puts on the path of the interpreter running it (its transformers, datasets,
#                torch: the versions Stoker is measured beside)
#   imagetext    bench/bench_image_text.py's WebDataset and LitData (webdataset 1.0.2, litdata
#                0.2.76, without their dependencies) in .venv-peers/imagetext/site, put on the
#                path of .venv's interpreter as sft's is
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

env_remote() {
  # Mosaic Streaming's metadata asks for torchvision (pip then swaps the CPU torch for PyPI's
  # CUDA build) and the GCS, Azure, OCI and SFTP clients: it and LitData go in without
  # dependencies (as in env_llm), with what their S3 readers and writers import. Mosaic 0.13.0
  # needs numpy < 2.2 and xxhash < 4; its DataLoader imports transformers (< 5, whose own
  # dependencies do not include torch).
  torch_cpu && $PIP "numpy<2.2" psutil pillow boto3 webdataset==1.0.2 "transformers<5" &&
    $PIP --no-deps torchvision==0.28.0 mosaicml-streaming==0.13.0 litdata==0.2.76 \
      brotli python-snappy cramjam "xxhash<4" zstd catalogue tqdm lightning-utilities tifffile obstore \
      filelock requests urllib3 idna certifi charset-normalizer
}

env_budget() {
  # Lhotse's samplers are pure Python over a CutSet (bench_budget.py: no audio). bench_audio.py
  # reads audio through it: soundfile (a dependency) decodes, and its resampling of 44.1 and
  # 48 kHz recordings needs scipy, which Lhotse does not declare. lhotse 1.33.0 imports urllib3
  # (lhotse.ais) without declaring it either.
  torch_cpu && $PIP numpy psutil urllib3 scipy lhotse==1.33.0
}

env_sft() {
  # Only the files: the bench imports trl.data_utils from site/ with its own interpreter.
  $PIP --no-deps --target "$ROOT/sft/site" trl==1.16.0
}

env_imagetext() {
  # Only the files: bench_image_text.py runs webdataset from site/ with .venv's interpreter (its
  # torch, torchvision and transformers, the versions Stoker is measured beside; PyPI's
  # torchvision needs PyPI's CUDA torch, which the CPU-torch environments here do not have).
  $PIP --no-deps --target "$ROOT/imagetext/site" webdataset==1.0.2 braceexpand litdata==0.2.76 \
    lightning-utilities
}

env_ffcv() {
  # FFCV 1.0.2's setup.py compiles libffcv against pkg-config's opencv4 and libturbojpeg (apt);
  # its Python side needs numba, OpenCV's bindings and torch (the CPU build). Its sdist's
  # metadata step already needs those headers, so the build runs without isolation. The build
  # breaks in many ways (compiler, OpenCV's pkg-config name, numba against numpy): its whole
  # output goes to .venv-peers/ffcv.log, kept for whoever reruns the attempt.
  local log=$ROOT/ffcv.log
  {
    torch_cpu && $PIP numpy psutil pillow numba opencv-python pkgconfig setuptools wheel &&
      $PIP --no-build-isolation ffcv==1.0.2
  } >"$log" 2>&1 || { tail -n 25 "$log"; return 1; }
}

# apt packages of each environment (Debian 12 names): Pillow-SIMD's build, SPDL's FFmpeg 5.1,
# FFCV's OpenCV and libturbojpeg headers.
apt_packages() {
  case $1 in
  pillow-simd) echo build-essential libjpeg62-turbo-dev zlib1g-dev libpng-dev ;;
  spdl) echo libavcodec59 libavformat59 libavfilter8 libavutil57 libswscale6 libswresample4 \
    libavdevice59 ;;
  ffcv) echo build-essential pkg-config libopencv-dev libturbojpeg0-dev ;;
  esac
}

ALL=(torchvision pillow-simd dali spdl tfdata ffcv llm remote budget sft imagetext)
if [ $# -gt 0 ]; then NAMES=("$@"); else NAMES=("${ALL[@]}"); fi
for name in "${NAMES[@]}"; do
  case " ${ALL[*]} " in
  *" $name "*) ;;
  *) echo "unknown environment: $name (one of: ${ALL[*]})" >&2 && exit 2 ;;
  esac
done

if command -v apt-get >/dev/null; then
  need=()
  for name in "${NAMES[@]}"; do
    [ -f "$ROOT/$name/.ok" ] && continue
    for p in $(apt_packages "$name"); do
      dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
    done
  done
  if [ ${#need[@]} -gt 0 ]; then
    log "apt: ${need[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}") \
      >/dev/null || log "apt-get failed: ${NAMES[*]} may not install"
  fi
fi

for name in "${NAMES[@]}"; do
  make_env "$name" "env_${name//-/_}"
done
