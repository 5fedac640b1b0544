// TEST-ONLY (header-only; the C++ tests and _native.testing with STOKER_TESTING; never in a
// wheel).
//
// VectorDocuments: a DocumentSet over documents held in memory, a test double for the packers
// (packing_test.cc, and _native.testing with STOKER_TESTING). Document d's path is "doc-<d>";
// a document listed in `fail` throws IoError when read, as a truncated file would. With
// `trained` (one flag a token, documents as `docs`), it says which tokens are trained on.
//
// Thread safety: immutable; every member is safe from any number of threads.
#pragma once

#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "stoker/errors.h"
#include "stoker/sources/documents.h"

namespace stoker::testing {

class VectorDocuments final : public DocumentSet {
 public:
  explicit VectorDocuments(std::vector<std::vector<int64_t>> docs, std::set<uint64_t> fail = {},
                           std::vector<std::vector<uint8_t>> trained = {})
      : docs_(std::move(docs)), fail_(std::move(fail)), trained_(std::move(trained)) {
    for (const auto& d : docs_) tokens_ += d.size();
  }

  uint64_t num_documents() const override { return docs_.size(); }
  uint64_t num_tokens() const override { return tokens_; }
  uint64_t document_length(uint64_t d) const override { return docs_.at(d).size(); }
  void read(uint64_t d, uint64_t offset, uint64_t count, int64_t* out) const override {
    const auto& doc = docs_.at(d);
    if (offset + count > doc.size())
      throw InvalidArgument("VectorDocuments::read past the end of document " + std::to_string(d));
    if (fail_.count(d) != 0) throw IoError(path(d) + ": injected read failure");
    if (count > 0) std::memcpy(out, doc.data() + offset, count * sizeof(int64_t));
  }
  std::string path(uint64_t d) const override { return "doc-" + std::to_string(d); }
  bool has_untrained_tokens() const override { return !trained_.empty(); }
  void read_trained(uint64_t d, uint64_t offset, uint64_t count, uint8_t* out) const override {
    if (trained_.empty()) return DocumentSet::read_trained(d, offset, count, out);
    if (count > 0) std::memcpy(out, trained_.at(d).data() + offset, count);
  }

 private:
  std::vector<std::vector<int64_t>> docs_;
  std::set<uint64_t> fail_;
  std::vector<std::vector<uint8_t>> trained_;
  uint64_t tokens_ = 0;
};

}  // namespace stoker::testing
