#include "stoker/sources/packing.h"

#include "stoker/sources/token_corpus.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <mutex>
#include <string>

#include "stoker/errors.h"
#include "stoker/order.h"
#include "stoker/random.h"

namespace stoker {
namespace {

// Seeds of the permutations, hashed apart from the loader's own EpochOrder over samples (which
// is keyed by the bare seed), so that a permutation of documents never mirrors the sample order.
constexpr uint64_t kDocumentOrderTag = 0x646f632d6f726465;  // "doc-orde"
constexpr uint64_t kLengthClassTag = 0x6c656e2d636c6173;    // "len-clas"

EpochOrder document_order(uint64_t num_documents, bool shuffle, uint64_t seed, uint64_t epoch) {
  return EpochOrder(num_documents, shuffle, hash_key(seed, kDocumentOrderTag, 0), epoch);
}

// The permutation of the pieces of length `length` (kBestFit).
EpochOrder class_order(uint64_t count, uint64_t length, bool shuffle, uint64_t seed,
                       uint64_t epoch) {
  return EpochOrder(count, shuffle, hash_key(seed, kLengthClassTag, length), epoch);
}

// The smallest set bit at or above a position, in O(log_64 n): a bitset with a summary level per
// 64 words, up to one word. Finds the tightest open bin of best-fit.
class NextSetBit {
 public:
  explicit NextSetBit(uint64_t n) {
    do {
      n = (n + 63) / 64;
      levels_.emplace_back(n, 0);
    } while (n > 1);
  }
  void set(uint64_t i) {
    for (auto& level : levels_) {
      const bool was_empty = level[i / 64] == 0;
      level[i / 64] |= uint64_t{1} << (i % 64);
      if (!was_empty) return;
      i /= 64;
    }
  }
  void clear(uint64_t i) {
    for (auto& level : levels_) {
      level[i / 64] &= ~(uint64_t{1} << (i % 64));
      if (level[i / 64] != 0) return;
      i /= 64;
    }
  }
  // The smallest set bit >= i, or kNone.
  static constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  uint64_t find(uint64_t i) const {
    size_t l = 0;
    // Up: the first level whose word holding i (or its successor's ancestor) has a bit at or
    // after it.
    for (;; ++l) {
      if (l == levels_.size()) return kNone;
      const auto& level = levels_[l];
      if (i / 64 < level.size()) {
        const uint64_t bits = level[i / 64] & (~uint64_t{0} << (i % 64));
        if (bits != 0) {
          i = (i & ~uint64_t{63}) | static_cast<uint64_t>(std::countr_zero(bits));
          break;
        }
      }
      i = i / 64 + 1;
    }
    // Down: the first set bit under each summary bit.
    while (l > 0) {
      --l;
      i = i * 64 + static_cast<uint64_t>(std::countr_zero(levels_[l][i]));
    }
    return i;
  }

 private:
  std::vector<std::vector<uint64_t>> levels_;  // levels_[0]: the bits; levels_[l + 1]: words != 0
};

}  // namespace

// Where each document starts in a stream of documents (in some order, with an optional one-token
// separator between consecutive ones), and which document holds a stream position. The table
// `buckets` holds, for every 2^shift-th position, the document there; 2^shift is at least the
// average span, so a bucket holds few document starts and find() is O(1) expected (a binary
// search among them, so never worse than O(log D)).
struct PackedTokenSource::StreamIndex {
  EpochOrder order;              // stream rank k -> document
  std::vector<uint64_t> starts;  // D + 1: the k-th document's first position; the stream's end
  std::vector<uint64_t> buckets;
  int shift = 0;

  // `eos`: a separator slot after every document but the last that is not empty and does not
  // end with eos already (its last token is read to tell).
  StreamIndex(const DocumentSet& docs, EpochOrder order_, std::optional<int64_t> eos)
      : order(order_), starts(order_.size() + 1) {
    const uint64_t n = order.size();
    uint64_t pos = 0;
    for (uint64_t k = 0; k < n; ++k) {
      starts[k] = pos;
      const uint64_t length = docs.document_length(order[k]);
      pos += length;
      if (eos && k + 1 < n && length > 0) {
        pos += docs.last_token(order[k]) != *eos;
      }
    }
    starts[n] = pos;
    const uint64_t average = n == 0 ? 1 : std::max<uint64_t>(1, (pos + n - 1) / n);
    shift = static_cast<int>(std::bit_width(average - 1));
    buckets.resize((pos >> shift) + 1);
    uint64_t k = 0;
    for (uint64_t b = 0; b < buckets.size(); ++b) {
      const uint64_t p = b << shift;
      while (k + 1 < n && starts[k + 1] <= p) ++k;
      buckets[b] = k;
    }
  }

  uint64_t length() const { return starts.back(); }
  uint64_t document(uint64_t k) const { return order[k]; }
  // The rank of the document that holds position `pos` (the last one starting at or before it,
  // which skips empty documents). REQUIRES: pos < length().
  uint64_t find(uint64_t pos) const {
    const uint64_t b = pos >> shift;
    const uint64_t lo = buckets[b];
    const uint64_t hi = b + 1 < buckets.size() ? buckets[b + 1] : order.size() - 1;
    const auto first = starts.begin() + static_cast<ptrdiff_t>(lo);
    const auto last = starts.begin() + static_cast<ptrdiff_t>(hi) + 1;
    return lo + static_cast<uint64_t>(std::upper_bound(first, last, pos) - first) - 1;
  }
};

// Best-fit-decreasing bins of piece lengths. Bins [0, chunks) hold one full chunk of L tokens
// each; the rest hold remainder pieces (documents shorter than L, and the tails of longer ones),
// identified by length class and rank within the class. The pieces of class c (length c) are the
// documents d with length(d) % L == c, in corpus order: piece_doc[class_start[c] + j].
struct PackedTokenSource::BestFit {
  uint64_t chunks = 0;
  std::vector<uint64_t> chunk_docs;    // documents of at least L tokens, in corpus order
  std::vector<uint64_t> chunk_prefix;  // chunks of the documents before chunk_docs[i]; + total
  std::vector<uint64_t> class_start;   // L + 1 entries
  std::vector<uint64_t> piece_doc;
  std::vector<uint64_t> bin_start;  // remainder bins + 1 entries, into bin_slot
  std::vector<uint64_t> bin_slot;   // class_start[c] + j: the j-th slot of class c (unpermuted)

  uint64_t class_of(uint64_t slot) const {
    return static_cast<uint64_t>(std::upper_bound(class_start.begin(), class_start.end(), slot) -
                                 class_start.begin()) -
           1;
  }
};

struct PackedTokenSource::EpochCache {
  static constexpr size_t kEpochs = 3;
  struct Built {
    std::once_flag once;
    std::shared_ptr<const StreamIndex> index;
  };
  struct Entry {
    uint64_t seed, epoch, last_use;
    std::shared_ptr<Built> built;
  };
  std::mutex mu;
  std::vector<Entry> entries;  // guarded by mu; at most kEpochs
  uint64_t clock = 0;          // guarded by mu
};

// Writes one sample of kDocument or kBestFit: pieces one after another, then padding.
class PackedTokenSource::SequenceWriter {
 public:
  SequenceWriter(const PackedTokenSource& src, std::span<std::byte* const> slots)
      : docs_(*src.docs_),
        options_(src.options_),
        max_segments_(src.max_segments_),
        input_(reinterpret_cast<int64_t*>(slots[0])),
        labels_(reinterpret_cast<int64_t*>(slots[1])),
        positions_(reinterpret_cast<int64_t*>(slots[2])),
        cu_seqlens_(reinterpret_cast<int32_t*>(slots[3])),
        max_seqlen_(reinterpret_cast<int32_t*>(slots[4])),
        loss_mask_(options_.loss_mask ? reinterpret_cast<uint8_t*>(slots[5]) : nullptr) {
    cu_seqlens_[0] = 0;
  }

  // Tokens [offset, offset + count) of document `doc`; `ends_document`: the last of them is the
  // document's last token. REQUIRES: count >= 1 and fits in what is left of the sample.
  void add(uint64_t doc, uint64_t offset, uint64_t count, bool ends_document) {
    next_segment(static_cast<int32_t>(filled_ + count));
    int64_t* in = input_ + filled_;
    int64_t* lab = labels_ + filled_;
    docs_.read(doc, offset, count, in);
    std::memcpy(lab, in + 1, (count - 1) * sizeof(int64_t));
    if (ends_document)
      lab[count - 1] = options_.label_ignore;
    else
      docs_.read(doc, offset + count, 1, lab + count - 1);
    ignore_untrained_labels(docs_, doc, offset + 1, ends_document ? count - 1 : count, lab,
                            options_.label_ignore);
    for (uint64_t t = 0; t < count; ++t) positions_[filled_ + t] = static_cast<int64_t>(t);
    if (loss_mask_ != nullptr) {
      for (uint64_t t = 0; t < count; ++t)
        loss_mask_[filled_ + t] = lab[t] != options_.label_ignore ? 1 : 0;
      if (ends_document) loss_mask_[filled_ + count - 1] = 0;
    }
    longest_ = std::max(longest_, count);
    filled_ += count;
  }

  void finish() {
    const uint64_t L = options_.seq_len;
    if (filled_ < L) {
      next_segment(static_cast<int32_t>(L));
      const uint64_t pad = L - filled_;
      std::fill_n(input_ + filled_, pad, options_.eos.value_or(0));
      std::fill_n(labels_ + filled_, pad, options_.label_ignore);
      std::fill_n(positions_ + filled_, pad, 0);
      if (loss_mask_ != nullptr) std::memset(loss_mask_ + filled_, 0, pad);
      longest_ = std::max(longest_, pad);
      filled_ = L;
    }
    std::fill(cu_seqlens_ + segments_ + 1, cu_seqlens_ + max_segments_ + 1,
              static_cast<int32_t>(L));
    *max_seqlen_ = static_cast<int32_t>(longest_);
  }

 private:
  void next_segment(int32_t end) {
    // The constructor's max_segments check makes this unreachable; it guards the slot's bounds.
    if (segments_ == max_segments_)
      throw Error("PackedTokenSource: a sample needs more than max_segments = " +
                  std::to_string(max_segments_) + " segments (a bug: the bound was checked)");
    cu_seqlens_[++segments_] = end;
  }

  const DocumentSet& docs_;
  const PackOptions& options_;
  uint64_t max_segments_;
  int64_t* input_;
  int64_t* labels_;
  int64_t* positions_;
  int32_t* cu_seqlens_;
  int32_t* max_seqlen_;
  uint8_t* loss_mask_;
  uint64_t filled_ = 0, segments_ = 0, longest_ = 0;
};

PackedTokenSource::PackedTokenSource(std::shared_ptr<const DocumentSet> docs, PackOptions options)
    : docs_(std::move(docs)), options_(options) {
  if (docs_ == nullptr) throw InvalidArgument("PackedTokenSource needs a DocumentSet, got null");
  const uint64_t L = options_.seq_len;
  if (L == 0) throw InvalidArgument("seq_len must be a positive integer, got 0");
  const uint64_t D = docs_->num_documents();
  uint64_t total = 0, nonempty = 0;
  for (uint64_t d = 0; d < D; ++d) {
    const uint64_t n = docs_->document_length(d);
    total += n;
    nonempty += n > 0;
  }
  if (total == 0)
    throw InvalidArgument("the corpus has no tokens (" + std::to_string(D) +
                          " documents); packing needs at least one");
  const int64_t shape_l = static_cast<int64_t>(L);

  if (options_.mode == Pack::kConcat) {
    if (options_.shuffle_documents)
      throw InvalidArgument(
          "concat packing keeps the corpus order (the loader shuffles windows): "
          "shuffle_documents must be false");
    if (options_.loss_mask || options_.max_segments != 0)
      throw InvalidArgument(
          "concat packing has fields input and target only: loss_mask and max_segments apply to "
          "document and best_fit packing");
    if (docs_->has_untrained_tokens())
      throw InvalidArgument(
          "concat packing trains on every token (input, target): a corpus with tokens that are "
          "not trained on (a conversation's prompts) needs document or best_fit packing");
    corpus_index_ =
        std::make_shared<StreamIndex>(*docs_, document_order(D, false, 0, 0), options_.eos);
    const uint64_t stream = corpus_index_->length();
    if (stream < L + 1)
      throw InvalidArgument("the corpus's stream has " + std::to_string(stream) + " tokens (" +
                            std::to_string(total) + " in " + std::to_string(D) + " documents" +
                            (options_.eos ? ", plus separators" : "") + "); seq_len " +
                            std::to_string(L) + " needs at least " + std::to_string(L + 1));
    size_ = (stream - 1) / L;
    num_pieces_ = D;
    fields_ = {{"input", kInt64, {shape_l}}, {"target", kInt64, {shape_l}}};
    return;
  }

  if (L > static_cast<uint64_t>(std::numeric_limits<int32_t>::max()))
    throw InvalidArgument("seq_len " + std::to_string(L) +
                          " does not fit cu_seqlens's int32 (at most 2147483647)");
  if (options_.max_segments > L)
    throw InvalidArgument("max_segments " + std::to_string(options_.max_segments) +
                          " is more than seq_len " + std::to_string(L) +
                          " (each segment holds a token at least)");
  uint64_t needed = 0;  // segments some sample may have
  if (options_.mode == Pack::kDocument) {
    size_ = (total + L - 1) / L;
    padded_tokens_ = size_ * L - total;
    num_pieces_ = nonempty;
    if (!options_.shuffle_documents) {
      corpus_index_ =
          std::make_shared<StreamIndex>(*docs_, document_order(D, false, 0, 0), std::nullopt);
      // Exact: the documents each window meets, one window after another, plus the padding.
      uint64_t window = 0, count = 0;
      for (uint64_t k = 0; k < D; ++k) {
        const uint64_t s = corpus_index_->starts[k], e = corpus_index_->starts[k + 1];
        if (s == e) continue;
        const uint64_t first = s / L, last = (e - 1) / L;
        if (first != window) {
          needed = std::max(needed, count);
          window = first;
          count = 0;
        }
        ++count;
        if (last != first) {
          needed = std::max(needed, count);
          window = last;
          count = 1;
        }
      }
      needed = std::max(needed, count + (padded_tokens_ > 0 ? 1 : 0));
    } else {
      // Any permutation: the whole documents inside a window are at most the most shortest ones
      // that fit in L; the pieces cut at its two ends (or the padding) add two.
      std::vector<uint64_t> by_length(L + 1, 0);
      for (uint64_t d = 0; d < D; ++d) {
        const uint64_t n = docs_->document_length(d);
        if (n > 0 && n <= L) ++by_length[n];
      }
      uint64_t fit = 0, used = 0;
      for (uint64_t n = 1; n <= L; ++n) {
        const uint64_t take = std::min(by_length[n], (L - used) / n);
        fit += take;
        used += take * n;
        if (take < by_length[n]) break;
      }
      needed = std::min({fit + 2, L, nonempty + 1});
      cache_ = std::make_unique<EpochCache>();
    }
  } else {
    build_best_fit();
    const BestFit& bf = *best_fit_;
    needed = bf.chunks > 0 ? 1 : 0;
    for (size_t b = 0; b + 1 < bf.bin_start.size(); ++b) {
      uint64_t used = 0;
      for (uint64_t s = bf.bin_start[b]; s < bf.bin_start[b + 1]; ++s)
        used += bf.class_of(bf.bin_slot[s]);
      needed = std::max(needed, bf.bin_start[b + 1] - bf.bin_start[b] + (used < L ? 1 : 0));
    }
  }
  if (options_.max_segments != 0 && options_.max_segments < needed)
    throw InvalidArgument(
        "max_segments " + std::to_string(options_.max_segments) + " is too small: " +
        std::string(options_.mode == Pack::kDocument && options_.shuffle_documents
                        ? "a shuffled epoch may put "
                        : "a sequence holds ") +
        std::to_string(needed) + " segments (pieces of documents, and the padding) in one of " +
        std::to_string(L) + " tokens; pass max_segments >= " + std::to_string(needed) +
        ", or 0 for that");
  max_segments_ = options_.max_segments != 0 ? options_.max_segments : needed;
  fields_ = {{"input_ids", kInt64, {shape_l}},
             {"labels", kInt64, {shape_l}},
             {"position_ids", kInt64, {shape_l}},
             {"cu_seqlens", DType{DType::kInt, 32}, {static_cast<int64_t>(max_segments_) + 1}},
             {"max_seqlen", DType{DType::kInt, 32}, {}}};
  if (options_.loss_mask) fields_.push_back({"loss_mask", kUInt8, {shape_l}});
}

PackedTokenSource::~PackedTokenSource() = default;

void PackedTokenSource::build_best_fit() {
  const uint64_t L = options_.seq_len;
  const uint64_t D = docs_->num_documents();
  auto bf = std::make_unique<BestFit>();
  bf->class_start.assign(L + 1, 0);
  bf->chunk_prefix.push_back(0);
  for (uint64_t d = 0; d < D; ++d) {
    const uint64_t n = docs_->document_length(d);
    if (n >= L) {
      bf->chunk_docs.push_back(d);
      bf->chunk_prefix.push_back(bf->chunk_prefix.back() + n / L);
    }
    if (n % L != 0) ++bf->class_start[n % L];
  }
  bf->chunks = bf->chunk_prefix.back();
  // Counts to starts; class 0 (no remainder) is empty.
  uint64_t pieces = 0;
  for (uint64_t c = 0; c <= L; ++c) {
    const uint64_t count = bf->class_start[c];
    bf->class_start[c] = pieces;
    pieces += c < L ? count : 0;
  }
  bf->piece_doc.resize(pieces);
  {
    std::vector<uint64_t> next(bf->class_start.begin(), bf->class_start.end() - 1);
    for (uint64_t d = 0; d < D; ++d) {
      const uint64_t c = docs_->document_length(d) % L;
      if (c != 0) bf->piece_doc[next[c]++] = d;
    }
  }

  // Best-fit decreasing: the longest pieces first, each into the open bin it fills most tightly
  // (the least remaining capacity that holds it), else a new bin. Open bins are kept by remaining
  // capacity, a stack per capacity (ties: the latest bin first), threaded through `next_open`.
  constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  std::vector<uint64_t> open_head(L, kNone), next_open, bin_of(pieces);
  NextSetBit nonempty(L);
  uint64_t bins = 0;
  for (uint64_t c = L - 1; c >= 1; --c) {
    for (uint64_t slot = bf->class_start[c]; slot < bf->class_start[c + 1]; ++slot) {
      const uint64_t cap = nonempty.find(c);
      uint64_t bin, left;
      if (cap == NextSetBit::kNone) {
        bin = bins++;
        next_open.push_back(kNone);
        left = L - c;
      } else {
        bin = open_head[cap];
        open_head[cap] = next_open[bin];
        if (open_head[cap] == kNone) nonempty.clear(cap);
        left = cap - c;
      }
      bin_of[slot] = bin;
      if (left > 0) {
        next_open[bin] = open_head[left];
        if (open_head[left] == kNone) nonempty.set(left);
        open_head[left] = bin;
      }
    }
  }
  // Group the slots by bin, each bin's in the order they were placed (longest first).
  bf->bin_start.assign(bins + 1, 0);
  for (uint64_t slot = 0; slot < pieces; ++slot) ++bf->bin_start[bin_of[slot] + 1];
  for (uint64_t b = 0; b < bins; ++b) bf->bin_start[b + 1] += bf->bin_start[b];
  bf->bin_slot.resize(pieces);
  {
    std::vector<uint64_t> next(bf->bin_start.begin(), bf->bin_start.end() - 1);
    for (uint64_t c = L - 1; c >= 1; --c)
      for (uint64_t slot = bf->class_start[c]; slot < bf->class_start[c + 1]; ++slot)
        bf->bin_slot[next[bin_of[slot]]++] = slot;
  }
  uint64_t tokens = bf->chunks * L;
  for (uint64_t c = 1; c < L; ++c) tokens += c * (bf->class_start[c + 1] - bf->class_start[c]);
  size_ = bf->chunks + bins;
  padded_tokens_ = size_ * L - tokens;
  num_pieces_ = bf->chunks + pieces;
  best_fit_ = std::move(bf);
}

double PackedTokenSource::padding_fraction() const {
  return static_cast<double>(padded_tokens_) /
         (static_cast<double>(size_) * static_cast<double>(options_.seq_len));
}

std::shared_ptr<const PackedTokenSource::StreamIndex> PackedTokenSource::epoch_index(
    uint64_t seed, uint64_t epoch) const {
  if (cache_ == nullptr) return corpus_index_;
  std::shared_ptr<EpochCache::Built> built;
  {
    std::lock_guard<std::mutex> lock(cache_->mu);
    auto& entries = cache_->entries;
    auto it = std::find_if(entries.begin(), entries.end(), [&](const EpochCache::Entry& e) {
      return e.seed == seed && e.epoch == epoch;
    });
    if (it == entries.end()) {
      if (entries.size() == EpochCache::kEpochs)
        entries.erase(
            std::min_element(entries.begin(), entries.end(),
                             [](const auto& a, const auto& b) { return a.last_use < b.last_use; }));
      entries.push_back({seed, epoch, 0, std::make_shared<EpochCache::Built>()});
      it = entries.end() - 1;
    }
    it->last_use = ++cache_->clock;
    built = it->built;
  }
  // Built outside the lock: readers of other epochs do not wait; readers of this one wait here.
  std::call_once(built->once, [&] {
    built->index = std::make_shared<StreamIndex>(
        *docs_, document_order(docs_->num_documents(), true, seed, epoch), std::nullopt);
  });
  return built->index;
}

void PackedTokenSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                             WorkerState*) const {
  switch (options_.mode) {
    case Pack::kConcat:
      return read_concat(key.index, slots);
    case Pack::kDocument:
      return read_document(key, slots);
    case Pack::kBestFit:
      return read_best_fit(key, slots);
  }
}

std::vector<uint64_t> PackedTokenSource::samples_per_shard() const {
  const auto* corpus = dynamic_cast<const TokenCorpus*>(docs_.get());
  if (options_.mode != Pack::kConcat || corpus == nullptr) return {};
  // Concat's stream is the documents in corpus order: shard s's stream positions begin at its
  // first document's start. Sample i starts at i * L.
  const uint64_t L = options_.seq_len, S = corpus->num_shards();
  std::vector<uint64_t> out;
  out.reserve(S);
  uint64_t first = 0;  // the first sample of the shard being counted
  for (uint64_t s = 1; s <= S; ++s) {
    const uint64_t start = corpus_index_->starts[corpus->shard_first_document(s)];
    const uint64_t end = s == S ? size_ : std::min(size_, (start + L - 1) / L);
    out.push_back(end > first ? end - first : 0);
    first = std::max(first, end);
  }
  return out;
}

std::vector<uint64_t> PackedTokenSource::shards() const {
  std::vector<uint64_t> b;  // a shard without samples is no block
  for (const uint64_t n : samples_per_shard())
    if (n > 0) b.push_back(n);
  return b;
}

void PackedTokenSource::read_concat(uint64_t index, std::span<std::byte* const> slots) const {
  const StreamIndex& s = *corpus_index_;
  const uint64_t L = options_.seq_len;
  // Stream tokens [pos, pos + count): document tokens, and eos in a document's separator slot
  // (StreamIndex says which documents have one).
  const auto copy = [&](uint64_t pos, uint64_t count, int64_t* out) {
    uint64_t k = s.find(pos);
    while (count > 0) {
      while (s.starts[k + 1] <= pos) ++k;
      const uint64_t d = s.document(k);
      const uint64_t within = pos - s.starts[k], length = docs_->document_length(d);
      uint64_t n = 1;
      if (within < length) {
        n = std::min(length - within, count);
        docs_->read(d, within, n, out);
      } else {
        *out = *options_.eos;
      }
      out += n, pos += n, count -= n;
    }
  };
  auto* input = reinterpret_cast<int64_t*>(slots[0]);
  auto* target = reinterpret_cast<int64_t*>(slots[1]);
  copy(index * L, L, input);
  std::memcpy(target, input + 1, (L - 1) * sizeof(int64_t));
  copy(index * L + L, 1, target + L - 1);
}

void PackedTokenSource::read_document(const SampleKey& key,
                                      std::span<std::byte* const> slots) const {
  const std::shared_ptr<const StreamIndex> index = epoch_index(key.seed, key.epoch);
  const StreamIndex& s = *index;
  const uint64_t L = options_.seq_len;
  uint64_t pos = key.index * L;
  const uint64_t end = std::min(pos + L, s.length());
  SequenceWriter out(*this, slots);
  for (uint64_t k = s.find(pos); pos < end; ++k) {
    if (s.starts[k + 1] <= pos) continue;  // an empty document
    const uint64_t piece_end = std::min(s.starts[k + 1], end);
    out.add(s.document(k), pos - s.starts[k], piece_end - pos, piece_end == s.starts[k + 1]);
    pos = piece_end;
  }
  out.finish();
}

void PackedTokenSource::read_best_fit(const SampleKey& key,
                                      std::span<std::byte* const> slots) const {
  const BestFit& bf = *best_fit_;
  const uint64_t L = options_.seq_len;
  const bool shuffle = options_.shuffle_documents;
  SequenceWriter out(*this, slots);
  if (key.index < bf.chunks) {
    const uint64_t r = class_order(bf.chunks, L, shuffle, key.seed, key.epoch)[key.index];
    const uint64_t i =
        static_cast<uint64_t>(std::upper_bound(bf.chunk_prefix.begin(), bf.chunk_prefix.end(), r) -
                              bf.chunk_prefix.begin()) -
        1;
    const uint64_t d = bf.chunk_docs[i];
    const uint64_t offset = (r - bf.chunk_prefix[i]) * L;
    out.add(d, offset, L, offset + L == docs_->document_length(d));
  } else {
    const uint64_t b = key.index - bf.chunks;
    for (uint64_t s = bf.bin_start[b]; s < bf.bin_start[b + 1]; ++s) {
      const uint64_t slot = bf.bin_slot[s];
      const uint64_t c = bf.class_of(slot);
      const uint64_t first = bf.class_start[c], count = bf.class_start[c + 1] - first;
      const uint64_t d =
          bf.piece_doc[first + class_order(count, c, shuffle, key.seed, key.epoch)[slot - first]];
      out.add(d, docs_->document_length(d) - c, c, true);
    }
  }
  out.finish();
}

std::string PackedTokenSource::path(uint64_t index) const {
  if (index >= size_ || options_.shuffle_documents) return {};
  if (corpus_index_ != nullptr)
    return docs_->path(corpus_index_->document(corpus_index_->find(index * options_.seq_len)));
  const BestFit& bf = *best_fit_;
  if (index < bf.chunks) {
    const uint64_t i = static_cast<uint64_t>(
                           std::upper_bound(bf.chunk_prefix.begin(), bf.chunk_prefix.end(), index) -
                           bf.chunk_prefix.begin()) -
                       1;
    return docs_->path(bf.chunk_docs[i]);
  }
  return docs_->path(bf.piece_doc[bf.bin_slot[bf.bin_start[index - bf.chunks]]]);
}

}  // namespace stoker
