#!/bin/sh
# The compiler launcher of the Makefile's builds (CMAKE_CXX_COMPILER_LAUNCHER): ccache where it is
# installed (scripts/system-deps.sh installs it), else the compiler itself.
#
# Why: `make test` compiles the engine twice with the same flags, once for the Python extension
# and once for the C++ tests (`install` and `cpp`: -O3; `ext-asan` and `cpp-asan`: ASan + UBSan).
# Every path is absolute (CMake passes them so), and the build directory is left out of the hash
# (hash_dir off), so the second compile of a file is a cache hit from the first tree. Depend mode
# reads the headers from the compiler's own -MD output instead of running the preprocessor again.
# The cache lives in build/ccache (make clean empties it). Paths under the checkout are hashed
# relative to it (base_dir), so a second checkout (a git worktree) pointing CCACHE_DIR at the
# first one's cache compiles nothing the first has compiled.
compiler=$1
shift
if ! command -v ccache >/dev/null 2>&1; then
  exec "$compiler" "$@"
fi
# ccache keys on the compiler's name as well as its binary: CMake calls GCC `c++` in the C++
# trees and scikit-build-core calls it `g++`. Where both names are the same compiler, one name.
case $compiler in
  c++ | */c++)
    gxx=${compiler%c++}g++
    if [ "$(readlink -f "$compiler")" = "$(readlink -f "$(command -v "$gxx")")" ]; then
      compiler=$gxx
    fi
    ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
export CCACHE_DIR="${CCACHE_DIR:-$root/build/ccache}"
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$root}"
export CCACHE_NOHASHDIR=1 CCACHE_DEPEND=1 CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-4G}"
exec ccache "$compiler" "$@"
