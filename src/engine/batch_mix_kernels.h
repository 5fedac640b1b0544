// Internal: the per-row arithmetic of MixUp (batch_transform.h), exposed for tests.
//
// own[e] = round(round(previous[e] * a) + round(own[e] * b)) for e < n, each rounding to the
// row's dtype, nearest even (torch's mul_ then add_). float32 and bfloat16 use portable loops
// that vectorize; float16 has a portable loop and one with x86's F16C conversions (about 8x
// faster), which the transform takes when the CPU has them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker::internal {

void blend_float32(float* own, const float* previous, size_t n, float a, float b);
void blend_bfloat16(uint16_t* own, const uint16_t* previous, size_t n, float a, float b);
// REQUIRES for hardware = true: float16_hardware().
void blend_float16(uint16_t* own, const uint16_t* previous, size_t n, float a, float b,
                   bool hardware);
// Whether this CPU has the F16C and AVX instructions blend_float16 can use.
bool float16_hardware();

}  // namespace stoker::internal
