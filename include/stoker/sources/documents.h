// DocumentSet: a corpus of token documents, the input of the token packers (packing.h).
//
// A document is a sequence of token ids; documents are numbered 0 .. num_documents() - 1 in
// corpus order (shard after shard, each shard's documents in file order). A packer asks for the
// length of any document and for any run of its tokens in O(1); it never holds a document's
// tokens itself, so the corpus may be memory-mapped files of any size.
//
// Thread safety: a DocumentSet is immutable after construction; every member is safe to call
// from any number of threads at once.
// Errors: read() throws IoError naming the file when the bytes are gone (a file truncated under
// its mapping) and InvalidArgument naming the file and the token's position when a token id is
// out of the corpus's vocabulary.
#pragma once

#include <cstdint>
#include <string>

namespace stoker {

class DocumentSet {
 public:
  virtual ~DocumentSet() = default;

  virtual uint64_t num_documents() const = 0;
  // Tokens of all documents together.
  virtual uint64_t num_tokens() const = 0;
  // Tokens of document d. REQUIRES: d < num_documents(). O(1).
  virtual uint64_t document_length(uint64_t d) const = 0;
  // Writes tokens [offset, offset + count) of document d, widened to int64, to out[0 .. count).
  // REQUIRES: d < num_documents(), offset + count <= document_length(d). O(1) plus the copy.
  virtual void read(uint64_t d, uint64_t offset, uint64_t count, int64_t* out) const = 0;
  // The file document d lives in, for error messages; empty when there is none.
  virtual std::string path(uint64_t d) const = 0;
  // The last token of document d (packing asks it of every document, to place separators): a
  // remote corpus answers from its index without fetching the shard. REQUIRES: d <
  // num_documents(), document_length(d) > 0.
  virtual int64_t last_token(uint64_t d) const {
    int64_t t = 0;
    read(d, document_length(d) - 1, 1, &t);
    return t;
  }
};

}  // namespace stoker
