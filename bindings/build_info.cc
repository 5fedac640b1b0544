// stoker._native.build_info(): how this extension was built, for `stoker info` (a bug report
// says which build it ran). Facts the compiler knew; the wheel's platform tag and what was found
// at run time are python/stoker/info.py's.
#include <gnu/libc-version.h>
#include <nanobind/stl/string.h>

#include "bindings.h"
#include "stoker/image/codecs.h"

namespace stoker::python {
namespace {

#define STOKER_STRING(x) #x
#define STOKER_EXPAND(x) STOKER_STRING(x)

std::string compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "gcc " __VERSION__;
#else
  return "unknown";
#endif
}

std::string cxx_library() {
#if defined(_GLIBCXX_RELEASE)
  return "libstdc++ " STOKER_EXPAND(_GLIBCXX_RELEASE) " (" STOKER_EXPAND(__GLIBCXX__) ")";
#elif defined(_LIBCPP_VERSION)
  return "libc++ " STOKER_EXPAND(_LIBCPP_VERSION);
#else
  return "unknown";
#endif
}

// The instruction sets the whole build may use (the compiler's target), then the ones its
// kernels choose at run time where the CPU has them (src/image/resample.cc, color_ops.cc).
std::string simd_baseline() {
#if defined(__AVX2__)
  return "x86-64 + AVX2";
#elif defined(__SSE4_2__)
  return "x86-64 + SSE4.2";
#elif defined(__x86_64__)
  return "x86-64 (SSE2)";
#else
  return "not x86-64";
#endif
}

}  // namespace

void register_build_info(nb::module_& m) {
  m.def(
      "build_info",
      [] {
        const image::CodecVersions codecs = image::codec_versions();
        nb::dict d;
        d["compiler"] = compiler();
        d["cxx_library"] = cxx_library();
        d["glibc_headers"] = STOKER_EXPAND(__GLIBC__) "." STOKER_EXPAND(__GLIBC_MINOR__);
        d["glibc_running"] = std::string(gnu_get_libc_version());
        d["simd_baseline"] = simd_baseline();
#if defined(__x86_64__)
        d["cpu_avx2"] = static_cast<bool>(__builtin_cpu_supports("avx2"));
        d["cpu_fma"] = static_cast<bool>(__builtin_cpu_supports("fma"));
#endif
        d["libjpeg_turbo"] = codecs.libjpeg_turbo;
        d["libjpeg_simd"] = codecs.libjpeg_simd;
        d["libpng_headers"] = codecs.libpng_headers;
        d["libpng_loaded"] = codecs.libpng_loaded;
        return d;
      },
      "How this extension was built: compiler, C++ library, the glibc headers it was compiled "
      "against, SIMD, image codec versions (python -m stoker.info prints them).");
}

}  // namespace stoker::python
