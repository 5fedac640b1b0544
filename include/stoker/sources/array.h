// ArraySource: samples are rows of in-memory or memory-mapped arrays (sample i = row i of each).
//
// Ownership: the source does not copy the arrays; `owner` keeps their memory alive for as long as
// the source exists (a Python array, an mmap, a vector...), and the MappedFile of every guarded
// array too.
// Thread safety: immutable; read() is safe from any number of threads.
//
// Truncated files: an array whose `mapping` is set (a file Stoker mapped itself: NpyFile::view()
// sets it, and the Python front rebuilds arrays NumPy mapped read-only over a MappedFile of their
// file) is read under the mapping's SIGBUS guard, so a file cut short while an epoch runs makes
// read() throw IoError("<file> was truncated while being read ...") for the rows past the new
// end, which the loader reports as that sample's SampleError. Arrays in memory mapped by anyone
// else carry no guard: reading a row past the end of a truncated file raises SIGBUS, which kills
// the process.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "stoker/source.h"

namespace stoker {

class MappedFile;

struct ArrayView {
  const std::byte* data = nullptr;
  DType dtype;
  std::vector<int64_t> shape;    // shape[0] is the number of samples
  std::vector<int64_t> strides;  // in bytes, one per dimension; may be negative or zero
  std::string name;
  // The file mapping `data` lies in, when reads of it must go through the mapping's SIGBUS guard;
  // nullptr for memory that cannot shrink (or that is mapped by someone else: not guarded).
  // REQUIRES: every byte of the array lies inside the mapping; the mapping outlives the source.
  const MappedFile* mapping = nullptr;
};

class ArraySource final : public Source {
 public:
  // REQUIRES (InvalidArgument otherwise): at least one array; each has at least one dimension,
  // matching shape and strides lengths, and the same length along dimension 0; a guarded array
  // lies wholly inside its mapping.
  ArraySource(std::vector<ArrayView> arrays, std::shared_ptr<const void> owner = nullptr);

  uint64_t size() const override { return size_; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  // The file(s) the rows lie in: the paths of the guarded arrays' mappings, distinct ones
  // joined by ", " in array order; empty when no array is guarded.
  std::string path(uint64_t) const override { return path_; }
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
  std::string path_;
  std::shared_ptr<const void> owner_;
};

}  // namespace stoker
