// ArrayDocuments: documents that are the rows of a list column held in memory (an Arrow
// list<int> column of token ids: a Hugging Face dataset's "input_ids", a Parquet token table),
// as a DocumentSet for the packers.
//
// The column is two arrays the caller owns and keeps alive through `owner`: `values`, every
// row's ids one after another (any integer type), and `offsets` (int32 or int64, num_documents
// + 1 entries): row d is values[offsets[d] .. offsets[d + 1]). They are read in place, never
// copied (an Arrow IPC file memory-mapped by pyarrow stays on disk until read).
//
// Memory: nothing per document beyond the caller's arrays. Lookups: O(1).
// Thread safety: immutable after construction; every member is safe from any number of threads.
// Errors: the constructor throws InvalidArgument naming the column when the offsets decrease,
// start below 0 or end past the values, or the types are not integers. read() throws
// InvalidArgument naming the column, the row and the token's position for a negative id, and,
// when vocab_size is not 0, for an id not below it (checked as tokens are copied).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "stoker/dtype.h"
#include "stoker/sources/documents.h"

namespace stoker {

class ArrayDocuments final : public DocumentSet {
 public:
  // REQUIRES: values_dtype an integer type; offsets_dtype int32 or int64; `offsets` has
  // num_documents + 1 entries; both arrays contiguous and alive while `owner` is.
  ArrayDocuments(const void* values, DType values_dtype, uint64_t num_values, const void* offsets,
                 DType offsets_dtype, uint64_t num_documents, std::string name, uint64_t vocab_size,
                 std::shared_ptr<const void> owner);

  uint64_t num_documents() const override { return num_documents_; }
  uint64_t num_tokens() const override { return offset(num_documents_) - offset(0); }
  uint64_t document_length(uint64_t d) const override { return offset(d + 1) - offset(d); }
  void read(uint64_t d, uint64_t offset, uint64_t count, int64_t* out) const override;
  std::string path(uint64_t) const override { return name_; }

 private:
  uint64_t offset(uint64_t d) const {
    return offsets_dtype_.bits == 32
               ? static_cast<uint64_t>(static_cast<const int32_t*>(offsets_)[d])
               : static_cast<uint64_t>(static_cast<const int64_t*>(offsets_)[d]);
  }

  const std::byte* values_;
  DType values_dtype_;
  const void* offsets_;
  DType offsets_dtype_;
  uint64_t num_documents_;
  std::string name_;
  uint64_t vocab_size_;
  std::shared_ptr<const void> owner_;
};

}  // namespace stoker
