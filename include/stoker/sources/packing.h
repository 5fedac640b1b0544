// PackedTokenSource: LLM training sequences of seq_len (L) tokens cut or packed from the
// documents of a DocumentSet (documents.h).
//
// Every sample is a pure function of (seed, epoch, index): any thread produces any sample, and
// the bytes do not depend on the threads or the order they run in. Every token of every document
// is delivered exactly once per epoch (kConcat: except the tail that fills no whole window, as
// TokenSource drops it).
//
// Modes:
// - kConcat: TokenSource's windows over the documents' concatenation in corpus order, with `eos`
//   between consecutive documents when given: after each document but the last that is not
//   empty and does not end with eos already (its last token is read at construction), so that
//   every document of the stream ends with eos. Sample i is
//   input = stream[i*L : i*L + L], target = stream[i*L + 1 : i*L + L + 1]; there are
//   (stream_len - 1) / L samples. With one document and no eos, bit-identical to TokenSource over
//   that document's tokens. Documents stay in corpus order (the loader shuffles windows), so
//   shuffle_documents, loss_mask and max_segments are rejected in this mode.
// - kDocument: the documents (per-epoch permuted with shuffle_documents) concatenated without
//   separators, cut into ceil(num_tokens / L) windows; a window may hold pieces of several
//   documents and says where each begins (cu_seqlens). The last window is padded.
// - kBestFit: documents packed whole into sequences by best-fit-decreasing over piece lengths. A
//   document longer than L is cut into L-token chunks (each filling a sequence alone) and a
//   remainder piece; a document shorter than L is never split. The bins are chosen from the
//   lengths alone, at construction, so size() and the padding are the same every epoch; with
//   shuffle_documents, each epoch permutes the pieces of each length among themselves (which
//   documents share a sequence changes, the padding does not). Sequences are padded at the end.
//
// Fields of kConcat: "input", "target": int64 [L].
// Fields of kDocument and kBestFit:
//   "input_ids"    int64 [L]  the tokens; padding is `eos`, or 0 without eos.
//   "labels"       int64 [L]  the next token of the same document; label_ignore at a document's
//                             last token, at padding, and where the next token is not trained on
//                             (DocumentSet::read_trained: a conversation's prompts). A piece cut at a window's (or a chunk's)
//                             end is labelled with the document's next token, though that token
//                             is in another sample.
//   "position_ids" int64 [L]  the position within the piece: 0 at each piece's start, so a
//                             document continuing from the previous window restarts at 0 (each
//                             piece is attended to on its own); 0 on padding.
//   "cu_seqlens"   int32 [max_segments + 1]  0, then the end of each piece, then, when there is
//                             padding, L for the padding as one more segment; the rest repeats L
//                             (empty segments, which FlashAttention's varlen kernels accept).
//                             The last entry is always L.
//   "max_seqlen"   int32 []   the longest segment, the padding segment included.
//   "loss_mask"    uint8 [L]  only with loss_mask: 1 where labels != label_ignore, else 0.
//
// max_segments (0 = automatic): the segments a sample may have. Automatic is the exact maximum
// over all samples for kBestFit and unshuffled kDocument; for shuffled kDocument, a bound that
// holds for every permutation (the most shortest documents that fit in L, plus the two pieces cut
// at the window's ends, at most L). A given max_segments below that number is rejected at
// construction (InvalidArgument naming the number needed), so a sample never has more segments
// than cu_seqlens holds.
//
// Shuffling keys: the document permutation of an epoch (kDocument) and the permutation of each
// length class (kBestFit) are EpochOrders keyed by the SampleKey's seed and epoch (and the
// length), hashed apart from the keys the loader's sample order uses.
//
// Complexity and memory, D documents, P pieces (kBestFit: documents shorter than L count once,
// longer ones once per chunk plus one for a remainder):
// - construction: kConcat and kDocument O(D) time, 16 bytes per document (document starts and a
//   position -> document table with one entry per ~average document length). kBestFit
//   O(D + P log L + L) time (a 64-ary bitset over remaining capacities finds the tightest bin);
//   it keeps 16 bytes per remainder piece (its document, its slot in a bin), 8 per sequence of
//   remainders, 16 per document of L tokens or more (its chunks are not stored one by one) and
//   8 * L; building takes 8 bytes more per piece and 16 per sequence, while it runs.
// - read(): kConcat O(1) expected to find the window's first document (a bucket of the table,
//   then a binary search among the few documents starting in it), then O(pieces + L). kDocument
//   the same; shuffled, it first finds the epoch's document starts: built on first use, O(D) time
//   and 16 bytes per document, kept for the last 3 epochs used (a fourth evicts the least recently
//   used; evicting and rebuilding is correct, only slow). kBestFit O(pieces + L) plus O(log L) per
//   piece (O(log D) for a chunk).
//
// Thread safety: immutable after construction except the per-epoch cache of shuffled kDocument,
// which a mutex guards; read() is safe from any number of threads, epochs mixed.
// Errors: the constructor throws InvalidArgument for seq_len 0, an empty corpus, kConcat over a
// corpus with untrained tokens (its windows have no labels to ignore), kConcat with
// fewer than L + 1 stream tokens, kDocument/kBestFit with L beyond int32, or a too-small
// max_segments. read() lets the DocumentSet's errors through (the loader names the sample).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "stoker/source.h"
#include "stoker/sources/documents.h"

namespace stoker {

enum class Pack { kConcat, kDocument, kBestFit };

struct PackOptions {
  Pack mode = Pack::kConcat;
  uint64_t seq_len = 0;
  std::optional<int64_t> eos;      // kConcat: the separator; kDocument/kBestFit: the padding token
  bool shuffle_documents = false;  // kDocument and kBestFit only
  int64_t label_ignore = -100;
  bool loss_mask = false;     // kDocument and kBestFit only
  uint64_t max_segments = 0;  // kDocument and kBestFit only; 0: automatic
};

class PackedTokenSource final : public Source {
 public:
  // REQUIRES: docs non-null; see "Errors" above.
  PackedTokenSource(std::shared_ptr<const DocumentSet> docs, PackOptions options);
  ~PackedTokenSource() override;
  PackedTokenSource(const PackedTokenSource&) = delete;
  PackedTokenSource& operator=(const PackedTokenSource&) = delete;

  uint64_t size() const override { return size_; }
  // Concat packing over a TokenCorpus: a sample belongs to the shard holding its first token.
  // Empty otherwise (document packings reorder documents across shards).
  std::vector<uint64_t> shards() const override;
  // The samples of each of the corpus's shards, shards without any included (concat over a
  // TokenCorpus; empty otherwise).
  std::vector<uint64_t> samples_per_shard() const;
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  // The file of the sample's first document when it does not depend on the epoch (kConcat, and
  // the other modes unshuffled); empty otherwise.
  std::string path(uint64_t index) const override;

  Pack mode() const { return options_.mode; }
  uint64_t seq_len() const { return options_.seq_len; }
  // Segments a sample holds at most: cu_seqlens has max_segments() + 1 entries (0 for kConcat).
  uint64_t max_segments() const { return max_segments_; }
  // Padding tokens per epoch, the same every epoch (0 for kConcat, which pads nothing).
  uint64_t padded_tokens() const { return padded_tokens_; }
  // padded_tokens() / (size() * seq_len()).
  double padding_fraction() const;
  // kBestFit: the pieces packed (chunks and whole documents); kDocument: the documents that are
  // not empty; kConcat: the documents.
  uint64_t num_pieces() const { return num_pieces_; }

 private:
  struct StreamIndex;
  struct BestFit;
  class SequenceWriter;

  std::shared_ptr<const StreamIndex> epoch_index(uint64_t seed, uint64_t epoch) const;
  void read_concat(uint64_t index, std::span<std::byte* const> slots) const;
  void read_document(const SampleKey& key, std::span<std::byte* const> slots) const;
  void read_best_fit(const SampleKey& key, std::span<std::byte* const> slots) const;
  void build_best_fit();

  std::shared_ptr<const DocumentSet> docs_;
  PackOptions options_;
  uint64_t size_ = 0;
  uint64_t max_segments_ = 0;
  uint64_t padded_tokens_ = 0;
  uint64_t num_pieces_ = 0;
  std::vector<FieldSpec> fields_;
  // kConcat and unshuffled kDocument: corpus-order document starts.
  std::shared_ptr<const StreamIndex> corpus_index_;
  std::unique_ptr<const BestFit> best_fit_;
  struct EpochCache;
  std::unique_ptr<EpochCache> cache_;  // shuffled kDocument
};

}  // namespace stoker
