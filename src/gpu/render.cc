#include "render.h"

namespace stoker::image::gpu::internal {

k::KAxis kernel_axis(const StagedAxis& a) {
  k::KAxis out{};
  out.lo = a.lo;
  out.in_size = a.in_size;
  out.in0 = a.in0;
  out.in1 = a.in1;
  out.full_out = a.full_out;
  out.out_offset = a.out_offset;
  out.out_size = a.out_size;
  out.ksize = k::k_ksize(a.in0, a.in1, a.full_out);
  out.table = 0;
  return out;
}

void vertical_rows(const k::KAxis& y, int32_t* lo, int32_t* rows) {
  // Filter windows move forward with the output pixel: the first and last non-padding outputs
  // bound the rows read.
  int32_t first = -1, last = -1;
  for (int32_t i = 0; i < y.out_size; ++i) {
    const int32_t xx = i + y.out_offset;
    if (xx >= 0 && xx < y.full_out) {
      if (first < 0) first = i;
      last = i;
    }
  }
  *lo = 0;
  *rows = 0;
  if (first < 0) return;
  int32_t f0, n0, f1, n1;
  k::k_coeffs(y, first, &f0, &n0, nullptr);
  k::k_coeffs(y, last, &f1, &n1, nullptr);
  *lo = f0;
  *rows = f1 + n1 - f0 > 0 ? f1 + n1 - f0 : 0;
}

}  // namespace stoker::image::gpu::internal
