#include "halve.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#define STOKER_HALVE_X86 1
#include <immintrin.h>
#else
#define STOKER_HALVE_X86 0
#endif

namespace stoker::image::internal {
namespace {

// Output pixels x.. of the row made from source rows a and b (the same row at an odd height's
// last): a last column of one source pixel is that pixel twice.
void row_portable(const uint8_t* a, const uint8_t* b, int w, int x, uint8_t* out) {
  for (const int ow = (w + 1) / 2; x < ow; ++x) {
    const int l = 3 * (2 * x), r = 3 * std::min(2 * x + 1, w - 1);
    for (int c = 0; c < 3; ++c)
      out[3 * x + c] = static_cast<uint8_t>((a[l + c] + a[r + c] + b[l + c] + b[r + c] + 2) >> 2);
  }
}

#if STOKER_HALVE_X86

bool have_avx2() { return __builtin_cpu_supports("avx2"); }

// Channel sums of the four pixel pairs at p (sixteen bit; 12 of the 16 lanes used).
__attribute__((target("avx2"))) inline __m256i pair_sums(const uint8_t* p, __m256i pairs) {
  const __m256i v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(p + 12),
                                        reinterpret_cast<const __m128i*>(p));
  return _mm256_maddubs_epi16(_mm256_shuffle_epi8(v, pairs), _mm256_set1_epi8(1));
}

// Four output pixels a step. Each 128-bit lane holds two pixel pairs (12 of the 16 bytes it
// loads); a shuffle puts each channel's pair side by side, and one multiply-add by ones sums
// them. A step reads source bytes [6x, 6x + 28) and writes [3x, 3x + 14): it stops before the
// read would pass the source row (the write then stays inside the output row, 3 (w + 1) / 2
// bytes), and the scalar loop ends the row.
__attribute__((target("avx2"))) int row_avx2(const uint8_t* a, const uint8_t* b, int w,
                                             uint8_t* out) {
  const __m256i pairs = _mm256_broadcastsi128_si256(
      _mm_setr_epi8(0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11, -1, -1, -1, -1));
  const __m256i two = _mm256_set1_epi16(2);
  int x = 0;
  for (; 6 * x + 28 <= 3 * w; x += 4) {
    const __m256i mean = _mm256_srli_epi16(
        _mm256_add_epi16(_mm256_add_epi16(pair_sums(a + 6 * x, pairs), pair_sums(b + 6 * x, pairs)),
                         two),
        2);
    const __m256i bytes = _mm256_packus_epi16(mean, mean);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 3 * x), _mm256_castsi256_si128(bytes));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + 3 * x + 6),
                     _mm256_extracti128_si256(bytes, 1));
  }
  return x;
}

#endif

}  // namespace

void halve_rgb8(const uint8_t* src, size_t src_stride, int w, int h, uint8_t* dst,
                size_t dst_stride, bool portable) {
#if STOKER_HALVE_X86
  static const bool avx2 = have_avx2();
  const bool vector = avx2 && !portable;
#else
  (void)portable;
#endif
  for (int y = 0; 2 * y < h; ++y) {
    const uint8_t* a = src + static_cast<size_t>(2 * y) * src_stride;
    const uint8_t* b = 2 * y + 1 < h ? a + src_stride : a;
    uint8_t* out = dst + static_cast<size_t>(y) * dst_stride;
    int x = 0;
#if STOKER_HALVE_X86
    if (vector) x = row_avx2(a, b, w, out);
#endif
    row_portable(a, b, w, x, out);
  }
}

}  // namespace stoker::image::internal
