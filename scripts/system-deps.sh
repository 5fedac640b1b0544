#!/usr/bin/env bash
# Installs the Debian packages Stoker builds against, if any is missing.
set -euo pipefail
# clang + libclang-rt-14-dev: the libFuzzer targets (`make fuzz`, the fuzz smoke of `make test`);
# libclang-rt-14-dev ships libFuzzer's runtime (libclang_rt.fuzzer*.a) and FuzzedDataProvider.h.
# ccache: make's builds compile through it (tools/ccache.sh says why).
# FFmpeg's development libraries (+ pkg-config, which finds them): the video wing, stoker._video
# (decode only; src/ffmpeg/CMakeLists.txt). libavdevice59: torchcodec (requirements.txt) loads it
# with the others at run time. libswresample-dev: the audio wing, stoker._audio, resamples with it
# (src/audio/CMakeLists.txt).
# libpcre2-dev, libutf8proc-dev, libsimdjson-dev: the text wing, stoker.Tokenizer (tokenizer.json's
# regexes, Unicode normalization and case, JSON; src/text/CMakeLists.txt).
# libsentencepiece-dev: the text wing's SentencePiece .model files, run by the sentencepiece
# library itself so that ids are its own (optional in the build: without it, no .model files).
# zlib1g-dev, libzstd-dev: the text wing's JSONL files compressed as .gz and .zst (TextDataset).
packages=(g++ libgtest-dev libjpeg62-turbo-dev libpng-dev python3-venv clang libclang-rt-14-dev
          ccache pkg-config libavformat-dev libavcodec-dev libswscale-dev libavutil-dev
          libswresample-dev libavdevice59 libpcre2-dev libutf8proc-dev libsimdjson-dev
          libsentencepiece-dev zlib1g-dev libzstd-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# A Python that already has venv (pyenv, a custom build) needs no python3-venv.
if python3 -c "import venv, ensurepip" 2>/dev/null; then
  missing=("${missing[@]/python3-venv}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing system packages: ${missing[*]}"
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
$sudo_cmd apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}"
