#include "stoker/image/codecs.h"

#include <png.h>

#include "libjpeg.h"

#define STOKER_STRING(x) #x
#define STOKER_EXPAND(x) STOKER_STRING(x)

namespace stoker::image {

CodecVersions codec_versions() {
  CodecVersions v;
#ifdef LIBJPEG_TURBO_VERSION
  v.libjpeg_turbo = STOKER_EXPAND(LIBJPEG_TURBO_VERSION);
#else
  v.libjpeg_turbo = "libjpeg " STOKER_EXPAND(JPEG_LIB_VERSION);
#endif
#ifdef WITH_SIMD
  v.libjpeg_simd = true;
#endif
  v.libpng_headers = PNG_LIBPNG_VER_STRING;
  v.libpng_loaded = png_get_libpng_ver(nullptr);
  return v;
}

}  // namespace stoker::image
