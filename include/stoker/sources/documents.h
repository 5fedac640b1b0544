// DocumentSet: a corpus of token documents, the input of the token packers (packing.h).
//
// A document is a sequence of token ids; documents are numbered 0 .. num_documents() - 1 in
// corpus order (shard after shard, each shard's documents in file order). A packer asks for the
// length of any document and for any run of its tokens in O(1); it never holds a document's
// tokens itself, so the corpus may be memory-mapped files of any size.
//
// Thread safety: a DocumentSet is immutable after construction; every member is safe to call
// from any number of threads at once.
// Trained tokens: a corpus may say that some tokens are not trained on (a conversation's prompts,
// where only the assistant's replies are learned): a label whose token is not trained on is the
// packer's label_ignore. Every token is trained on unless has_untrained_tokens().
//
// Errors: read() throws IoError naming the file when the bytes are gone (a file truncated under
// its mapping) and InvalidArgument naming the file and the token's position when a token id is
// out of the corpus's vocabulary.
#pragma once

#include <cstdint>
#include <cstring>
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
  // Whether read_trained() may write a 0: some tokens are not trained on.
  virtual bool has_untrained_tokens() const { return false; }
  // Writes to out[0 .. count) 1 for each token of [offset, offset + count) of document d that is
  // trained on (may be a label), 0 for one that is not. REQUIRES: as read(). O(1) plus the copy.
  virtual void read_trained(uint64_t /*d*/, uint64_t /*offset*/, uint64_t count,
                            uint8_t* out) const {
    std::memset(out, 1, count);
  }
};

// Sets labels[i] to `ignore` for each i < count where token first + i of document d is not
// trained on (DocumentSet::read_trained); nothing when every token of the corpus is. The packers'
// labels are next tokens: label i of a piece starting at token `offset` is token offset + 1 + i.
// REQUIRES: first + count <= docs.document_length(d).
void ignore_untrained_labels(const DocumentSet& docs, uint64_t d, uint64_t first, uint64_t count,
                             int64_t* labels, int64_t ignore);

}  // namespace stoker
