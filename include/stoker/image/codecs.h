// The versions of the image codecs this build decodes with, for `stoker info` (bug reports):
// what the headers said at compile time and, for libpng, what the library loaded at run time
// says (libjpeg has no run-time version call).
//
// Thread safety: safe to call from any thread.
#pragma once

#include <string>

namespace stoker::image {

struct CodecVersions {
  std::string libjpeg_turbo;  // LIBJPEG_TURBO_VERSION of jconfig.h, e.g. "2.1.5"
  bool libjpeg_simd = false;  // libjpeg-turbo built WITH_SIMD (its SIMD kernels chosen at run time)
  std::string libpng_headers;  // PNG_LIBPNG_VER_STRING, e.g. "1.6.39"
  std::string libpng_loaded;   // png_get_libpng_ver() of the library in the process
};

CodecVersions codec_versions();

}  // namespace stoker::image
