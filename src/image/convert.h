// Internal: float32 -> float16 / bfloat16, round to nearest even (as torch's .to() does).
#pragma once

#include <bit>
#include <cstdint>

namespace stoker::image::internal {

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

inline uint16_t float_to_half(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (u >> 16) & 0x8000;
  u &= 0x7fffffff;
  uint16_t h;
  if (u >= 0x47800000) {  // >= 65536 (or inf/nan): inf or nan
    h = u > 0x7f800000 ? 0x7e00 : 0x7c00;
  } else if (u < 0x38800000) {  // below the smallest normal half: let float addition round
    const float magic = std::bit_cast<float>(uint32_t{0x3f000000});  // 0.5 = 2^-1
    const uint32_t r = std::bit_cast<uint32_t>(std::bit_cast<float>(u) + magic);
    h = static_cast<uint16_t>(r - 0x3f000000);
  } else {
    const uint32_t odd = (u >> 13) & 1;
    u += 0xc8000fffu + odd;  // rebias exponent (127 -> 15) and round
    h = static_cast<uint16_t>(u >> 13);
  }
  return static_cast<uint16_t>(h | sign);
}

}  // namespace stoker::image::internal
