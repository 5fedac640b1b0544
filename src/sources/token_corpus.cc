#include "stoker/sources/token_corpus.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "stoker/mapped_file.h"
#include "stoker/shard_cache.h"
#include "stoker/sources/megatron.h"
#include "stoker/errors.h"
#include "stoker/sources/tokens.h"
#include "token_ids.h"

namespace stoker {

struct TokenCorpus::Shard {
  std::string path;  // the file the tokens are in
  Format format;
  std::unique_ptr<MappedFile> file;
  const std::byte* tokens = nullptr;  // the first token, inside the mapping
  DType dtype;
  uint64_t num_tokens = 0;
  uint64_t data_offset = 0;     // remote shards: bytes before the first token in the file
  uint64_t first_token = 0;     // in the corpus's concatenation
  uint64_t first_document = 0;  // in the corpus's numbering
  // Ids read must be below this (as uint64, so that a negative one is above it); 0: unchecked.
  uint64_t id_limit = 0;
};

namespace {

template <typename T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // unaligned: a .npy header or a Megatron pointer may be odd
  return v;
}

// One read's copy, run under the shard's SIGBUS guard (no destructors, no locks).
struct TokenCopy {
  const std::byte* src;
  uint64_t count;
  DType dtype;
  int64_t* out;
};

template <typename T>
void widen(const TokenCopy& c) {
  for (uint64_t t = 0; t < c.count; ++t)
    c.out[t] = static_cast<int64_t>(load<T>(c.src + t * sizeof(T)));
}

void copy_tokens(void* arg) {
  const auto& c = *static_cast<const TokenCopy*>(arg);
  const bool is_signed = c.dtype.code == DType::kInt;
  switch (c.dtype.bits) {
    case 8:
      return is_signed ? widen<int8_t>(c) : widen<uint8_t>(c);
    case 16:
      return is_signed ? widen<int16_t>(c) : widen<uint16_t>(c);
    case 32:
      return is_signed ? widen<int32_t>(c) : widen<uint32_t>(c);
    default:
      return widen<int64_t>(c);
  }
}

// The split_at scan of a flat shard, run under its guard: records the position after each
// occurrence of `id` in [next, end) into found[], and stops early when found[] is full (the
// caller moves them out and resumes at `next`), so that nothing is allocated under the guard.
struct SplitScan {
  const std::byte* tokens;
  uint64_t next;
  uint64_t end;
  uint32_t id;
  uint64_t* found;
  uint64_t capacity;
  uint64_t count;
};

constexpr uint64_t kScanBlock = 64;
constexpr uint64_t kScanCapacity = 1 << 14;

template <typename T>
bool block_has(const std::byte* p, T id) {
  unsigned any = 0;  // an OR over the block, which the compiler vectorizes
  for (uint64_t i = 0; i < kScanBlock; ++i) any |= load<T>(p + i * sizeof(T)) == id;
  return any != 0;
}

template <typename T>
void scan(SplitScan& s) {
  const T id = static_cast<T>(s.id);
  uint64_t t = s.next;
  while (t < s.end) {
    if (s.end - t >= kScanBlock && !block_has<T>(s.tokens + t * sizeof(T), id)) {
      t += kScanBlock;
      continue;
    }
    const uint64_t stop = std::min(s.end, t + kScanBlock);
    for (; t < stop; ++t) {
      if (load<T>(s.tokens + t * sizeof(T)) != id) continue;
      s.found[s.count++] = t + 1;
      if (s.count == s.capacity) {
        s.next = t + 1;
        return;
      }
    }
  }
  s.next = t;
}

void scan_u16(void* arg) { scan<uint16_t>(*static_cast<SplitScan*>(arg)); }
void scan_u32(void* arg) { scan<uint32_t>(*static_cast<SplitScan*>(arg)); }

// Appends the ends (token counts, from the shard's start) of a flat shard's documents.
void split_documents(const MappedFile& file, const std::byte* tokens, uint64_t num_tokens,
                     DType dtype, uint32_t id, std::vector<uint64_t>& ends) {
  std::vector<uint64_t> found(kScanCapacity);
  SplitScan s{tokens, 0, num_tokens, id, found.data(), kScanCapacity, 0};
  while (s.next < num_tokens) {
    s.count = 0;
    file.copy(dtype.bits == 16 ? scan_u16 : scan_u32, &s);
    ends.insert(ends.end(), found.begin(), found.begin() + static_cast<ptrdiff_t>(s.count));
  }
  if (ends.empty() || ends.back() != num_tokens) ends.push_back(num_tokens);
}

bool is_token_dtype(DType d) {
  return d == DType{DType::kUInt, 16} || d == DType{DType::kUInt, 32};
}

}  // namespace

TokenCorpus::TokenCorpus(const std::vector<std::string>& paths, DType token_dtype,
                         std::optional<uint64_t> split_at, uint64_t vocab_size)
    : vocab_size_(vocab_size) {
  if (!is_token_dtype(token_dtype))
    throw InvalidArgument("TokenCorpus dtype must be \"uint16\" or \"uint32\", got \"" +
                          token_dtype.name() + "\"");
  if (paths.empty()) throw InvalidArgument("TokenCorpus needs at least one shard, got none");
  if (paths.size() > std::numeric_limits<uint32_t>::max())
    throw InvalidArgument("TokenCorpus takes at most 2^32 - 1 shards, got " +
                          std::to_string(paths.size()));
  if (split_at) {
    if (*split_at >> token_dtype.bits != 0)
      throw InvalidArgument("split_at " + std::to_string(*split_at) + " is not a " +
                            token_dtype.name() + " token id");
    if (vocab_size != 0 && *split_at >= vocab_size)
      throw InvalidArgument("split_at " + std::to_string(*split_at) +
                            " is outside the vocabulary (vocab_size " + std::to_string(vocab_size) +
                            ")");
  }

  // Every shard is opened and its document ends found first, then the corpus's arrays are
  // filled at their exact size: no growth, no slack left in them.
  shards_.reserve(paths.size());
  std::vector<std::vector<uint64_t>> ends(paths.size());  // per shard, from its first token
  for (size_t i = 0; i < paths.size(); ++i) {
    Shard& s = shards_.emplace_back();
    s.num_tokens = open_shard(s, paths[i], token_dtype, split_at, ends[i]);
    if (s.num_tokens == 0)
      throw InvalidArgument(
          (s.format == Format::kMegatron ? "Megatron data file " : "token file ") + s.path +
          " holds no tokens");
    if (vocab_size != 0)
      s.id_limit = vocab_size;
    else if (s.dtype.code == DType::kInt)
      s.id_limit = uint64_t{1} << 63;  // negative ids only
  }
  index_documents(ends);
}

TokenCorpus::TokenCorpus(std::shared_ptr<ShardCache> cache, std::vector<RemoteShard> shards,
                         uint64_t vocab_size)
    : cache_(std::move(cache)), vocab_size_(vocab_size) {
  if (!cache_) throw InvalidArgument("TokenCorpus needs a shard cache");
  if (shards.empty()) throw InvalidArgument("TokenCorpus needs at least one shard, got none");
  if (shards.size() != cache_->size())
    throw InvalidArgument("TokenCorpus: " + std::to_string(shards.size()) + " shards, a cache of " +
                          std::to_string(cache_->size()));
  shards_.reserve(shards.size());
  std::vector<std::vector<uint64_t>> ends(shards.size());
  bool known_last = true;
  for (size_t i = 0; i < shards.size(); ++i) {
    RemoteShard& r = shards[i];
    const ShardCache::Shard& c = cache_->shard(static_cast<uint32_t>(i));
    Shard& s = shards_.emplace_back();
    s.path = c.url;
    s.format = r.format;
    s.dtype = r.dtype;
    s.num_tokens = r.num_tokens;
    s.data_offset = r.data_offset;
    const uint64_t bytes = r.num_tokens * r.dtype.bytes();
    if (r.data_offset > c.size || bytes > c.size - r.data_offset)
      throw InvalidArgument("token shard " + c.url + ": " + std::to_string(r.num_tokens) + " " +
                            r.dtype.name() + " tokens after " + std::to_string(r.data_offset) +
                            " bytes do not fit its " + std::to_string(c.size) + " bytes");
    if (r.num_tokens == 0) throw InvalidArgument("token shard " + c.url + " holds no tokens");
    if (r.ends.empty()) r.ends.push_back(r.num_tokens);
    if (!std::is_sorted(r.ends.begin(), r.ends.end()) || r.ends.back() != r.num_tokens)
      throw InvalidArgument("token shard " + c.url +
                            ": its document index does not end at its last token (stale index?)");
    if (vocab_size != 0)
      s.id_limit = vocab_size;
    else if (s.dtype.code == DType::kInt)
      s.id_limit = uint64_t{1} << 63;
    if (!r.last_tokens.empty() && r.last_tokens.size() != r.ends.size())
      throw InvalidArgument("token shard " + c.url + ": " + std::to_string(r.last_tokens.size()) +
                            " last tokens for " + std::to_string(r.ends.size()) + " documents");
    known_last &= !r.last_tokens.empty();
    ends[i] = std::move(r.ends);
  }
  if (known_last) {
    for (RemoteShard& r : shards)
      last_tokens_.insert(last_tokens_.end(), r.last_tokens.begin(), r.last_tokens.end());
  }
  index_documents(ends);
}

void TokenCorpus::index_documents(std::vector<std::vector<uint64_t>>& ends) {
  uint64_t documents = 0;
  for (const auto& e : ends) documents += e.size();
  doc_start_.reserve(documents + 1);
  doc_shard_.reserve(documents);
  doc_start_.push_back(0);
  for (size_t i = 0; i < shards_.size(); ++i) {
    Shard& s = shards_[i];
    s.first_token = doc_start_.back();
    s.first_document = doc_shard_.size();
    for (const uint64_t end : ends[i]) doc_start_.push_back(s.first_token + end);
    doc_shard_.insert(doc_shard_.end(), ends[i].size(), static_cast<uint32_t>(i));
    std::vector<uint64_t>().swap(ends[i]);
  }

  // document_at's table: buckets of 2^k tokens, 2^k >= twice the mean document length, so that
  // there are at most half as many buckets as documents.
  const uint64_t tokens = num_tokens();
  const uint64_t width = std::max<uint64_t>(1, (2 * tokens + documents - 1) / documents);
  bucket_shift_ = static_cast<unsigned>(std::bit_width(width - 1));
  const uint64_t buckets = ((tokens - 1) >> bucket_shift_) + 1;
  buckets_.resize(buckets + 1);
  uint64_t d = 0;
  for (uint64_t b = 0; b < buckets; ++b) {
    const uint64_t token = b << bucket_shift_;
    while (doc_start_[d + 1] <= token) ++d;
    buckets_[b] = d;
  }
  buckets_[buckets] = documents - 1;
}

TokenCorpus::~TokenCorpus() = default;

uint64_t TokenCorpus::open_shard(Shard& s, const std::string& given, DType token_dtype,
                                 std::optional<uint64_t> split_at, std::vector<uint64_t>& ends) {
  if (const auto megatron = megatron_paths(given)) {
    s.path = megatron->bin;
    s.format = Format::kMegatron;
    s.file = std::make_unique<MappedFile>(megatron->bin, "Megatron data file");
    MegatronIndex index;
    {
      const MappedFile idx(megatron->idx, "Megatron index");  // not needed after this
      index = read_megatron_index(idx, s.file->bytes().size(), megatron->bin);
    }
    s.dtype = index.token_dtype;
    s.tokens = s.file->bytes().data() + index.data_offset;
    ends = std::move(index.document_ends);
    return index.num_tokens;
  }
  s.path = given;
  s.file = std::make_unique<MappedFile>(given, "token file");
  const std::span<const std::byte> bytes = s.file->bytes();
  const TokenFileLayout layout = parse_token_file(bytes, bytes.size(), token_dtype, given);
  s.format = layout.format == TokenFileLayout::Format::kLlmc  ? Format::kLlmc
             : layout.format == TokenFileLayout::Format::kNpy ? Format::kNpy
                                                              : Format::kRaw;
  s.dtype = token_dtype;
  s.tokens = bytes.data() + layout.data_offset;
  if (layout.num_tokens > 0) {
    if (split_at)
      split_documents(*s.file, s.tokens, layout.num_tokens, token_dtype,
                      static_cast<uint32_t>(*split_at), ends);
    else
      ends.push_back(layout.num_tokens);
  }
  return layout.num_tokens;
}

void TokenCorpus::read(uint64_t d, uint64_t offset, uint64_t count, int64_t* out) const {
  const uint32_t shard = doc_shard_[d];
  const Shard& s = shards_[shard];
  const uint64_t first = doc_start_[d] + offset - s.first_token;
  if (cache_) {
    const MappedFile& file = cache_->read(shard);
    TokenCopy c{file.bytes().data() + s.data_offset + first * s.dtype.bytes(), count, s.dtype, out};
    file.copy(copy_tokens, &c);
  } else {
    TokenCopy c{s.tokens + first * s.dtype.bytes(), count, s.dtype, out};
    s.file->copy(copy_tokens, &c);
  }
  const uint64_t limit = s.id_limit;  // a local: `out` could alias the shard's fields
  if (limit == 0) return;
  const uint64_t t = first_bad_id(out, count, limit);
  if (t == count) return;
  throw_bad_id((s.format == Format::kMegatron ? "Megatron data file " : "token file ") + s.path +
                   ": document " + std::to_string(d) + " (document " +
                   std::to_string(d - s.first_document) + " of the file), token " +
                   std::to_string(offset + t) + ": ",
               out[t], vocab_size_);
}

std::string TokenCorpus::path(uint64_t d) const { return shards_[doc_shard_[d]].path; }

int64_t TokenCorpus::last_token(uint64_t d) const {
  if (!last_tokens_.empty()) return last_tokens_[d];
  return DocumentSet::last_token(d);
}

uint64_t TokenCorpus::document_at(uint64_t token) const {
  // The holder lies in [buckets_[b], buckets_[b + 1]]: the last document there that starts at or
  // before `token` (an empty document starts where the next one does, so it is never the last).
  const uint64_t b = token >> bucket_shift_;
  const auto begin = doc_start_.begin() + static_cast<ptrdiff_t>(buckets_[b]) + 1;
  const auto end = doc_start_.begin() + static_cast<ptrdiff_t>(buckets_[b + 1]) + 1;
  return static_cast<uint64_t>(std::upper_bound(begin, end, token) - doc_start_.begin()) - 1;
}

uint64_t TokenCorpus::num_shards() const { return shards_.size(); }

const std::string& TokenCorpus::shard_path(uint64_t s) const { return shards_[s].path; }

TokenCorpus::Format TokenCorpus::shard_format(uint64_t s) const { return shards_[s].format; }

uint64_t TokenCorpus::shard_first_document(uint64_t s) const {
  return s == shards_.size() ? num_documents() : shards_[s].first_document;
}

}  // namespace stoker
