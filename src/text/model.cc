#include "text/model.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <numeric>
#include <queue>

#include "stoker/errors.h"
#include "text/unicode.h"

namespace stoker::text {

namespace {
std::atomic<uint64_t> next_serial{1};
}  // namespace

Model::Model(Vocab vocab) : vocab_(std::move(vocab)), serial_(next_serial++) {
  int32_t max_id = -1;
  for (const auto& [token, id] : vocab_) max_id = std::max(max_id, id);
  tokens_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : vocab_) tokens_[static_cast<size_t>(id)] = token;
}

std::optional<int32_t> Model::token_to_id(std::string_view token) const {
  auto it = vocab_.find(token);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* Model::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) return nullptr;
  const std::string& t = tokens_[static_cast<size_t>(id)];
  if (t.empty() && !vocab_.contains(t)) return nullptr;
  return &t;
}

// ---- BPE ----------------------------------------------------------------------------------------

namespace {
// A thread's cache of words' ids, for one model at a time: bounded (cleared when full), never
// shared between threads, so no lock.
struct WordCache {
  static constexpr size_t kMaxEntries = 1 << 14;
  static constexpr size_t kMaxWordBytes = 128;
  struct Entry {
    std::vector<int32_t> ids;
    std::vector<uint32_t> lengths;  // each id's bytes of the word
  };
  uint64_t owner = 0;
  // encode()'s ids, and apart (so that encode()'s entries stay as small) encode_with_offsets'.
  std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> ids;
  std::unordered_map<std::string, Entry, StringHash, std::equal_to<>> spans;
};
thread_local WordCache word_cache;

// The calling thread's cache, emptied when it last served another model.
WordCache& cache_of(uint64_t serial) {
  WordCache& cache = word_cache;
  if (cache.owner != serial) {
    cache.ids.clear();
    cache.spans.clear();
    cache.owner = serial;
  }
  return cache;
}

// The ids of a short word from the thread's cache, or made by `compute(ids)` and kept.
template <class Compute>
void cached_ids(uint64_t serial, std::string_view word, std::vector<int32_t>& out,
                Compute compute) {
  WordCache& cache = cache_of(serial);
  auto it = cache.ids.find(word);
  if (it == cache.ids.end()) {
    std::vector<int32_t> ids;
    compute(ids);
    if (cache.ids.size() >= WordCache::kMaxEntries) cache.ids.clear();
    it = cache.ids.emplace(std::string(word), std::move(ids)).first;
  }
  out.insert(out.end(), it->second.begin(), it->second.end());
}

std::string byte_token(uint8_t b) {
  char name[8];
  std::snprintf(name, sizeof name, "<0x%02X>", b);
  return name;
}

// Spans of consecutive lengths from the piece's start.
void append_spans(const std::vector<uint32_t>& lengths, std::vector<TokenSpan>& spans) {
  uint32_t at = 0;
  for (uint32_t n : lengths) {
    spans.push_back({at, at + n});
    at += n;
  }
}
}  // namespace

Bpe::Bpe(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges,
         BpeOptions options, const std::string& origin)
    : Model(std::move(vocab)), options_(std::move(options)) {
  const size_t prefix = options_.continuing_subword_prefix.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [a, b] = merges[rank];
    auto ia = token_to_id(a), ib = token_to_id(b);
    if (!ia || !ib) {
      throw InvalidArgument(origin + ": BPE merge \"" + a + " " + b +
                            "\" names a token outside the vocabulary");
    }
    std::string joined = a + (b.size() >= prefix ? b.substr(prefix) : b);
    auto in = token_to_id(joined);
    if (!in) {
      throw InvalidArgument(origin + ": BPE merge \"" + a + " " + b + "\" makes \"" + joined +
                            "\", which is not in the vocabulary");
    }
    merges_[key(*ia, *ib)] = Merge{static_cast<uint32_t>(rank), *in};  // a later duplicate wins
  }
  if (options_.unk_token) {
    unk_id_ = token_to_id(*options_.unk_token);
    if (!unk_id_) {
      throw InvalidArgument(origin + ": BPE unk_token \"" + *options_.unk_token +
                            "\" is not in the vocabulary");
    }
  }
  for (const auto& [token, id] : vocab_) {
    size_t end = 0;
    if (!token.empty() && token.size() <= 4 && valid_utf8(token)) {
      const char32_t c = next_code_point(token, end);
      if (end == token.size()) char_ids_.emplace(c, id);
    }
  }
  for (int b = 0; b < 256; ++b) {
    auto id = options_.byte_fallback ? token_to_id(byte_token(static_cast<uint8_t>(b)))
                                     : std::nullopt;
    byte_ids_[b] = id ? *id : -1;
  }
}

std::unique_ptr<Bpe> Bpe::from_ranks(Vocab vocab, BpeOptions options, const std::string& origin) {
  auto bpe =
      std::make_unique<Bpe>(std::move(vocab), std::vector<std::pair<std::string, std::string>>{},
                            std::move(options), origin);
  for (const auto& [token, id] : bpe->vocab_) {
    size_t split = 0;
    next_code_point(token, split);
    while (split < token.size()) {
      auto left = bpe->token_to_id(std::string_view(token).substr(0, split));
      auto right = bpe->token_to_id(std::string_view(token).substr(split));
      if (left && right) bpe->merges_[key(*left, *right)] = Merge{static_cast<uint32_t>(id), id};
      next_code_point(token, split);
    }
  }
  return bpe;
}

void Bpe::merge(std::vector<int32_t>& ids, std::vector<uint32_t>* lengths) const {
  if (lengths) {
    merge_symbols<true>(ids, lengths);
  } else {
    merge_symbols<false>(ids, nullptr);
  }
}

template <bool kLengths>
void Bpe::merge_symbols(std::vector<int32_t>& ids, std::vector<uint32_t>* lengths) const {
  if (ids.size() < 2) return;
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    uint32_t length;
    bool removed;
  };
  struct Candidate {
    uint32_t rank;
    int32_t pos;
    int32_t id;
    int32_t left, right;  // the pair's ids when it was queued
    bool operator<(const Candidate& o) const {  // the heap's top: lowest rank, then leftmost
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const int32_t n = static_cast<int32_t>(ids.size());
  std::vector<Symbol> sym(ids.size());
  std::vector<Candidate> heap;
  heap.reserve(ids.size());
  for (int32_t i = 0; i < n; ++i) {
    sym[i] = Symbol{ids[i], i - 1, i + 1 < n ? i + 1 : -1, kLengths ? (*lengths)[i] : 0u, false};
    if (i + 1 < n) {
      auto it = merges_.find(key(ids[i], ids[i + 1]));
      if (it != merges_.end()) {
        heap.push_back(Candidate{it->second.rank, i, it->second.id, ids[i], ids[i + 1]});
      }
    }
  }
  std::priority_queue<Candidate> queue(std::less<Candidate>{}, std::move(heap));
  while (!queue.empty()) {
    Candidate top = queue.top();
    queue.pop();
    Symbol& left = sym[top.pos];
    if (left.removed || left.next < 0) continue;
    Symbol& right = sym[left.next];
    if (left.id != top.left || right.id != top.right) {  // else the same pair: the same merge
      auto it = merges_.find(key(left.id, right.id));
      if (it == merges_.end() || it->second.id != top.id) continue;  // a stale entry
    }
    left.id = top.id;
    if constexpr (kLengths) left.length += right.length;
    right.removed = true;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = top.pos;
    if (left.prev >= 0) {
      const int32_t before = sym[left.prev].id;
      auto m = merges_.find(key(before, left.id));
      if (m != merges_.end()) {
        queue.push(Candidate{m->second.rank, left.prev, m->second.id, before, left.id});
      }
    }
    if (left.next >= 0) {
      const int32_t after = sym[left.next].id;
      auto m = merges_.find(key(left.id, after));
      if (m != merges_.end()) {
        queue.push(Candidate{m->second.rank, top.pos, m->second.id, left.id, after});
      }
    }
  }
  ids.clear();
  if constexpr (kLengths) lengths->clear();
  for (int32_t i = 0; i >= 0; i = sym[i].next) {
    ids.push_back(sym[i].id);
    if constexpr (kLengths) lengths->push_back(sym[i].length);
  }
}

void Bpe::encode(std::string_view word, std::vector<int32_t>& out,
                 std::vector<TokenSpan>* spans) const {
  const std::unordered_set<uint64_t>* adjacent =
      options_.whole_texts && word.size() > WordCache::kMaxWordBytes ? adjacent_pairs() : nullptr;
  if (!adjacent) return encode_whole(word, out, spans);
  // Cut between characters a and b where each is a token (so each is one symbol: no run of
  // unknowns or byte fallback spans the cut) and no token holds a then b. A merge's token is its
  // two tokens joined (no prefix or suffix here), so whatever symbols end and start at the cut,
  // their merge would be a token holding a then b: no merge crosses the cut. The segments' symbols
  // are the whole word's there, and their merges, each segment's lowest rank (then leftmost)
  // first, are the whole word's: the same ids.
  auto encode_segment = [&](size_t begin, size_t end) {
    const size_t before = spans ? spans->size() : 0;
    encode_whole(word.substr(begin, end - begin), out, spans);
    if (!spans) return;
    for (size_t k = before; k < spans->size(); ++k) {
      (*spans)[k].begin += static_cast<uint32_t>(begin);
      (*spans)[k].end += static_cast<uint32_t>(begin);
    }
  };
  size_t segment = 0, i = 0;
  char32_t prev = next_code_point(word, i);
  while (i < word.size()) {
    const size_t start = i;
    const char32_t c = next_code_point(word, i);
    if (!adjacent->contains(static_cast<uint64_t>(prev) << 32 | c) && char_ids_.contains(prev) &&
        char_ids_.contains(c)) {
      encode_segment(segment, start);
      segment = start;
    }
    prev = c;
  }
  encode_segment(segment, word.size());
}

const std::unordered_set<uint64_t>* Bpe::adjacent_pairs() const {
  std::call_once(adjacent_once_, [this] {
    if (!options_.whole_texts || !options_.continuing_subword_prefix.empty() ||
        !options_.end_of_word_suffix.empty() || options_.ignore_merges) {
      return;
    }
    for (const auto& [token, id] : vocab_) {
      if (!valid_utf8(token)) {  // its bytes are not all in code points: cut nothing
        adjacent_.clear();
        return;
      }
      size_t i = 0;
      char32_t prev = token.empty() ? 0 : next_code_point(token, i);
      while (i < token.size()) {
        const char32_t c = next_code_point(token, i);
        adjacent_.insert(static_cast<uint64_t>(prev) << 32 | c);
        prev = c;
      }
    }
    cuttable_ = true;
  });
  return cuttable_ ? &adjacent_ : nullptr;
}

void Bpe::encode_whole(std::string_view word, std::vector<int32_t>& out,
                       std::vector<TokenSpan>* spans) const {
  if (word.empty()) return;
  if (word.size() > WordCache::kMaxWordBytes) {
    WordCache::Entry e;
    encode_uncached(word, e.ids, spans ? &e.lengths : nullptr);
    out.insert(out.end(), e.ids.begin(), e.ids.end());
    if (spans) append_spans(e.lengths, *spans);
    return;
  }
  if (spans) {
    WordCache& cache = cache_of(serial_);
    auto it = cache.spans.find(word);
    if (it == cache.spans.end()) {
      WordCache::Entry e;
      encode_uncached(word, e.ids, &e.lengths);
      if (cache.spans.size() >= WordCache::kMaxEntries) cache.spans.clear();
      it = cache.spans.emplace(std::string(word), std::move(e)).first;
    }
    out.insert(out.end(), it->second.ids.begin(), it->second.ids.end());
    append_spans(it->second.lengths, *spans);
    return;
  }
  cached_ids(serial_, word, out,
             [&](std::vector<int32_t>& ids) { encode_uncached(word, ids, nullptr); });
}

void Bpe::encode_uncached(std::string_view word, std::vector<int32_t>& ids,
                          std::vector<uint32_t>* lengths) const {
  if (lengths) {
    encode_word<true>(word, ids, lengths);
  } else {
    encode_word<false>(word, ids, nullptr);
  }
}

// encode_uncached(), compiled apart for encode() (kLengths false: no lengths kept at all).
template <bool kLengths>
void Bpe::encode_word(std::string_view word, std::vector<int32_t>& ids,
                      std::vector<uint32_t>* lengths) const {
  auto add = [&](int32_t id, uint32_t length) {
    ids.push_back(id);
    if constexpr (kLengths) lengths->push_back(length);
  };
  if (options_.ignore_merges) {
    if (auto id = token_to_id(word)) {
      add(*id, static_cast<uint32_t>(word.size()));
      return;
    }
  }
  int32_t pending_unk = -1;  // the unknown token not yet written (fuse_unk: one for a run)
  uint32_t pending_length = 0;
  std::string s;
  for (size_t i = 0; i < word.size();) {
    size_t start = i;
    const char32_t code_point = next_code_point(word, i);
    std::string_view c = word.substr(start, i - start);
    const bool affixed = (start > 0 && !options_.continuing_subword_prefix.empty()) ||
                         (i == word.size() && !options_.end_of_word_suffix.empty());
    s.clear();
    if (start > 0) s += options_.continuing_subword_prefix;
    s += c;
    if (i == word.size()) s += options_.end_of_word_suffix;
    const auto length = static_cast<uint32_t>(c.size());
    std::optional<int32_t> id;
    if (affixed) {
      id = token_to_id(s);
    } else if (auto it = char_ids_.find(code_point); it != char_ids_.end()) {
      id = it->second;  // s is the character alone
    }
    if (id) {
      if (pending_unk >= 0) add(pending_unk, pending_length);
      pending_unk = -1;
      add(*id, length);
      continue;
    }
    if (options_.byte_fallback) {
      bool all = std::all_of(s.begin(), s.end(),
                             [&](char b) { return byte_ids_[static_cast<uint8_t>(b)] >= 0; });
      if (all) {  // as `tokenizers`: a pending unknown stays pending across the bytes, one each
        for (char b : s) add(byte_ids_[static_cast<uint8_t>(b)], 1);
        continue;
      }
    }
    if (unk_id_) {
      if (pending_unk >= 0 && options_.fuse_unk) {
        pending_length += length;
        continue;
      }
      if (pending_unk >= 0) add(pending_unk, pending_length);
      pending_unk = *unk_id_;
      pending_length = length;
    }
  }
  if (pending_unk >= 0) add(pending_unk, pending_length);
  if constexpr (kLengths) {
    merge_symbols<true>(ids, lengths);
  } else {
    merge_symbols<false>(ids, nullptr);
  }
}

// ---- WordPiece ----------------------------------------------------------------------------------

WordPiece::WordPiece(Vocab vocab, const std::string& unk_token, std::string prefix,
                     size_t max_chars, const std::string& origin)
    : Model(std::move(vocab)), prefix_(std::move(prefix)), max_chars_(max_chars) {
  auto unk = token_to_id(unk_token);
  if (!unk) {
    throw InvalidArgument(origin + ": WordPiece unk_token \"" + unk_token +
                          "\" is not in the vocabulary");
  }
  unk_id_ = *unk;
}

void WordPiece::encode(std::string_view word, std::vector<int32_t>& out,
                       std::vector<TokenSpan>* spans) const {
  const TokenSpan whole{0, static_cast<uint32_t>(word.size())};
  size_t chars = 0;
  for (size_t i = 0; i < word.size(); ++chars) next_code_point(word, i);
  if (chars > max_chars_) {
    out.push_back(unk_id_);
    if (spans) spans->push_back(whole);
    return;
  }
  std::vector<int32_t> pieces;
  std::vector<TokenSpan> piece_spans;
  std::string candidate;
  for (size_t start = 0; start < word.size();) {
    size_t end = word.size();
    std::optional<int32_t> found;
    while (start < end) {
      candidate.clear();
      if (start > 0) candidate += prefix_;
      candidate += word.substr(start, end - start);
      if ((found = token_to_id(candidate))) break;
      do --end;  // back one character
      while (end > start && (static_cast<unsigned char>(word[end]) & 0xC0) == 0x80);
    }
    if (!found) {
      out.push_back(unk_id_);
      if (spans) spans->push_back(whole);
      return;
    }
    pieces.push_back(*found);
    if (spans) piece_spans.push_back({static_cast<uint32_t>(start), static_cast<uint32_t>(end)});
    start = end;
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
  if (spans) spans->insert(spans->end(), piece_spans.begin(), piece_spans.end());
}

// ---- Unigram ------------------------------------------------------------------------------------

namespace {
Vocab unigram_vocab(const std::vector<std::pair<std::string, double>>& pieces) {
  Vocab v;
  for (size_t i = 0; i < pieces.size(); ++i) v.emplace(pieces[i].first, static_cast<int32_t>(i));
  return v;
}
}  // namespace

PieceTrie::PieceTrie(const std::vector<std::pair<std::string, double>>& pieces) {
  std::vector<uint32_t> order(pieces.size());
  std::iota(order.begin(), order.end(), 0u);
  // By bytes (std::string compares them unsigned), equal pieces in their order: a piece sorts
  // before those it is a prefix of, so a node's own piece comes first in its range.
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return pieces[a].first < pieces[b].first; });
  auto text = [&](size_t k) -> const std::string& { return pieces[order[k]].first; };
  struct Range {
    uint32_t node;
    size_t begin, end, depth;  // the pieces order[begin, end) share the node's depth bytes
  };
  nodes_.emplace_back();
  labels_.push_back(0);
  std::vector<Range> todo{{root(), 0, order.size(), 0}};
  while (!todo.empty()) {
    const Range r = todo.back();
    todo.pop_back();
    size_t k = r.begin;
    if (k < r.end && text(k).size() == r.depth) {
      nodes_[r.node].piece = static_cast<int32_t>(order[k]);
      while (k < r.end && text(k).size() == r.depth) ++k;  // its twins
    }
    nodes_[r.node].first = static_cast<uint32_t>(nodes_.size());
    while (k < r.end) {
      const char b = text(k)[r.depth];
      size_t end = k;
      while (end < r.end && text(end)[r.depth] == b) ++end;
      todo.push_back({static_cast<uint32_t>(nodes_.size()), k, end, r.depth + 1});
      nodes_.emplace_back();
      labels_.push_back(static_cast<unsigned char>(b));
      ++nodes_[r.node].count;
      k = end;
    }
  }
}

int64_t PieceTrie::child(uint32_t node, unsigned char b) const {
  const auto first = labels_.begin() + nodes_[node].first;
  const auto last = first + nodes_[node].count;
  const auto it = std::lower_bound(first, last, b);
  return it != last && *it == b ? it - labels_.begin() : kNone;
}

Unigram::Unigram(std::vector<std::pair<std::string, double>> pieces,
                 std::optional<int32_t> unk_id, bool byte_fallback, const std::string& origin)
    : Model(unigram_vocab(pieces)), unk_id_(unk_id), byte_fallback_(byte_fallback),
      min_score_(std::numeric_limits<double>::infinity()), trie_(pieces), origin_(origin) {
  if (unk_id_ && (*unk_id_ < 0 || static_cast<size_t>(*unk_id_) >= pieces.size())) {
    throw InvalidArgument(origin + ": Unigram unk_id " + std::to_string(*unk_id_) +
                          " is outside the vocabulary");
  }
  for (const auto& [piece, score] : pieces) {
    scores_.push_back(score);
    min_score_ = std::min(min_score_, score);
  }
}

void Unigram::encode(std::string_view s, std::vector<int32_t>& out,
                     std::vector<TokenSpan>* spans) const {
  if (s.empty()) return;
  if (spans || s.size() > WordCache::kMaxWordBytes) return encode_uncached(s, out, spans);
  cached_ids(serial_, s, out, [&](std::vector<int32_t>& ids) { encode_uncached(s, ids, nullptr); });
}

void Unigram::encode_uncached(std::string_view s, std::vector<int32_t>& out,
                              std::vector<TokenSpan>* spans) const {
  struct Node {
    int32_t id = -1;
    double score = 0;
    int64_t start = -1;  // -1: no path ends here yet
  };
  const double unk_score = min_score_ - 10.0;
  std::vector<Node> best(s.size() + 1);
  for (size_t at = 0; at < s.size();) {
    const double here = best[at].score;
    const size_t char_len = std::min(utf8_length(static_cast<unsigned char>(s[at])), s.size() - at);
    bool single = false;
    // The pieces s[at, end) for each character boundary end, down the trie byte by byte.
    uint32_t node = PieceTrie::root();
    for (size_t end = at; end < s.size();) {
      const int64_t next = trie_.child(node, static_cast<unsigned char>(s[end]));
      if (next == PieceTrie::kNone) break;
      node = static_cast<uint32_t>(next);
      ++end;
      const int32_t id = trie_.piece(node);
      if (id < 0 || (end < s.size() && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80)) {
        continue;  // no piece, or one that ends inside a character
      }
      Node& target = best[end];
      double candidate = scores_[static_cast<size_t>(id)] + here;
      if (target.start < 0 || candidate > target.score) {
        target = Node{id, candidate, static_cast<int64_t>(at)};
      }
      if (end - at == char_len) single = true;
    }
    if (!single) {
      if (!unk_id_) {
        throw InvalidArgument(origin_ + ": Unigram has no unk_id for a character outside its "
                                        "vocabulary");
      }
      Node& target = best[at + char_len];
      double candidate = unk_score + here;
      if (target.start < 0 || candidate > target.score) {
        target = Node{*unk_id_, candidate, static_cast<int64_t>(at)};
      }
    }
    at += char_len;
  }
  // Back from the end: the best path's pieces, consecutive unknowns fused into one string.
  std::vector<std::string_view> pieces;
  size_t end = s.size(), unk_end = 0;
  bool in_unk = false;
  while (end > 0) {
    const Node& node = best[end];
    const size_t start = static_cast<size_t>(node.start);
    if (unk_id_ && node.id == *unk_id_) {  // fuse_unk is always on for Unigram
      if (!in_unk) unk_end = end;
      in_unk = true;
    } else {
      if (in_unk) pieces.push_back(s.substr(end, unk_end - end));
      in_unk = false;
      pieces.push_back(s.substr(start, end - start));
    }
    end = start;
  }
  if (in_unk) pieces.push_back(s.substr(0, unk_end));
  uint32_t at = 0;
  for (auto p = pieces.rbegin(); p != pieces.rend(); ++p) {
    const TokenSpan span{at, at + static_cast<uint32_t>(p->size())};  // byte fallback: each id
    at = span.end;
    const size_t before = out.size();
    auto spanned = [&] {
      if (spans) spans->insert(spans->end(), out.size() - before, span);
    };
    if (auto id = token_to_id(*p)) {
      out.push_back(*id);
      spanned();
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> bytes;
      for (char b : *p) {
        auto id = token_to_id(byte_token(static_cast<uint8_t>(b)));
        if (!id) break;
        bytes.push_back(*id);
      }
      if (bytes.size() == p->size()) {
        out.insert(out.end(), bytes.begin(), bytes.end());
        spanned();
        continue;
      }
    }
    out.push_back(*unk_id_);
    spanned();
  }
}

}  // namespace stoker::text
