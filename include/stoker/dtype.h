// Element types of sample fields, with DLPack's type codes so batches export without translation.
//
// Contract: DType is a plain value (bits a multiple of 8 for every type a source declares); the
// constants are compile-time. Thread safety: values, safe to share.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace stoker {

struct DType {
  enum Code : uint8_t { kInt = 0, kUInt = 1, kFloat = 2, kBFloat = 4, kComplex = 5, kBool = 6 };
  Code code = kUInt;
  uint8_t bits = 8;

  size_t bytes() const { return bits / 8; }
  bool operator==(const DType&) const = default;
  std::string name() const;  // "uint8", "float32", "bfloat16", ...
};

inline constexpr DType kUInt8{DType::kUInt, 8};
inline constexpr DType kInt64{DType::kInt, 64};
inline constexpr DType kFloat32{DType::kFloat, 32};

}  // namespace stoker
