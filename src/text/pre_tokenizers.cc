// The pre-tokenizers of tokenizer.json (`tokenizers`' pre_tokenizers/), and the split behaviours
// they share (NormalizedString::split).
#include <algorithm>

#include "stoker/errors.h"
#include "text/components.h"
#include "text/regex.h"
#include "text/unicode.h"

namespace stoker::text {
namespace {

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

Behavior parse_behavior(const std::string& name, const std::string& origin) {
  if (name == "Removed") return Behavior::kRemoved;
  if (name == "Isolated") return Behavior::kIsolated;
  if (name == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return Behavior::kMergedWithNext;
  if (name == "Contiguous") return Behavior::kContiguous;
  throw InvalidArgument(origin + ": split behavior " + name + " is not supported");
}

struct Span {
  size_t begin, end;
  bool match;  // a delimiter (removed by kRemoved)
};

// The spans of `s` given its matches' ranges: gaps and matches alternating, covering it all.
std::vector<Span> spans_of(size_t size, const std::vector<std::pair<size_t, size_t>>& matches,
                           bool invert) {
  std::vector<Span> out;
  size_t prev = 0;
  for (auto [b, e] : matches) {
    if (prev != b) out.push_back({prev, b, invert});
    out.push_back({b, e, !invert});
    prev = e;
  }
  if (prev != size) out.push_back({prev, size, invert});
  return out;
}

// Appends the bytes [begin, end) of a piece, with their alignment where it keeps one (built in
// place: no Piece is moved).
void push_sub_piece(const Piece& piece, size_t begin, size_t end, std::vector<Piece>& out) {
  Piece& sub = out.emplace_back();
  sub.text = piece.text.substr(begin, end - begin);
  sub.at_origin = piece.at_origin && begin == 0;
  if (!piece.align.empty()) {
    sub.align.assign(piece.align.begin() + static_cast<ptrdiff_t>(begin),
                     piece.align.begin() + static_cast<ptrdiff_t>(end));
    sub.origin = piece.align[begin].begin;
  }
}

// NormalizedString::split: the pieces `s` splits into by the delimiter spans and the behaviour.
void split_piece(const Piece& piece, std::vector<Span> spans, Behavior behavior,
                 std::vector<Piece>& out) {
  std::vector<Span> kept;
  switch (behavior) {
    case Behavior::kRemoved:
      kept = std::move(spans);
      break;
    case Behavior::kIsolated:
      kept = std::move(spans);
      for (auto& s : kept) s.match = false;
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const auto& s : spans) {
        if (s.match == previous && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back({s.begin, s.end, false});
        }
        previous = s.match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const auto& s : spans) {
        if (s.match && !previous && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back({s.begin, s.end, false});
        }
        previous = s.match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (auto s = spans.rbegin(); s != spans.rend(); ++s) {
        if (s->match && !previous && !kept.empty()) {
          kept.back().begin = s->begin;
        } else {
          kept.push_back({s->begin, s->end, false});
        }
        previous = s->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  if (out.capacity() < out.size() + kept.size()) {  // one growth for the piece's splits
    out.reserve(std::max(out.capacity() * 2, out.size() + kept.size()));
  }
  for (const auto& s : kept) {
    if (s.match || s.begin == s.end) continue;
    push_sub_piece(piece, s.begin, s.end, out);
  }
}

// Every character for which `is_delimiter` holds is a match of its own.
template <class Pred>
std::vector<std::pair<size_t, size_t>> char_matches(const std::string& s, Pred is_delimiter) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    if (is_delimiter(next_code_point(s, i))) out.emplace_back(start, i);
  }
  return out;
}

template <class Fn>
void each_piece(std::vector<Piece>& pieces, Fn fn) {
  std::vector<Piece> out;
  out.reserve(pieces.size());
  for (const auto& p : pieces) fn(p, out);
  pieces = std::move(out);
}

bool is_bert_punctuation(char32_t c) {
  return (c < 0x80 && ((c >= '!' && c <= '/') || (c >= ':' && c <= '@') ||
                       (c >= '[' && c <= '`') || (c >= '{' && c <= '~'))) ||
         is_punctuation(c);
}

const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Each byte as GPT-2's character for it; every byte of that aligned to the byte's alignment.
void map_bytes(Piece& p) {
  std::string mapped;
  mapped.reserve(p.text.size() * 2);
  if (p.align.empty()) {
    for (char b : p.text) mapped += byte_to_unicode(static_cast<uint8_t>(b));
    p.text = std::move(mapped);
    return;
  }
  Alignment align;
  align.reserve(p.text.size() * 2);
  for (size_t k = 0; k < p.text.size(); ++k) {
    const std::string& c = byte_to_unicode(static_cast<uint8_t>(p.text[k]));
    mapped += c;
    align.insert(align.end(), c.size(), p.align[k]);
  }
  p.text = std::move(mapped);
  p.align = std::move(align);
}

class ByteLevel : public PreTokenizer {
 public:
  ByteLevel(bool add_prefix_space, bool use_regex, const std::string& origin)
      : add_prefix_space_(add_prefix_space),
        regex_(use_regex ? std::make_unique<Regex>(kGpt2Pattern, origin + ": ByteLevel")
                         : nullptr) {}
  void split(std::vector<Piece>& pieces) const override {
    each_piece(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      Piece q = p;
      if (add_prefix_space_ && (p.text.empty() || p.text[0] != ' ')) {
        q.text.insert(0, 1, ' ');
        if (!q.align.empty()) q.align.insert(q.align.begin(), q.align.front());
      }
      size_t first = out.size();
      if (regex_) {
        split_piece(q, spans_of(q.text.size(), regex_->find_all(q.text), false),
                    Behavior::kIsolated, out);
      } else if (!q.text.empty()) {
        out.push_back(std::move(q));
      }
      for (size_t i = first; i < out.size(); ++i) map_bytes(out[i]);
    });
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;
};

class Split : public PreTokenizer {
 public:
  Split(std::unique_ptr<Regex> regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void split(std::vector<Piece>& pieces) const override {
    each_piece(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      split_piece(p, spans_of(p.text.size(), regex_->find_all(p.text), invert_), behavior_, out);
    });
  }

 private:
  std::unique_ptr<Regex> regex_;
  Behavior behavior_;
  bool invert_;
};

enum class Prepend { kAlways, kFirst, kNever };

class Metaspace : public PreTokenizer {
 public:
  Metaspace(std::string replacement, Prepend prepend, bool split)
      : replacement_(std::move(replacement)), prepend_(prepend), split_(split) {}
  void split(std::vector<Piece>& pieces) const override {
    each_piece(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      Piece q{"", p.at_origin, p.origin};
      const bool aligned = !p.align.empty();
      for (size_t k = 0; k < p.text.size(); ++k) {
        const bool space = p.text[k] == ' ';
        if (space) {
          q.text += replacement_;
        } else {
          q.text += p.text[k];
        }
        if (aligned) q.align.insert(q.align.end(), space ? replacement_.size() : 1, p.align[k]);
      }
      bool starts = q.text.compare(0, replacement_.size(), replacement_) == 0;
      if (!starts && !q.text.empty() &&
          (prepend_ == Prepend::kAlways || (prepend_ == Prepend::kFirst && q.at_origin))) {
        q.text.insert(0, replacement_);
        if (aligned) q.align.insert(q.align.begin(), replacement_.size(), q.align.front());
      }
      if (!split_) {
        if (!q.text.empty()) out.push_back(std::move(q));
        return;
      }
      std::vector<std::pair<size_t, size_t>> matches;
      for (size_t at = 0; (at = q.text.find(replacement_, at)) != std::string::npos;
           at += replacement_.size()) {
        matches.emplace_back(at, at + replacement_.size());
      }
      split_piece(q, spans_of(q.text.size(), matches, false), Behavior::kMergedWithNext, out);
    });
  }

 private:
  std::string replacement_;
  Prepend prepend_;
  bool split_;
};

// Splits on characters: whitespace (WhitespaceSplit), punctuation, digits.
template <class Pred>
class CharSplit : public PreTokenizer {
 public:
  CharSplit(Pred pred, Behavior behavior) : pred_(pred), behavior_(behavior) {}
  void split(std::vector<Piece>& pieces) const override {
    each_piece(pieces, [&](const Piece& p, std::vector<Piece>& out) {
      split_piece(p, spans_of(p.text.size(), char_matches(p.text, pred_), false), behavior_, out);
    });
  }

 private:
  Pred pred_;
  Behavior behavior_;
};
template <class Pred>
std::unique_ptr<PreTokenizer> char_split(Pred pred, Behavior behavior) {
  return std::make_unique<CharSplit<Pred>>(pred, behavior);
}

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void split(std::vector<Piece>& pieces) const override {
    for (const auto& s : steps_) s->split(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

}  // namespace

std::unique_ptr<PreTokenizer> parse_pre_tokenizer(simdjson::dom::element e,
                                                  const std::string& origin) {
  if (e.is_null()) return nullptr;
  const std::string type = json::type_of(e, origin, "pre-tokenizer");
  if (type == "ByteLevel") {
    return std::make_unique<ByteLevel>(json::bool_or(e, "add_prefix_space", true),
                                       json::bool_or(e, "use_regex", true), origin);
  }
  if (type == "Split") {
    simdjson::dom::element pattern;
    if (e["pattern"].get(pattern) != simdjson::SUCCESS) {
      throw InvalidArgument(origin + ": pre-tokenizer Split without a pattern");
    }
    std::string regex = json::has(pattern, "Regex")
                            ? json::string_or(pattern, "Regex", "")
                            : Regex::escape(json::string_or(pattern, "String", ""));
    return std::make_unique<Split>(std::make_unique<Regex>(regex, origin + ": pre-tokenizer Split"),
                                   parse_behavior(json::string_or(e, "behavior", ""), origin),
                                   json::bool_or(e, "invert", false));
  }
  if (type == "Metaspace") {
    Prepend prepend = json::bool_or(e, "add_prefix_space", true) ? Prepend::kAlways
                                                                 : Prepend::kNever;
    if (json::has(e, "prepend_scheme")) {
      std::string scheme = json::string_or(e, "prepend_scheme", "");
      if (scheme == "always") {
        prepend = Prepend::kAlways;
      } else if (scheme == "first") {
        prepend = Prepend::kFirst;
      } else if (scheme == "never") {
        prepend = Prepend::kNever;
      } else {
        throw InvalidArgument(origin + ": Metaspace prepend_scheme " + scheme +
                              " is not supported");
      }
    }
    return std::make_unique<Metaspace>(json::string_or(e, "replacement", "\xE2\x96\x81"), prepend,
                                       json::bool_or(e, "split", true));
  }
  if (type == "Whitespace") {
    // Rust's \w and \s: Alphabetic, marks, decimal digits, connectors, joiners; White_Space.
    const char* w = R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])";
    const char* nw = R"([^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}\p{White_Space}])";
    return std::make_unique<Split>(
        std::make_unique<Regex>(std::string(w) + "+|" + nw + "+", origin + ": Whitespace"),
        Behavior::kRemoved, true);
  }
  if (type == "WhitespaceSplit") return char_split(&is_whitespace, Behavior::kRemoved);
  if (type == "BertPreTokenizer") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    steps.push_back(char_split(&is_whitespace, Behavior::kRemoved));
    steps.push_back(char_split(&is_bert_punctuation, Behavior::kIsolated));
    return std::make_unique<Sequence>(std::move(steps));
  }
  if (type == "Punctuation") {
    return char_split(&is_bert_punctuation,
                      parse_behavior(json::string_or(e, "behavior", "Isolated"), origin));
  }
  if (type == "Digits") {
    return char_split(&is_numeric, json::bool_or(e, "individual_digits", false)
                                       ? Behavior::kIsolated
                                       : Behavior::kContiguous);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> steps;
    simdjson::dom::array items;
    if (e["pretokenizers"].get(items) == simdjson::SUCCESS) {
      for (auto item : items) steps.push_back(parse_pre_tokenizer(item, origin));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw InvalidArgument(origin + ": pre-tokenizer " + type +
                        " is not supported (ByteLevel, Split, Metaspace, Whitespace, "
                        "WhitespaceSplit, BertPreTokenizer, Punctuation, Digits, Sequence are)");
}

}  // namespace stoker::text
