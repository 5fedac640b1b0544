// TokenCorpus: many token shards as one DocumentSet, documents numbered across all of them.
//
// Shards, each told by its name and first bytes:
// - flat token files (tokens.h's parse_token_file: raw nanoGPT .bin, llm.c-headered, 1-d .npy)
//   of the corpus's token_dtype (uint16 or uint32). A flat shard is one document, or, with
//   split_at, a document ends after each occurrence of that token id (the end-of-text token ends
//   its document); a last run without it is a document too; no document is empty. The split is
//   found at construction by one pass over the tokens, with no allocation per token (each block
//   of 64 tokens is tested for the id at once, a loop the compiler vectorizes).
// - Megatron-LM indexed datasets, named by their path prefix or by either file ("x", "x.bin" with
//   an "x.idx" beside it, or "x.idx"). The .idx's dtype code wins: token_dtype and split_at apply
//   to flat shards only. Its documents are Megatron's (a document is its sequences' tokens in
//   order), numbered as Megatron numbers them, empty ones included. Accepted token types: every
//   integer dtype code (uint8, int8, int16, int32, int64, uint16: each holds token ids, and
//   Megatron picks uint16 or int32 by vocabulary size); float32 and float64 hold no token ids.
//   A negative id in a signed type is an error when read, as an id outside the vocabulary is.
//   Megatron writes a dataset's sequences end to end; a .idx whose sequences do not lie so is
//   rejected (stoker/sources/megatron.h says why), so a shard is a flat array of tokens after
//   construction and its .idx is not kept.
// Every shard's tokens are memory-mapped once, read-only, and shared by every thread; the bytes
// are copied only by read(), under MappedFile's SIGBUS guard.
// Remote shards (stoker.remote) are described up front (layout from a ranged read of the header,
// documents from a Megatron .idx or a `stoker index` sidecar) and read through a ShardCache:
// read() maps the shard's cached file, waiting for its fetch when it is not local yet.
//
// Memory: 12 bytes per document (its first token's position, uint64, and its shard, uint32) and
// at most 4 more for document_at()'s table, so at most 16 bytes per document, plus a few hundred
// bytes per shard. Lookups: document_length, document_start and locating a document's bytes are
// one or two array loads, O(1). document_at is a table lookup then a binary search over the few
// documents that start in one bucket of 2^k tokens, where 2^k is at least twice the mean
// document length: about two documents per bucket on average, O(1) expected, O(log documents)
// when one bucket holds many short documents.
//
// Thread safety: immutable after construction; every member is safe from any number of threads.
// Errors: the constructor throws InvalidArgument naming the file for a shard whose layout or
// index is malformed (parse_token_file; stoker/sources/megatron.h), holds no tokens, or
// disagrees with its pair (a .bin shorter or longer than its .idx says), and IoError naming the
// file for one that cannot be opened or mapped, or a Megatron prefix missing its .bin or .idx.
// read() throws IoError naming the file when its bytes are gone (a shard truncated under its
// mapping), and, when vocab_size is not 0, InvalidArgument naming the file, the document and the
// token's position when an id is not below vocab_size (and, whatever vocab_size, when a signed
// Megatron shard holds a negative id). Ids are checked as read() copies them, not at construction
// (no scan of every token up front).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stoker/dtype.h"
#include "stoker/sources/documents.h"

namespace stoker {

// The cache of remote shards (stoker/shard_cache.h): the Python front (stoker.remote) makes
// it and gives it to the remote constructor below; a C++ user reads local files.
class ShardCache;

class TokenCorpus final : public DocumentSet {
 public:
  enum class Format { kRaw, kLlmc, kNpy, kMegatron };

  // `paths`: the shards, in corpus order (already expanded: no globbing). token_dtype: uint16 or
  // uint32, the tokens of flat shards. split_at: the id that ends a document in flat shards, or
  // nullopt (a flat shard is one document). vocab_size: ids read must be below it; 0: unchecked.
  // REQUIRES: at least one path; split_at below 2^bits of token_dtype and below vocab_size when
  // it is given. Throws as the header says. Cost: O(documents + Megatron sequences) plus, with
  // split_at, one pass over the flat shards' tokens.
  TokenCorpus(const std::vector<std::string>& paths, DType token_dtype,
              std::optional<uint64_t> split_at = std::nullopt, uint64_t vocab_size = 0);
  // A remote shard: the cache's shard of the same number holds it.
  struct RemoteShard {
    Format format = Format::kRaw;
    DType dtype;               // of its tokens
    uint64_t data_offset = 0;  // bytes before the first token
    uint64_t num_tokens = 0;
    std::vector<uint64_t> ends;  // its documents' ends, in tokens from its start; empty: one
    // Each document's last token, when known (packing with eos asks for them); empty: read
    // from the shard when asked (which fetches it).
    std::vector<int64_t> last_tokens;
  };
  // Remote shards, in corpus order, read through `cache` (shard s of the corpus is cache shard
  // s). REQUIRES: shards.size() == cache->size(); each shard's tokens inside its size; ends
  // ascending and ending at num_tokens (InvalidArgument naming the URL otherwise).
  TokenCorpus(std::shared_ptr<ShardCache> cache, std::vector<RemoteShard> shards,
              uint64_t vocab_size = 0);
  ~TokenCorpus() override;
  TokenCorpus(const TokenCorpus&) = delete;
  TokenCorpus& operator=(const TokenCorpus&) = delete;

  uint64_t num_documents() const override { return doc_shard_.size(); }
  uint64_t num_tokens() const override { return doc_start_.back(); }
  uint64_t document_length(uint64_t d) const override { return doc_start_[d + 1] - doc_start_[d]; }
  void read(uint64_t d, uint64_t offset, uint64_t count, int64_t* out) const override;
  std::string path(uint64_t d) const override;
  int64_t last_token(uint64_t d) const override;

  // The position of document d's first token in the concatenation of all documents, in corpus
  // order. REQUIRES: d <= num_documents() (document_start(num_documents()) == num_tokens()). O(1).
  uint64_t document_start(uint64_t d) const { return doc_start_[d]; }
  // The document holding position `token` of that concatenation (never an empty document).
  // REQUIRES: token < num_tokens(). O(1) expected (see above).
  uint64_t document_at(uint64_t token) const;

  uint64_t num_shards() const;
  // The shard of document d. REQUIRES: d < num_documents(). O(1).
  uint32_t shard_of(uint64_t d) const { return doc_shard_[d]; }
  // Shard s's file: the path given for a flat shard, the .bin for a Megatron dataset.
  // REQUIRES: s < num_shards().
  const std::string& shard_path(uint64_t s) const;
  Format shard_format(uint64_t s) const;
  // The first document of shard s; shard_first_document(num_shards()) == num_documents().
  uint64_t shard_first_document(uint64_t s) const;
  uint64_t vocab_size() const { return vocab_size_; }

 private:
  struct Shard;
  // Opens shard `path` into `s`, appends its documents' ends (token counts from its start) to
  // `ends` and returns its tokens.
  static uint64_t open_shard(Shard& s, const std::string& path, DType token_dtype,
                             std::optional<uint64_t> split_at, std::vector<uint64_t>& ends);

  // Fills doc_start_, doc_shard_ and the buckets from each shard's document ends.
  void index_documents(std::vector<std::vector<uint64_t>>& ends);

  std::vector<Shard> shards_;
  std::shared_ptr<ShardCache> cache_;  // remote shards only
  std::vector<int64_t> last_tokens_;   // remote shards whose index has them: per document
  std::vector<uint64_t> doc_start_;    // num_documents() + 1 positions, the last num_tokens()
  std::vector<uint32_t> doc_shard_;    // per document
  // buckets_[b]: the document holding position b << bucket_shift_; one more entry, the last
  // document, closes the last bucket.
  std::vector<uint64_t> buckets_;
  unsigned bucket_shift_ = 0;
  uint64_t vocab_size_;
};

}  // namespace stoker
