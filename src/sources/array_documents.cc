#include "stoker/sources/array_documents.h"

#include <algorithm>
#include <cstring>

#include "stoker/errors.h"
#include "token_ids.h"

namespace stoker {
namespace {

template <typename T>
void widen(const std::byte* src, uint64_t count, int64_t* out) {
  for (uint64_t t = 0; t < count; ++t) {
    T v;
    std::memcpy(&v, src + t * sizeof(T), sizeof(T));
    out[t] = static_cast<int64_t>(v);
  }
}

}  // namespace

ArrayDocuments::ArrayDocuments(const void* values, DType values_dtype, uint64_t num_values,
                               const void* offsets, DType offsets_dtype, uint64_t num_documents,
                               std::string name, uint64_t vocab_size,
                               std::shared_ptr<const void> owner)
    : values_(static_cast<const std::byte*>(values)),
      values_dtype_(values_dtype),
      offsets_(offsets),
      offsets_dtype_(offsets_dtype),
      num_documents_(num_documents),
      name_(std::move(name)),
      vocab_size_(vocab_size),
      owner_(std::move(owner)) {
  const bool integer = values_dtype.code == DType::kInt || values_dtype.code == DType::kUInt;
  if (!integer || values_dtype.bits < 8 || values_dtype.bits > 64)
    throw InvalidArgument(name_ + ": token ids must be integers, got " + values_dtype.name());
  if (offsets_dtype != DType{DType::kInt, 32} && offsets_dtype != kInt64)
    throw InvalidArgument(name_ + ": list offsets must be int32 or int64, got " +
                          offsets_dtype.name());
  const auto raw = [&](uint64_t d) {
    return offsets_dtype.bits == 32 ? int64_t{static_cast<const int32_t*>(offsets)[d]}
                                    : static_cast<const int64_t*>(offsets)[d];
  };
  int64_t previous = raw(0);
  if (previous < 0)
    throw InvalidArgument(name_ + ": row offsets start at " + std::to_string(previous));
  for (uint64_t d = 1; d <= num_documents; ++d) {
    const int64_t next = raw(d);
    if (next < previous)
      throw InvalidArgument(name_ + ": row " + std::to_string(d - 1) + "'s offsets decrease (" +
                            std::to_string(previous) + " to " + std::to_string(next) + ")");
    previous = next;
  }
  if (static_cast<uint64_t>(previous) > num_values)
    throw InvalidArgument(name_ + ": row offsets end at " + std::to_string(previous) +
                          ", past the column's " + std::to_string(num_values) + " values");
}

void ArrayDocuments::read(uint64_t d, uint64_t offset_in, uint64_t count, int64_t* out) const {
  const std::byte* src = values_ + (offset(d) + offset_in) * values_dtype_.bytes();
  const bool is_signed = values_dtype_.code == DType::kInt;
  switch (values_dtype_.bits) {
    case 8:
      is_signed ? widen<int8_t>(src, count, out) : widen<uint8_t>(src, count, out);
      break;
    case 16:
      is_signed ? widen<int16_t>(src, count, out) : widen<uint16_t>(src, count, out);
      break;
    case 32:
      is_signed ? widen<int32_t>(src, count, out) : widen<uint32_t>(src, count, out);
      break;
    default:
      is_signed ? widen<int64_t>(src, count, out) : widen<uint64_t>(src, count, out);
  }
  // uint64 ids past int64 read as negative: rejected as negative ids are.
  const uint64_t limit = vocab_size_ != 0 ? vocab_size_ : uint64_t{1} << 63;
  const uint64_t t = first_bad_id(out, count, limit);
  if (t == count) return;
  throw_bad_id(
      name_ + ": row " + std::to_string(d) + ", token " + std::to_string(offset_in + t) + ": ",
      out[t], vocab_size_);
}

}  // namespace stoker
