// libjpeg's headers, in the order they need: jpeglib.h uses FILE and size_t without including
// their headers. Include this instead of <jpeglib.h>.
#pragma once

// clang-format off
#include <cstddef>
#include <cstdio>
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
