// Internal: one finished row of the output tensor, from the 8-bit RGB the resample made.
#pragma once

#include <cstddef>
#include <cstdint>

#include "stoker/image/pipeline.h"

namespace stoker::image::internal {

// How output rows are written: `table` holds 3 x 256 entries of the dtype (channel c, value v
// at c * 256 + v: ToTensor's scaling and Normalize, see output_table), followed by at least
// kRowTablePadding bytes that are read but never used (a vector gather reads 4 bytes an entry).
// A uint8 table is the identity (uint8 output is neither scaled nor normalized).
inline constexpr size_t kRowTablePadding = 4;
struct RowFormat {
  DType dtype;
  Layout layout;
  const std::byte* table;
  int width;
};

// Writes `format.width` pixels of packed RGB at `rgb` to `out`: for CHW three planes of width
// elements one after the other, for HWC interleaved; mirrored left to right when `flip`.
// `portable` takes the scalar loop even where the CPU has AVX2 (for tests: both must write the
// same bytes). Thread-safe; no allocation.
void write_row(const RowFormat& format, const uint8_t* rgb, bool flip, std::byte* out,
               bool portable = false);

}  // namespace stoker::image::internal
