// The .npy header parser (parse_npy_header), then the array it describes read row by row through
// ArraySource from a heap copy of the input of exactly its size, so that a read one byte past the
// data is an AddressSanitizer report.
//
// Checked: the parser throws nothing but InvalidArgument; the data it describes lies inside the
// input; every row of the array reads without touching bytes outside it.
#include <algorithm>
#include <memory>
#include <vector>

#include "image_fuzz.h"  // require()
#include "stoker/errors.h"
#include "stoker/sources/array.h"
#include "stoker/sources/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using stoker::fuzz::require;
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  stoker::NpyHeader h;
  try {
    h = stoker::parse_npy_header(bytes, size, "fuzz.npy");
  } catch (const stoker::InvalidArgument&) {
    return 0;
  }
  require(h.data_offset <= size && h.data_bytes <= size - h.data_offset,
          "the header describes data past the end of the file");
  if (h.shape.empty()) return 0;  // 0-d: not an ArraySource (it needs a dimension of samples)

  // Exactly the file's bytes on the heap: ASan sees any read outside them.
  std::unique_ptr<std::byte[]> copy(new std::byte[size]);
  std::memcpy(copy.get(), data, size);
  const stoker::ArrayView view = stoker::npy_array_view(h, copy.get(), "x");
  stoker::ArraySource source({view});
  const size_t row_bytes = source.fields()[0].sample_bytes();
  if (row_bytes > (1u << 20)) return 0;
  std::vector<std::byte> row(std::max<size_t>(row_bytes, 1));
  std::byte* slots[1] = {row.data()};
  const uint64_t rows = std::min<uint64_t>(source.size(), 1024);
  for (uint64_t r = 0; r < rows; ++r) source.read({0, 0, r}, slots, nullptr);
  return 0;
}
