#include "output_row.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "stoker/image/transforms.h"

namespace stoker::image::internal {
namespace {

// An output table as the pipeline keeps it: output_table's, then the padding write_row reads.
std::vector<std::byte> padded_table(DType dtype, Layout layout) {
  std::vector<Transform> list{ToTensor(dtype, layout)};
  if (dtype != DType::kUInt8)
    list.push_back(Normalize({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f}));
  std::vector<std::byte> table = output_table(list).table;
  table.resize(table.size() + kRowTablePadding, std::byte{0xa5});
  return table;
}

// Every dtype and layout, flipped or not, at widths around the vector loops' 8 pixels: each
// output element is its channel's table entry for the input pixel it mirrors, and the vector
// path (where the CPU has one) writes the same bytes as the scalar loop.
TEST(OutputRow, EachElementIsItsPixelsTableEntryOnEveryPath) {
  std::mt19937 gen(7);
  for (DType dtype : {DType::kUInt8, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    const size_t es = element_size(dtype);
    for (Layout layout : {Layout::kCHW, Layout::kHWC}) {
      const std::vector<std::byte> table = padded_table(dtype, layout);
      for (int w : {1, 2, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 33, 224, 333}) {
        // Random pixels, the first red and the last blue 255: the ends of their tables (the
        // blue one's the end of the table, where a gather reads into the padding).
        std::vector<uint8_t> rgb(static_cast<size_t>(w) * 3);
        for (size_t i = 0; i < rgb.size(); ++i)
          rgb[i] = i == 0 || i + 1 == rgb.size() ? 255 : static_cast<uint8_t>(gen());
        for (bool flip : {false, true}) {
          const RowFormat f{dtype, layout, table.data(), w};
          std::vector<std::byte> scalar(rgb.size() * es), vector(rgb.size() * es, std::byte{1});
          write_row(f, rgb.data(), flip, scalar.data(), true);
          write_row(f, rgb.data(), flip, vector.data(), false);
          ASSERT_EQ(std::memcmp(scalar.data(), vector.data(), scalar.size()), 0)
              << "dtype " << static_cast<int>(dtype) << " layout " << static_cast<int>(layout)
              << " width " << w << " flip " << flip;
          for (int x = 0; x < w; ++x) {
            const int from = flip ? w - 1 - x : x;
            for (int c = 0; c < 3; ++c) {
              const size_t at = layout == Layout::kHWC ? static_cast<size_t>(x) * 3 + c
                                                       : static_cast<size_t>(c) * w + x;
              const size_t entry = static_cast<size_t>(c) * 256 + rgb[from * 3 + c];
              ASSERT_EQ(std::memcmp(scalar.data() + at * es, table.data() + entry * es, es), 0)
                  << "pixel " << x << " channel " << c << " width " << w;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace stoker::image::internal
