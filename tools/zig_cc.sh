#!/usr/bin/env bash
# The C and C++ compilers of `make wheels` (tools/build_wheels.py writes
# build/wheels/toolchain/{cc,c++}, which set the variables below and exec this):
#   tools/zig_cc.sh cc|c++ ARGS...
#
# zig's clang (the ziglang wheel), compiling against glibc $STOKER_GLIBC's headers and linking
# against its symbol versions (zig ships the headers and makes the stub libraries), so that the
# wheels run on every glibc from that one on, whatever glibc this machine has. C++ uses GCC's
# libstdc++ (its headers, and its static library linked in as `make wheel` does), not zig's
# libc++: stoker._arrow passes std::string, shared_ptr and exceptions to and from pyarrow's
# libarrow, which is built with libstdc++, and stoker._native shares its C++ types with
# stoker._arrow. docs/install.md ("Every wheel") tells the whole story.
#
#   ZIG                 the zig binary
#   STOKER_GLIBC        the glibc to target (2.28: manylinux_2_28)
#   STOKER_CXX_INCLUDE  GCC's libstdc++ include directories, ':'-separated, in GCC's order
#   STOKER_LIBSTDCXX    GCC's libstdc++.a
#   STOKER_LIBGCC       GCC's libgcc.a: __builtin_cpu_supports' __cpu_model (zig's compiler_rt
#                       has none; libgcc_s's exported copy cannot be reached from -fPIC code)
#   STOKER_LIBGCC_S     libgcc_s.so.1: the unwinder that libstdc++'s exceptions call (as with GCC)
#   STOKER_COMPAT_OBJ   tools/old_glibc/single_threaded.c, compiled by this script's cc
set -euo pipefail
lang=$1
shift
target=(-target "x86_64-linux-gnu.$STOKER_GLIBC")
if [ "$lang" = cc ]; then
  exec "$ZIG" cc "${target[@]}" "$@"
fi
here=$(cd "$(dirname "$0")" && pwd)
# -I, not -isystem: zig puts its C headers first among the system directories, and libstdc++'s
# headers must precede them (<cstdlib> does #include_next <stdlib.h>). Every libstdc++ header says
# `#pragma GCC system_header`, so -I costs no warnings. tools/old_glibc/ comes first: it removes
# from libstdc++'s configuration what glibc 2.28 lacks.
includes=(-I"$here/old_glibc")
IFS=: read -r -a dirs <<<"$STOKER_CXX_INCLUDE"
for d in "${dirs[@]}"; do includes+=(-I"$d"); done
cxx=("$ZIG" c++ "${target[@]}" -nostdinc++ -nostdlib++ "${includes[@]}")

shared=0
for a in "$@"; do [ "$a" = -shared ] && shared=1; done
if [ $shared = 0 ]; then
  exec "${cxx[@]}" "$@"
fi
# A shared object (an extension module): GCC's link flags of bindings/CMakeLists.txt, in zig's
# terms. -static-libstdc++ is the archive itself; zig's linker takes no --exclude-libs, and a
# version script that exports PyInit_* alone hides libstdc++'s symbols (and everything else).
args=()
for a in "$@"; do
  case $a in
    -static-libstdc++) ;;
    -Wl,--exclude-libs,ALL) args+=(-Wl,--version-script="$here/old_glibc/extension.map") ;;
    *) args+=("$a") ;;
  esac
done
exec "${cxx[@]}" "${args[@]}" "$STOKER_COMPAT_OBJ" "$STOKER_LIBSTDCXX" "$STOKER_LIBGCC" \
  "$STOKER_LIBGCC_S"
