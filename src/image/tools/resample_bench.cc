// Dev tool: times internal::resample_rgb8 (the pipeline's one resample) in ns per output pixel.
//
//   stoker_resample_bench [REPS] [auto|generic|portable|avx2]
//
// Cases: RandomResizedCrop-like 300x250 box of a 500x375 image -> 224x224; upscale 120x100 ->
// 224x224; 2.2x downscale 493x493 -> 224x224. Each reports the median of 7 runs of REPS calls
// (default 1000). The resample gets only the source rectangle it reads, as in the pipeline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "../resample.h"

using namespace stoker::image::internal;

namespace {

struct Case {
  const char* name;
  int w, h;
  float x0, y0, x1, y1;
  int ow, oh;
};

double run_case(const Case& c, int reps) {
  std::mt19937 gen(1);
  std::vector<uint8_t> src(size_t(c.w) * c.h * 3);
  for (auto& b : src) b = uint8_t(gen());
  AxisCoeffs h, v;
  compute_coeffs({c.w, c.x0, c.x1, c.ow, 0, c.ow}, h);
  compute_coeffs({c.h, c.y0, c.y1, c.oh, 0, c.oh}, v);
  const uint8_t* base = src.data() + (size_t(v.lo) * c.w + h.lo) * 3;
  shift_coeffs(h, -h.lo);
  shift_coeffs(v, -v.lo);
  std::vector<uint8_t> tmp, row, out(size_t(c.ow) * c.oh * 3);
  struct Ctx {
    uint8_t* out;
    size_t stride;
  } ctx{out.data(), size_t(c.ow) * 3};
  auto sink = [](void* p, int y, const uint8_t* rgb) {
    auto* x = static_cast<Ctx*>(p);
    std::copy(rgb, rgb + x->stride, x->out + y * x->stride);
  };
  std::vector<double> times;
  unsigned check = 0;
  for (int trial = 0; trial < 7; ++trial) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) {
      resample_rgb8(base, size_t(c.w) * 3, h, v, tmp, row, sink, &ctx);
      check += out[i % out.size()];
    }
    const auto t1 = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / reps);
  }
  std::sort(times.begin(), times.end());
  unsigned sum = 0;
  for (uint8_t b : out) sum = sum * 31 + b;
  std::printf("%-34s %8.1f us/call %6.2f ns/out-px (min %.2f)  checksum %08x\n", c.name,
              times[3] / 1000, times[3] / (c.ow * c.oh), times[0] / (c.ow * c.oh), sum);
  return times[3] + check * 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 1000;
  const std::string kernel = argc > 2 ? argv[2] : "auto";
  const ResampleKernel k = kernel == "generic"    ? ResampleKernel::kGeneric
                           : kernel == "portable" ? ResampleKernel::kPortable
                           : kernel == "avx2"     ? ResampleKernel::kAvx2
                                                  : ResampleKernel::kAuto;
  if (!set_resample_kernel(k)) {
    std::fprintf(stderr, "kernel %s is not available here\n", kernel.c_str());
    return 1;
  }
  const Case cases[] = {
      {"rrc 300x250 box of 500x375 -> 224", 500, 375, 100.5f, 60.25f, 400.5f, 310.25f, 224, 224},
      {"upscale 120x100 -> 224", 120, 100, 0, 0, 120, 100, 224, 224},
      {"downscale 2.2x 493x493 -> 224", 493, 493, 0, 0, 493, 493, 224, 224},
  };
  for (const Case& c : cases) run_case(c, reps);
}
