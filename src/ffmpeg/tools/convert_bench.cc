// Dev tool: a YUV 4:2:0 frame to RGB at half its size, the way the video reader does it
// (libswscale's unscaled conversion, then image::internal::halve_rgb8) against libswscale's
// area scaler doing both in one pass (what the reader did before), in us per frame.
//
//   stoker_convert_bench [WIDTH HEIGHT [REPS]]     (default 640 480 500)
//
// Each figure is the median of 7 runs of REPS frames; the two outputs' mean absolute difference
// is printed too (a box mean against libswscale's area filter, which reaches past the 2x2).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

extern "C" {
#include <libswscale/swscale.h>
}

#include "image/halve.h"

namespace {

double median_us(int reps, const std::function<void()>& fn) {
  std::vector<double> runs;
  for (int r = 0; r < 7; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) fn();
    const auto t1 = std::chrono::steady_clock::now();
    runs.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / reps);
  }
  std::nth_element(runs.begin(), runs.begin() + 3, runs.end());
  return runs[3];
}

}  // namespace

int main(int argc, char** argv) {
  const int w = argc > 2 ? std::atoi(argv[1]) : 640, h = argc > 2 ? std::atoi(argv[2]) : 480;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 500;
  if (w < 2 || h < 2 || w % 2 || h % 2 || reps < 1) {
    std::fprintf(stderr, "usage: %s [WIDTH HEIGHT [REPS]] (even sizes)\n", argv[0]);
    return 2;
  }
  const int cw = w / 2, ch = h / 2;
  // Smooth gradients with noise on top: neither flat (which flatters any filter) nor white noise.
  std::mt19937 gen(1);
  std::vector<uint8_t> y(size_t(w) * h), u(size_t(cw) * ch), v(size_t(cw) * ch);
  for (int r = 0; r < h; ++r)
    for (int c = 0; c < w; ++c) y[size_t(r) * w + c] = uint8_t((r + c) / 5 % 220 + gen() % 16 + 16);
  for (size_t i = 0; i < u.size(); ++i) {
    u[i] = uint8_t(128 + int(i % cw) / 8 % 40 - 20 + gen() % 5);
    v[i] = uint8_t(128 + int(i / cw) / 8 % 40 - 20 + gen() % 5);
  }
  const uint8_t* src[4] = {y.data(), u.data(), v.data(), nullptr};
  const int src_stride[4] = {w, cw, cw, 0};
  const size_t full_stride = (size_t(w) * 3 + 63) & ~size_t{63};
  const size_t half_stride = (size_t(cw) * 3 + 63) & ~size_t{63};
  std::vector<uint8_t> full(full_stride * h + 64), half(half_stride * ch + 64),
      area(half_stride * ch + 64);

  SwsContext* convert = sws_getContext(w, h, AV_PIX_FMT_YUV420P, w, h, AV_PIX_FMT_RGB24,
                                       SWS_BILINEAR, nullptr, nullptr, nullptr);
  SwsContext* scale = sws_getContext(w, h, AV_PIX_FMT_YUV420P, cw, ch, AV_PIX_FMT_RGB24, SWS_AREA,
                                     nullptr, nullptr, nullptr);
  if (convert == nullptr || scale == nullptr) return 1;
  uint8_t* full_dst[4] = {full.data(), nullptr, nullptr, nullptr};
  const int full_dst_stride[4] = {int(full_stride), 0, 0, 0};
  uint8_t* area_dst[4] = {area.data(), nullptr, nullptr, nullptr};
  const int area_dst_stride[4] = {int(half_stride), 0, 0, 0};

  auto conversion = [&] { sws_scale(convert, src, src_stride, 0, h, full_dst, full_dst_stride); };
  auto halving = [&] {
    stoker::image::internal::halve_rgb8(full.data(), full_stride, w, h, half.data(), half_stride);
  };
  const double t_area =
      median_us(reps, [&] { sws_scale(scale, src, src_stride, 0, h, area_dst, area_dst_stride); });
  const double t_convert = median_us(reps, conversion);
  const double t_halve = median_us(reps, halving);
  double diff = 0;
  for (int r = 0; r < ch; ++r)
    for (int c = 0; c < cw * 3; ++c)
      diff += std::abs(half[r * half_stride + c] - area[r * half_stride + c]);
  std::printf("%dx%d -> %dx%d RGB, us a frame (median of 7 x %d)\n", w, h, cw, ch, reps);
  std::printf("  libswscale area scaler              %8.1f\n", t_area);
  std::printf("  libswscale conversion + halve_rgb8  %8.1f  (%.1f + %.1f)  %.2fx faster\n",
              t_convert + t_halve, t_convert, t_halve, t_area / (t_convert + t_halve));
  std::printf("  mean absolute difference            %8.3f\n", diff / (double(cw) * ch * 3));
  sws_freeContext(convert);
  sws_freeContext(scale);
}
