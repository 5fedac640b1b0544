#!/usr/bin/env bash
# `make wheels`' system side (docs/install.md, "Every wheel"): what tools/build_wheels.py needs
# beyond scripts/system-deps.sh, installed if missing, and the Debian sources of the libraries the
# wheels bundle (the two image libraries; FFmpeg and dav1d for the video module, FFmpeg and libsoxr
# for the audio module), unpacked into DIR.
#
#   nasm      libjpeg-turbo's, FFmpeg's and dav1d's SIMD kernels are NASM sources
#   meson     dav1d's build (with ninja, from .venv)
#   dpkg-dev  `apt-get source` unpacks and patches Debian's source packages with it
#   deb-src   a source entry beside each Debian entry apt already uses (same mirror, suites,
#             components), in /etc/apt/sources.list.d/stoker-deb-src.sources, where none exists
#
# The sources are Debian's own (libjpeg-turbo 2.1.5, libpng 1.6.39, FFmpeg 5.1, dav1d 1.0.0,
# libsoxr 0.1.3 on Debian 12, with Debian's patches): for the image libraries, the same code as
# `make wheel` bundles, compiled for glibc 2.28 instead; FFmpeg configured LGPL and decode-only,
# its libswresample with libsoxr (LGPL-2.1) linked in statically.
# Usage: scripts/wheel-deps.sh DIR   (prints the five source directories, one a line:
#        libjpeg-turbo, libpng, ffmpeg, dav1d, libsoxr)
set -euo pipefail
dir=$(mkdir -p "$1" && cd "$1" && pwd)
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"

has_deb_src() {
  grep -Eqs '^[[:space:]]*(deb-src[[:space:]]|Types:.*deb-src)' /etc/apt/sources.list \
    /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources
}

updated=0
if ! has_deb_src; then
  # deb822 files (Debian 12's debian.sources): each stanza whose Types has `deb`, again as deb-src.
  # One-line files (sources.list): each `deb` line, again as deb-src.
  entries=$(
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] || continue
      awk 'BEGIN { RS = ""; ORS = "\n\n" }
        /(^|\n)Types:[^\n]*deb([ \n]|$)/ && /debian/ {
          sub(/Types:[^\n]*/, "Types: deb-src"); print }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -f "$f" ] || continue
      sed -n 's/^[[:space:]]*deb[[:space:]]\+\(.*debian.*\)$/deb-src \1/p' "$f"
    done
  )
  if [ -z "$entries" ]; then
    echo "wheel-deps: no Debian entry in apt's sources to mirror" >&2
    exit 1
  fi
  case $entries in
    *Types:*) target=/etc/apt/sources.list.d/stoker-deb-src.sources ;;
    *) target=/etc/apt/sources.list.d/stoker-deb-src.list ;;
  esac
  echo "wheel-deps: adding deb-src entries in $target"
  printf '%s\n' "$entries" | $sudo_cmd tee "$target" >/dev/null
  $sudo_cmd apt-get update -qq
  updated=1
fi

missing=()
for p in nasm dpkg-dev meson; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "wheel-deps: installing ${missing[*]}"
  [ $updated -eq 1 ] || $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# The sources, once: `apt-get source` downloads the .dsc, the upstream tarball and Debian's
# changes, checks them against the signed index, and unpacks them with Debian's patches applied.
cd "$dir"
for pkg in libjpeg-turbo libpng1.6 ffmpeg dav1d libsoxr; do
  if ! ls -d "$dir/$pkg"-*/ >/dev/null 2>&1; then
    # The newest version whose files the mirror serves: the security suite's index can name a
    # version whose sources its mirror does not carry (seen here: libpng's +deb12u6, 404).
    got=0
    for v in $(apt-cache showsrc "$pkg" | sed -n 's/^Version: //p' | sort -rV | uniq); do
      if apt-get source -qq "$pkg=$v" >/dev/null 2>>"$dir/$pkg.log"; then
        got=1
        echo "wheel-deps: $pkg $v" >&2
        break
      fi
    done
    [ $got -eq 1 ] || { cat "$dir/$pkg.log" >&2; exit 1; }
  fi
  ls -d "$dir/$pkg"-*/ | head -1
done
