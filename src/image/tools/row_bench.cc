// Dev tool: times internal::write_row (the pipeline's output rows) in ns per 224-pixel row, on
// the vector path and the portable loop, for each dtype and layout, flipped and not.
//
//   stoker_row_bench [REPS]
//
// Each figure is the median of 7 runs of REPS calls (default 200000).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "../output_row.h"
#include "stoker/image/transforms.h"

using namespace stoker::image;
using namespace stoker::image::internal;

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 200000;
  const int w = 224;
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * 3);
  std::mt19937 gen(1);
  for (uint8_t& v : rgb) v = static_cast<uint8_t>(gen());
  std::vector<std::byte> out(rgb.size() * 4);
  const char* dtypes[] = {"uint8", "float32", "float16", "bfloat16"};
  std::printf("%-9s %-4s %-5s %10s %10s\n", "dtype", "", "flip", "vector", "portable");
  for (DType dtype : {DType::kUInt8, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (Layout layout : {Layout::kCHW, Layout::kHWC}) {
      std::vector<std::byte> table = output_table({ToTensor(dtype, layout)}).table;
      table.resize(table.size() + kRowTablePadding);
      const RowFormat f{dtype, layout, table.data(), w};
      for (bool flip : {false, true}) {
        double ns[2];
        for (int portable = 0; portable < 2; ++portable) {
          std::vector<double> runs;
          for (int r = 0; r < 7; ++r) {
            const auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < reps; ++i) {
              write_row(f, rgb.data(), flip, out.data(), portable != 0);
              asm volatile("" ::: "memory");
            }
            runs.push_back(
                std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0)
                    .count() /
                reps);
          }
          std::sort(runs.begin(), runs.end());
          ns[portable] = runs[3];
        }
        std::printf("%-9s %-4s %-5s %8.0f ns %8.0f ns\n", dtypes[static_cast<int>(dtype)],
                    layout == Layout::kCHW ? "CHW" : "HWC", flip ? "yes" : "no", ns[0], ns[1]);
      }
    }
  }
}
