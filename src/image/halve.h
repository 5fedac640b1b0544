// Internal: an RGB picture at half its size, each pixel the mean of the 2x2 it covers.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker::image::internal {

// Writes the (w + 1) / 2 x (h + 1) / 2 picture whose pixel (x, y) is the rounded mean of the
// source's 2x2 block at (2x, 2y), to `dst`: of the pixels that exist, at an odd width's last
// column or an odd height's last row. Packed RGB on both sides, rows `src_stride` and
// `dst_stride` bytes apart. REQUIRES: w, h > 0; the areas do not overlap. `portable` takes the
// scalar loop even where the CPU has AVX2 (for tests: both must write the same bytes).
// Thread-safe; no allocation.
void halve_rgb8(const uint8_t* src, size_t src_stride, int w, int h, uint8_t* dst,
                size_t dst_stride, bool portable = false);

}  // namespace stoker::image::internal
