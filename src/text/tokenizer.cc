// Tokenizer (include/stoker/text/tokenizer.h): tokenizer.json read with simdjson into the stages,
// and the encode pipeline `tokenizers` runs: added tokens split out of the raw text, the rest
// normalized, added tokens split out of that, pre-tokenized, each piece through the model; then
// the post-processor's special tokens. A SentencePiece .model goes to the sentencepiece library
// itself (text/sentencepiece.h) instead.
#include "stoker/text/tokenizer.h"

#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "stoker/errors.h"
#include "text/alignment.h"
#include "text/components.h"
#include "text/model.h"
#include "text/regex.h"
#include "text/sentencepiece.h"
#include "text/tiktoken.h"
#include "text/unicode.h"

namespace stoker::text {

namespace {

struct AddedToken {
  std::string content;
  std::string shown;  // as decode() and id_to_token() give it: normalized if `normalized`
  int32_t id;
  bool special, lstrip, rstrip, single_word, normalized;
};

// The added tokens of one kind (matched in the raw text, or in the normalized text), found as
// `tokenizers` finds them: leftmost, then longest, non-overlapping.
class AddedMatcher {
 public:
  void add(const std::string& pattern, const AddedToken* token) {
    if (pattern.empty()) return;
    by_first_byte_[static_cast<uint8_t>(pattern[0])].push_back({pattern, token});
    empty_ = false;
  }
  void finish() {
    for (auto& list : by_first_byte_) {
      std::stable_sort(list.begin(), list.end(),
                       [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    }
  }
  bool empty() const { return empty_; }

  struct Segment {
    size_t begin, end;
    const AddedToken* token;  // nullptr: text for the model
  };
  std::vector<Segment> split(std::string_view s) const {
    std::vector<Segment> out;
    size_t start_offset = 0;
    for (size_t i = 0; i < s.size();) {
      const auto& list = by_first_byte_[static_cast<uint8_t>(s[i])];
      const std::pair<std::string, const AddedToken*>* found = nullptr;
      for (const auto& candidate : list) {
        if (s.compare(i, candidate.first.size(), candidate.first) == 0) {
          found = &candidate;
          break;
        }
      }
      if (!found) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + found->first.size();
      const AddedToken& t = *found->second;
      i = stop;
      if (t.single_word) {
        bool word_before = start > 0 && is_word(last_char(s.substr(0, start)));
        bool word_after = stop < s.size() && is_word(first_char(s.substr(stop)));
        if (word_before || word_after) continue;
      }
      if (t.lstrip) {
        size_t b = start;
        while (b > 0) {
          size_t p = b - 1;
          while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
          size_t q = p;
          if (!is_whitespace(next_code_point(s, q))) break;
          b = p;
        }
        start = std::max(b, start_offset);
      }
      if (t.rstrip) {
        while (stop < s.size()) {
          size_t q = stop;
          if (!is_whitespace(next_code_point(s, q))) break;
          stop = q;
        }
        i = stop;
      }
      if (start_offset < start) out.push_back({start_offset, start, nullptr});
      out.push_back({start, stop, &t});
      start_offset = stop;
    }
    if (start_offset != s.size()) out.push_back({start_offset, s.size(), nullptr});
    return out;
  }

 private:
  static char32_t last_char(std::string_view s) {
    size_t p = s.size() - 1;
    while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
    return next_code_point(s, p);
  }
  static char32_t first_char(std::string_view s) {
    size_t p = 0;
    return next_code_point(s, p);
  }
  // Rust's regex \w, which `tokenizers` tests single_word with: Alphabetic (letters and the
  // marks and symbols with Other_Alphabetic), marks, decimal digits, connectors, joiners.
  static bool is_word(char32_t c) {
    if (c < 0x80) {
      return c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
    }
    static const Regex word(R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}])",
                            "single_word's \\w");
    std::string one;
    append_utf8(one, c);
    return !word.find_all(one).empty();
  }

  std::vector<std::pair<std::string, const AddedToken*>> by_first_byte_[256];
  bool empty_ = true;
};

// One step of a post-processor, for a single sequence: the ids a template frames it with
// (add_special_tokens only), or ByteLevel's trim_offsets (offsets only, always).
struct PostStep {
  std::vector<int32_t> before, after;
  bool trim_offsets = false;
  bool add_prefix_space = true;  // ByteLevel's: the first token keeps one leading space
};

// A token's leading and trailing characters that are spaces ('Ġ', U+0120, in a byte-level
// token, or whitespace), as ByteLevel's process_offsets counts them.
struct Blanks {
  uint32_t leading = 0, trailing = 0;
};
Blanks blanks_of(std::string_view token) {
  std::vector<bool> blank;
  for (size_t i = 0; i < token.size();) {
    const char32_t c = next_code_point(token, i);
    blank.push_back(c == 0x120 || is_whitespace(c));
  }
  Blanks b;
  while (b.leading < blank.size() && blank[b.leading]) ++b.leading;
  while (b.trailing < blank.size() && blank[blank.size() - 1 - b.trailing]) ++b.trailing;
  return b;
}

// ByteLevel's process_offsets on character offsets, done on byte offsets by stepping over the
// text's characters (the same offsets once converted, even where a space is aligned to a
// multibyte character).
void trim_offsets(std::string_view text, const std::vector<Blanks>& blanks, bool add_prefix_space,
                  std::vector<TokenSpan>& offsets) {
  auto forward = [&](uint32_t at, uint32_t chars, uint32_t limit) {
    for (; chars > 0 && at < limit; --chars) {
      at += static_cast<uint32_t>(utf8_length(static_cast<uint8_t>(text[at])));
    }
    return std::min(at, limit);
  };
  for (size_t i = 0; i < offsets.size(); ++i) {
    TokenSpan& o = offsets[i];
    uint32_t leading = blanks[i].leading;
    const uint32_t trailing = blanks[i].trailing;
    if (leading > 0) {
      const bool first = i == 0 || o.begin == 0;
      if (first && add_prefix_space && leading == 1) leading = 0;
      o.begin = forward(o.begin, leading, o.end);
    }
    if (trailing > 0) {
      uint32_t at = o.end, back = trailing;
      for (; back > 0 && at > 0; --back) {
        do --at;
        while (at > 0 && (static_cast<uint8_t>(text[at]) & 0xC0) == 0x80);
      }
      if (back == 0) o.end = std::max(at, o.begin);  // the end had `trailing` characters before it
    }
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw IoError("cannot read " + path);
  return ss.str();
}

// e[key], or a JSON null where e has no such key (a default element is no value at all).
simdjson::dom::element member(simdjson::dom::element e, const char* key) {
  simdjson::dom::element v;
  if (e[key].get(v) == simdjson::SUCCESS) return v;
  static simdjson::dom::parser null_parser;
  static const simdjson::dom::element null = null_parser.parse(std::string_view("null")).value();
  return null;
}

}  // namespace

// The double Hugging Face tokenizers holds for a number read from a tokenizer.json file: serde_json
// without its float_roundtrip feature, which is not correctly rounded: the decimal significand
// (at most 19 digits) made a double, then multiplied or divided by the power of ten, two
// roundings. A Unigram's scores then differ from the exact values by an ulp now and then, and
// so, on ties, does the best path. `exact` is the correctly rounded value of the file's digits,
// which are the shortest that round-trip to it (tokenizers and Python write them so).
static double serde_json_double(double exact) {
  if (!std::isfinite(exact) || exact == 0) return exact;
  char buf[64];
  const auto written = std::to_chars(buf, buf + sizeof buf, exact);  // shortest round trip
  std::string_view s(buf, written.ptr - buf);
  const bool negative = s.front() == '-';
  if (negative) s.remove_prefix(1);
  uint64_t significand = 0;
  int exponent = 0;
  bool fraction = false;
  size_t i = 0;
  for (; i < s.size() && s[i] != 'e'; ++i) {
    if (s[i] == '.') {
      fraction = true;
      continue;
    }
    if (significand > (UINT64_MAX - 9) / 10) return exact;  // not the shortest digits
    significand = significand * 10 + static_cast<uint64_t>(s[i] - '0');
    if (fraction) --exponent;
  }
  if (i < s.size()) exponent += std::atoi(std::string(s.substr(i + 1)).c_str());
  double f = static_cast<double>(significand);
  for (;;) {
    const int magnitude = exponent < 0 ? -exponent : exponent;
    if (magnitude <= 308) {
      // serde_json's table: the literals 1e0 .. 1e308, each the correctly rounded double.
      static const std::vector<double> pow10 = [] {
        std::vector<double> t(309);
        for (int k = 0; k <= 308; ++k) t[k] = std::strtod(("1e" + std::to_string(k)).c_str(), nullptr);
        return t;
      }();
      f = exponent >= 0 ? f * pow10[magnitude] : f / pow10[magnitude];
      break;
    }
    if (f == 0 || exponent >= 0) break;
    f /= 1e308;
    exponent += 308;
  }
  return negative ? -f : f;
}

class Tokenizer::Impl {
 public:
  Impl(std::string_view json, const std::string& origin, bool file_numbers);
  // A tiktoken BPE file: its (token bytes, rank) with a pattern and special tokens.
  Impl(const std::vector<std::pair<std::string, int32_t>>& ranks, const std::string& pattern,
       const std::map<std::string, int32_t>& special_tokens, const std::string& origin);
  // A SentencePiece model: everything goes to it; the members below stay empty.
  Impl(std::unique_ptr<SentencePieceModel> model, const std::string& origin_)
      : origin(origin_), file_numbers(false), sentencepiece(std::move(model)) {
    vocab_size = sentencepiece->size();
  }

  std::string origin;
  bool file_numbers;  // read numbers as Hugging Face reads a file's (serde_json_double)
  std::unique_ptr<SentencePieceModel> sentencepiece;  // a .model file's, or none
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<Model> model;
  std::unique_ptr<Decoder> decoder;
  std::vector<PostStep> post;  // applied in order (a Sequence of processors)
  bool trims = false;          // a step trims offsets
  std::vector<std::unique_ptr<AddedToken>> added;
  std::unordered_map<int32_t, const AddedToken*> added_by_id;
  std::unordered_map<std::string, int32_t> added_by_content;
  std::unordered_set<std::string> special;
  AddedMatcher raw, normalized;
  size_t vocab_size = 0;

  void encode_segment(std::string_view s, bool at_origin, std::vector<int32_t>& out) const;
  Encoding encode_with_offsets(std::string_view text, bool add_special_tokens) const;

 private:
  void parse_model(simdjson::dom::element e);
  void parse_post(simdjson::dom::element e);
  int32_t added_token_id(const std::string& content) const;
  // encode_segment() keeping offsets (and, where a step trims, each token's blanks).
  void encode_segment(AlignedText s, bool at_origin, Encoding& e,
                      std::vector<Blanks>& blanks) const;
  std::string_view token_text(int32_t id) const;
};

Tokenizer::Impl::Impl(std::string_view text, const std::string& origin_, bool file_numbers_)
    : origin(origin_), file_numbers(file_numbers_) {
  simdjson::dom::parser parser;
  simdjson::padded_string padded(text);
  simdjson::dom::element root;
  if (auto error = parser.parse(padded).get(root); error || !root.is_object()) {
    throw InvalidArgument(origin + ": not a tokenizer.json (" +
                          (error ? simdjson::error_message(error) : "not a JSON object") + ")");
  }
  for (const char* key : {"truncation", "padding"}) {
    if (json::has(root, key)) {
      throw InvalidArgument(origin + ": " + key +
                            " is set; not supported (encode returns whole, unpadded sequences: "
                            "save the file with " + key + " disabled)");
    }
  }
  simdjson::dom::element model_json;
  if (root["model"].get(model_json) != simdjson::SUCCESS || !model_json.is_object()) {
    throw InvalidArgument(origin + ": not a tokenizer.json (no \"model\")");
  }
  normalizer = parse_normalizer(member(root, "normalizer"), origin);
  pre_tokenizer = parse_pre_tokenizer(member(root, "pre_tokenizer"), origin);
  parse_model(model_json);
  decoder = parse_decoder(member(root, "decoder"), origin);
  parse_post(member(root, "post_processor"));

  simdjson::dom::array tokens;
  if (root["added_tokens"].get(tokens) == simdjson::SUCCESS) {
    for (auto t : tokens) {
      auto a = std::make_unique<AddedToken>();
      a->content = json::string_or(t, "content", "");
      a->special = json::bool_or(t, "special", false);
      a->lstrip = json::bool_or(t, "lstrip", false);
      a->rstrip = json::bool_or(t, "rstrip", false);
      a->single_word = json::bool_or(t, "single_word", false);
      a->normalized = json::bool_or(t, "normalized", !a->special);
      if (a->content.empty()) continue;
      a->id = added_token_id(a->content);
      if (a->special) special.insert(a->content);
      added_by_id[a->id] = a.get();  // a token added again replaces its flags
      added_by_content[a->content] = a->id;
      added.push_back(std::move(a));
    }
  }
  // The tokens as last added: one per id.
  std::erase_if(added, [&](const auto& a) { return added_by_id.at(a->id) != a.get(); });
  for (const auto& a : added) {
    // `tokenizers` matches a normalized token's normalized form, and shows that form too.
    a->shown = a->normalized && normalizer ? normalizer->normalize(a->content) : a->content;
    if (a->normalized) {
      normalized.add(a->shown, a.get());
    } else {
      raw.add(a->content, a.get());
    }
  }
  raw.finish();
  normalized.finish();
  vocab_size = model->size();
  for (const auto& a : added) {
    if (!model->token_to_id(a->content)) ++vocab_size;
  }
}

// A JSON string literal of `s`.
static std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// tiktoken's pipeline in the stages of a tokenizer.json: the special tokens as added tokens
// (matched in the raw text), the pattern's matches kept (Split, inverted: what no match covers is
// dropped, as tiktoken's find_iter drops it), bytes as GPT-2's characters (ByteLevel without its
// regex) and the rank-merge BPE; a match that is a token whole is that token (ignore_merges).
Tokenizer::Impl::Impl(const std::vector<std::pair<std::string, int32_t>>& ranks,
                      const std::string& pattern,
                      const std::map<std::string, int32_t>& special_tokens,
                      const std::string& origin_)
    : origin(origin_), file_numbers(false) {
  const std::string stages =
      R"({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": )"
      R"({"Regex": )" +
      json_quote(pattern) +
      R"(}, "behavior": "Removed", "invert": true}, )"
      R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}]}, )"
      R"("decoder": {"type": "ByteLevel"}})";
  simdjson::dom::parser parser;
  simdjson::padded_string padded(stages);
  const simdjson::dom::element root = parser.parse(padded).value();
  pre_tokenizer = parse_pre_tokenizer(root["pre_tokenizer"].value(), origin + ": pattern");
  decoder = parse_decoder(root["decoder"].value(), origin);
  Vocab vocab;
  for (const auto& [bytes, rank] : ranks) {
    std::string token;
    for (char b : bytes) token += byte_to_unicode(static_cast<uint8_t>(b));
    vocab.emplace(std::move(token), rank);
  }
  BpeOptions options;
  options.ignore_merges = true;
  model = Bpe::from_ranks(std::move(vocab), std::move(options), origin);
  for (const auto& [content, id] : special_tokens) {
    if (content.empty()) continue;
    auto a = std::make_unique<AddedToken>(
        AddedToken{content, content, id, true, false, false, false, false});
    special.insert(content);
    added_by_id[id] = a.get();
    added_by_content[content] = id;
    raw.add(content, a.get());
    added.push_back(std::move(a));
  }
  raw.finish();
  normalized.finish();
  vocab_size = model->size();
  for (const auto& a : added) {
    if (!model->id_to_token(a->id)) ++vocab_size;
  }
}

// The id `tokenizers` gives an added token as it reads the file (AddedVocabulary::add_tokens):
// the file's "id" is only checked there (a warning), so a file whose ids disagree gets these.
int32_t Tokenizer::Impl::added_token_id(const std::string& content) const {
  if (auto it = added_by_content.find(content); it != added_by_content.end()) return it->second;
  if (auto id = model->token_to_id(content)) return *id;
  const auto vocab = static_cast<int32_t>(model->size());
  if (added_by_id.empty()) return vocab;
  int32_t max = INT32_MIN;
  for (const auto& [id, token] : added_by_id) max = std::max(max, id);
  return max >= vocab || vocab == 0 ? max + 1 : vocab;
}

void Tokenizer::Impl::parse_model(simdjson::dom::element e) {
  std::string type = json::string_or(e, "type", "");
  simdjson::dom::element vocab_json = member(e, "vocab");
  if (type.empty()) {  // files older than the "type" field: BPE has merges, Unigram a list
    type = json::has(e, "merges") ? "BPE" : vocab_json.is_array() ? "Unigram" : "WordPiece";
  }
  auto read_vocab = [&] {
    Vocab v;
    simdjson::dom::object o;
    if (vocab_json.get(o) != simdjson::SUCCESS) {
      throw InvalidArgument(origin + ": model " + type + " without a vocab object");
    }
    for (auto [token, id] : o) {
      int64_t i;
      if (id.get(i) != simdjson::SUCCESS || i < 0 || i > INT32_MAX) {
        throw InvalidArgument(origin + ": model " + type + " vocab id of \"" +
                              std::string(token) + "\" is not a non-negative integer");
      }
      v.emplace(std::string(token), static_cast<int32_t>(i));
    }
    return v;
  };
  if (type == "BPE") {
    if (json::has(e, "dropout")) {
      double d = 0;
      if (e["dropout"].get(d) != simdjson::SUCCESS || d != 0.0) {
        throw InvalidArgument(origin + ": BPE dropout is not supported (ids would be random)");
      }
    }
    BpeOptions o;
    if (json::has(e, "unk_token")) o.unk_token = json::string_or(e, "unk_token", "");
    o.continuing_subword_prefix = json::string_or(e, "continuing_subword_prefix", "");
    o.end_of_word_suffix = json::string_or(e, "end_of_word_suffix", "");
    o.fuse_unk = json::bool_or(e, "fuse_unk", false);
    o.byte_fallback = json::bool_or(e, "byte_fallback", false);
    o.ignore_merges = json::bool_or(e, "ignore_merges", false);
    o.whole_texts = !pre_tokenizer;
    std::vector<std::pair<std::string, std::string>> merges;
    simdjson::dom::array list;
    if (e["merges"].get(list) == simdjson::SUCCESS) {
      merges.reserve(list.size());
      for (auto m : list) {
        std::string_view s;
        simdjson::dom::array pair;
        if (m.get(s) == simdjson::SUCCESS) {
          size_t space = s.find(' ');
          if (space == std::string_view::npos || s.find(' ', space + 1) != std::string_view::npos) {
            throw InvalidArgument(origin + ": BPE merge \"" + std::string(s) +
                                  "\" is not two tokens");
          }
          merges.emplace_back(std::string(s.substr(0, space)), std::string(s.substr(space + 1)));
        } else if (m.get(pair) == simdjson::SUCCESS && pair.size() == 2) {
          std::string_view a, b;
          if (pair.at(0).get(a) || pair.at(1).get(b)) {
            throw InvalidArgument(origin + ": a BPE merge that is not two strings");
          }
          merges.emplace_back(std::string(a), std::string(b));
        } else {
          throw InvalidArgument(origin + ": a BPE merge that is neither \"a b\" nor [a, b]");
        }
      }
    }
    model = std::make_unique<Bpe>(read_vocab(), merges, std::move(o), origin);
  } else if (type == "WordPiece") {
    model = std::make_unique<WordPiece>(
        read_vocab(), json::string_or(e, "unk_token", "[UNK]"),
        json::string_or(e, "continuing_subword_prefix", "##"),
        static_cast<size_t>(json::int_or(e, "max_input_chars_per_word", 100)), origin);
  } else if (type == "Unigram") {
    std::vector<std::pair<std::string, double>> pieces;
    simdjson::dom::array list;
    if (vocab_json.get(list) != simdjson::SUCCESS) {
      throw InvalidArgument(origin + ": model Unigram without a vocab list");
    }
    for (auto item : list) {
      simdjson::dom::array pair;
      std::string_view piece;
      double score;
      if (item.get(pair) || pair.size() != 2 || pair.at(0).get(piece) || pair.at(1).get(score)) {
        throw InvalidArgument(origin + ": a Unigram vocab entry that is not [piece, score]");
      }
      pieces.emplace_back(std::string(piece), file_numbers ? serde_json_double(score) : score);
    }
    std::optional<int32_t> unk;
    if (json::has(e, "unk_id")) unk = static_cast<int32_t>(json::int_or(e, "unk_id", 0));
    model = std::make_unique<Unigram>(std::move(pieces), unk, json::bool_or(e, "byte_fallback", false),
                                      origin);
  } else {
    throw InvalidArgument(origin + ": model " + type +
                          " is not supported (BPE, WordPiece, Unigram are)");
  }
}

void Tokenizer::Impl::parse_post(simdjson::dom::element e) {
  if (e.is_null()) return;
  const std::string type = json::type_of(e, origin, "post-processor");
  auto pair_id = [&](const char* key) {
    simdjson::dom::array a;
    int64_t id = 0;
    if (e[key].get(a) || a.size() != 2 || a.at(1).get(id)) {
      throw InvalidArgument(origin + ": " + type + " without its " + key + " [token, id]");
    }
    return static_cast<int32_t>(id);
  };
  auto trim_step = [&] {
    if (!json::bool_or(e, "trim_offsets", true)) return;
    post.push_back(PostStep{{}, {}, true, json::bool_or(e, "add_prefix_space", true)});
    trims = true;
  };
  if (type == "ByteLevel") {  // offsets only
    trim_step();
    return;
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    if (type == "RobertaProcessing") trim_step();
    post.push_back(PostStep{{pair_id("cls")}, {pair_id("sep")}});
    return;
  }
  if (type == "TemplateProcessing") {
    PostStep t;
    bool seen_sequence = false;
    simdjson::dom::array single;
    if (e["single"].get(single)) {
      throw InvalidArgument(origin + ": TemplateProcessing without a single template");
    }
    for (auto piece : single) {
      simdjson::dom::element inner;
      if (piece["Sequence"].get(inner) == simdjson::SUCCESS) {
        if (json::string_or(inner, "id", "A") != "A" || seen_sequence) {
          throw InvalidArgument(origin + ": TemplateProcessing single template with a sequence "
                                         "other than one $A is not supported");
        }
        seen_sequence = true;
      } else if (piece["SpecialToken"].get(inner) == simdjson::SUCCESS) {
        std::string name = json::string_or(inner, "id", "");
        simdjson::dom::array ids;
        if (e["special_tokens"][name]["ids"].get(ids)) {
          throw InvalidArgument(origin + ": TemplateProcessing names special token \"" + name +
                                "\" without its ids");
        }
        for (auto id : ids) {
          int64_t v;
          if (id.get(v)) throw InvalidArgument(origin + ": TemplateProcessing id not an integer");
          (seen_sequence ? t.after : t.before).push_back(static_cast<int32_t>(v));
        }
      } else {
        throw InvalidArgument(origin + ": TemplateProcessing piece neither Sequence nor "
                                       "SpecialToken");
      }
    }
    post.push_back(std::move(t));
    return;
  }
  if (type == "Sequence") {
    simdjson::dom::array items;
    if (e["processors"].get(items) == simdjson::SUCCESS) {
      for (auto item : items) parse_post(item);
    }
    return;
  }
  throw InvalidArgument(origin + ": post-processor " + type +
                        " is not supported (TemplateProcessing, BertProcessing, "
                        "RobertaProcessing, ByteLevel, Sequence are)");
}

void Tokenizer::Impl::encode_segment(std::string_view s, bool at_origin,
                                     std::vector<int32_t>& out) const {
  if (!pre_tokenizer) return model->encode(s, out);
  std::vector<Piece> pieces;
  pieces.push_back(Piece{std::string(s), at_origin});
  pre_tokenizer->split(pieces);
  for (const auto& p : pieces) model->encode(p.text, out);
}

std::string_view Tokenizer::Impl::token_text(int32_t id) const {
  if (auto it = added_by_id.find(id); it != added_by_id.end()) return it->second->content;
  const std::string* t = model->id_to_token(id);
  return t ? std::string_view(*t) : std::string_view();
}

void Tokenizer::Impl::encode_segment(AlignedText s, bool at_origin, Encoding& e,
                                     std::vector<Blanks>& blanks) const {
  std::vector<Piece> pieces;
  pieces.push_back(Piece{std::move(s.text), at_origin, s.origin, std::move(s.align)});
  if (pre_tokenizer) pre_tokenizer->split(pieces);
  std::vector<TokenSpan> spans;
  for (const auto& p : pieces) {
    spans.clear();
    const size_t first = e.ids.size();
    model->encode(p.text, e.ids, &spans);
    for (const TokenSpan& span : spans) {  // NormalizedString::convert_offsets
      if (span.end <= span.begin || span.end > p.align.size()) {
        e.offsets.push_back({p.origin, p.origin});
      } else {
        e.offsets.push_back({p.align[span.begin].begin, p.align[span.end - 1].end});
      }
    }
    if (trims) {
      for (size_t i = first; i < e.ids.size(); ++i) {
        blanks.push_back(blanks_of(token_text(e.ids[i])));
      }
    }
  }
}

// encode()'s pipeline on aligned text: the same stages, each keeping where its bytes came from.
Encoding Tokenizer::Impl::encode_with_offsets(std::string_view text,
                                              bool add_special_tokens) const {
  Encoding e;
  std::vector<Blanks> blanks;  // per id, where a step trims offsets
  auto added_token = [&](const AddedToken& token, TokenSpan span, std::string_view matched) {
    e.ids.push_back(token.id);
    e.offsets.push_back(span);
    if (trims) blanks.push_back(blanks_of(matched));  // the matched text, stripped spaces too
  };
  auto normalized_part = [&](std::string_view part, uint32_t begin, bool at_origin) {
    AlignedText n = AlignedText::identity(part, begin);
    if (normalizer) normalizer->normalize(n);
    if (normalized.empty()) {
      if (!n.text.empty()) encode_segment(std::move(n), at_origin, e, blanks);
      return;
    }
    for (const auto& seg : normalized.split(n.text)) {
      if (seg.token) {
        added_token(*seg.token, n.original(seg.begin, seg.end),
                    std::string_view(n.text).substr(seg.begin, seg.end - seg.begin));
      } else if (seg.end > seg.begin) {
        encode_segment(n.slice(seg.begin, seg.end), at_origin && seg.begin == 0, e, blanks);
      }
    }
  };
  if (raw.empty()) {
    if (!text.empty()) normalized_part(text, 0, true);
  } else {
    for (const auto& seg : raw.split(text)) {
      const auto b = static_cast<uint32_t>(seg.begin), end = static_cast<uint32_t>(seg.end);
      if (seg.token) {
        added_token(*seg.token, {b, end}, text.substr(b, end - b));
      } else if (end > b) {
        normalized_part(text.substr(b, end - b), b, b == 0);
      }
    }
  }
  for (const PostStep& step : post) {
    if (step.trim_offsets) trim_offsets(text, blanks, step.add_prefix_space, e.offsets);
    if (!add_special_tokens || (step.before.empty() && step.after.empty())) continue;
    Encoding framed;
    std::vector<Blanks> framed_blanks;
    auto special = [&](int32_t id) {
      framed.ids.push_back(id);
      framed.offsets.push_back({});
      if (trims) framed_blanks.push_back(blanks_of(token_text(id)));
    };
    for (int32_t id : step.before) special(id);
    framed.ids.insert(framed.ids.end(), e.ids.begin(), e.ids.end());
    framed.offsets.insert(framed.offsets.end(), e.offsets.begin(), e.offsets.end());
    framed_blanks.insert(framed_blanks.end(), blanks.begin(), blanks.end());
    for (int32_t id : step.after) special(id);
    e = std::move(framed);
    blanks = std::move(framed_blanks);
  }
  return e;
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_json(std::string_view json, const std::string& origin) {
  return Tokenizer(std::make_unique<Impl>(json, origin, false));
}

// Whether a file's `bytes` are a SentencePiece model rather than a tokenizer.json: its name ends
// in .model; or its first byte is not JSON's (whitespace, then '{') but 0x0A, the tag a serialized
// ModelProto starts with (field 1, its first piece).
static bool is_sentencepiece(const std::string& path, std::string_view bytes) {
  if (path.ends_with(".model")) return true;
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && bytes[first] == '{') return false;
  return !bytes.empty() && bytes[0] == '\x0A';
}

bool Tokenizer::sentencepiece_supported() { return SentencePieceModel::supported(); }

Tokenizer Tokenizer::from_file(const std::string& path_or_directory,
                               const TiktokenOptions& tiktoken) {
  std::string path = path_or_directory;
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    const std::filesystem::path dir(path);
    if (std::filesystem::exists(dir / "tokenizer.json", ec)) {
      path = (dir / "tokenizer.json").string();
    } else if (std::filesystem::exists(dir / "tokenizer.model", ec)) {
      path = (dir / "tokenizer.model").string();
    } else {
      throw IoError(path + ": a directory with neither a tokenizer.json nor a tokenizer.model");
    }
  }
  const std::string bytes = read_file(path);
  const bool is_tiktoken =
      !is_sentencepiece(path, bytes) && (path.ends_with(".tiktoken") || looks_like_tiktoken(bytes));
  if (!is_tiktoken && (tiktoken.pattern || tiktoken.special_tokens)) {
    throw InvalidArgument(path +
                          ": a pattern and special tokens are for tiktoken files, and this "
                          "is none (a tiktoken file's lines are \"<base64 token> <rank>\")");
  }
  if (is_tiktoken) {
    // tiktoken files hold neither: those given, else the known encoding's of the file's name.
    const std::string name = std::filesystem::path(path).stem().string();
    const auto known = known_tiktoken_encoding(name);
    if (!tiktoken.pattern && !known) {
      throw InvalidArgument(path + ": a tiktoken file holds no split pattern, and \"" + name +
                            "\" is none of the encodings known by name (" + known_tiktoken_names() +
                            "): give its pattern (tiktoken's pat_str) and special tokens");
    }
    const std::string& pattern = tiktoken.pattern ? *tiktoken.pattern : known->pattern;
    const std::map<std::string, int32_t> none;
    const auto& special_tokens = tiktoken.special_tokens ? *tiktoken.special_tokens
                                 : known                 ? known->special_tokens
                                                         : none;
    return Tokenizer(
        std::make_unique<Impl>(parse_tiktoken(bytes, path), pattern, special_tokens, path));
  }
  if (is_sentencepiece(path, bytes)) {
    auto model = std::make_unique<SentencePieceModel>(bytes, path);
    return Tokenizer(std::make_unique<Impl>(std::move(model), path));
  }
  return Tokenizer(std::make_unique<Impl>(bytes, path, true));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (!valid_utf8(text)) throw DecodeError(impl_->origin + ": encode of text that is not UTF-8");
  const Impl& m = *impl_;
  if (m.sentencepiece) return m.sentencepiece->encode(text, add_special_tokens);
  std::vector<int32_t> ids;
  auto normalized_part = [&](std::string_view part, bool at_origin) {
    std::string n = m.normalizer ? m.normalizer->normalize(std::string(part)) : std::string(part);
    if (m.normalized.empty()) {
      if (!n.empty()) m.encode_segment(n, at_origin, ids);
      return;
    }
    for (const auto& seg : m.normalized.split(n)) {
      if (seg.token) {
        ids.push_back(seg.token->id);
      } else if (seg.end > seg.begin) {
        m.encode_segment(std::string_view(n).substr(seg.begin, seg.end - seg.begin),
                         at_origin && seg.begin == 0, ids);
      }
    }
  };
  if (m.raw.empty()) {
    if (!text.empty()) normalized_part(text, true);
  } else {
    for (const auto& seg : m.raw.split(text)) {
      if (seg.token) {
        ids.push_back(seg.token->id);
      } else if (seg.end > seg.begin) {
        normalized_part(text.substr(seg.begin, seg.end - seg.begin), seg.begin == 0);
      }
    }
  }
  if (add_special_tokens) {
    for (const auto& t : m.post) {
      if (t.before.empty() && t.after.empty()) continue;
      std::vector<int32_t> framed = t.before;
      framed.insert(framed.end(), ids.begin(), ids.end());
      framed.insert(framed.end(), t.after.begin(), t.after.end());
      ids = std::move(framed);
    }
  }
  return ids;
}

Encoding Tokenizer::encode_with_offsets(std::string_view text, bool add_special_tokens) const {
  if (!valid_utf8(text)) throw DecodeError(impl_->origin + ": encode of text that is not UTF-8");
  if (text.size() >= UINT32_MAX) {
    throw InvalidArgument(impl_->origin + ": encode_with_offsets of a text of 4 GiB or more");
  }
  if (impl_->sentencepiece) {
    return impl_->sentencepiece->encode_with_offsets(text, add_special_tokens);
  }
  return impl_->encode_with_offsets(text, add_special_tokens);
}

// `encode(i, out)` for each text on up to `threads` threads; the first failure rethrown.
template <class Result, class Encode>
static std::vector<Result> on_threads(size_t count, int threads, Encode encode) {
  std::vector<Result> out(count);
  const size_t n = std::min(count, static_cast<size_t>(std::max(threads, 1)));
  std::atomic<size_t> next{0};
  std::vector<std::exception_ptr> errors(std::max<size_t>(n, 1));
  auto work = [&](size_t worker) {
    try {
      for (size_t i; (i = next.fetch_add(1)) < count;) out[i] = encode(i);
    } catch (...) {
      errors[worker] = std::current_exception();
      next = count;  // the others stop at their next text
    }
  };
  if (n <= 1) {
    work(0);
  } else {
    std::vector<std::jthread> pool;
    for (size_t w = 0; w < n; ++w) pool.emplace_back(work, w);
  }
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return out;
}

std::vector<Encoding> Tokenizer::encode_batch_with_offsets(const std::vector<std::string>& texts,
                                                           bool add_special_tokens,
                                                           int threads) const {
  return on_threads<Encoding>(texts.size(), threads, [&](size_t i) {
    return encode_with_offsets(texts[i], add_special_tokens);
  });
}

void Tokenizer::to_char_offsets(std::string_view text, std::vector<TokenSpan>& offsets) {
  // The character each byte belongs to (BytesToCharOffsetConverter's map), and past the end the
  // text's length in characters.
  std::vector<uint32_t> char_of(text.size() + 1);
  uint32_t chars = 0;
  for (size_t i = 0; i < text.size(); ++chars) {
    const size_t n = std::min(utf8_length(static_cast<uint8_t>(text[i])), text.size() - i);
    for (size_t k = 0; k < n; ++k) char_of[i + k] = chars;
    i += n;
  }
  char_of[text.size()] = chars;
  for (TokenSpan& o : offsets) {
    o.begin = char_of[std::min<size_t>(o.begin, text.size())];
    o.end = char_of[std::min<size_t>(o.end, text.size())];
  }
}

std::vector<std::vector<int32_t>> Tokenizer::encode_batch(const std::vector<std::string>& texts,
                                                          bool add_special_tokens,
                                                          int threads) const {
  return on_threads<std::vector<int32_t>>(
      texts.size(), threads, [&](size_t i) { return encode(texts[i], add_special_tokens); });
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  if (m.sentencepiece) return m.sentencepiece->decode(ids, skip_special_tokens);
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    const std::string* token = nullptr;
    if (auto it = m.added_by_id.find(id); it != m.added_by_id.end()) {
      token = &it->second->shown;
    } else {
      token = m.model->id_to_token(id);
    }
    if (!token) continue;
    if (skip_special_tokens && m.special.contains(*token)) continue;
    tokens.push_back(*token);
  }
  std::string out;
  if (m.decoder) {
    for (auto& s : m.decoder->decode_chain(std::move(tokens))) out += s;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
  }
  return out;
}

size_t Tokenizer::vocab_size() const { return impl_->vocab_size; }

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (impl_->sentencepiece) return impl_->sentencepiece->token_to_id(token);
  if (auto it = impl_->added_by_content.find(std::string(token));
      it != impl_->added_by_content.end()) {
    return it->second;
  }
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (impl_->sentencepiece) return impl_->sentencepiece->id_to_token(id);
  if (auto it = impl_->added_by_id.find(id); it != impl_->added_by_id.end()) {
    return it->second->shown;
  }
  if (const std::string* t = impl_->model->id_to_token(id)) return *t;
  return std::nullopt;
}

}  // namespace stoker::text
