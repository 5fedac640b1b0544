// ArraySource: samples are rows of in-memory or memory-mapped arrays (sample i = row i of each).
//
// Ownership: the source does not copy the arrays; `owner` keeps their memory alive for as long as
// the source exists (a Python array, an mmap, a vector...).
// Thread safety: immutable; read() is safe from any number of threads.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "stoker/source.h"

namespace stoker {

struct ArrayView {
  const std::byte* data = nullptr;
  DType dtype;
  std::vector<int64_t> shape;    // shape[0] is the number of samples
  std::vector<int64_t> strides;  // in bytes, one per dimension; may be negative or zero
  std::string name;
};

class ArraySource final : public Source {
 public:
  // REQUIRES (InvalidArgument otherwise): at least one array; each has at least one dimension,
  // matching shape and strides lengths, and the same length along dimension 0.
  ArraySource(std::vector<ArrayView> arrays, std::shared_ptr<const void> owner = nullptr);

  uint64_t size() const override { return size_; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  void prefetch(uint64_t index) const override;
  void prefetch_batch(std::span<const uint64_t> indices) const override;

 private:
  struct Column {
    ArrayView view;
    bool contiguous_rows;  // each row is one dense block: a single memcpy
    size_t row_bytes;
  };
  std::vector<Column> columns_;
  std::vector<FieldSpec> fields_;
  uint64_t size_ = 0;
  std::shared_ptr<const void> owner_;
};

}  // namespace stoker
