// JPEG region decoding through the whole pipeline (image_fuzz.h).
#include "image_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return stoker::fuzz::fuzz_image(data, size, stoker::image::ImageFormat::kJpeg);
}
