// The normalizers of tokenizer.json (`tokenizers`' normalizers/).
#include "stoker/errors.h"
#include "text/components.h"
#include "text/regex.h"
#include "text/unicode.h"

namespace stoker::text {
namespace {

template <class Keep>
std::string filter_chars(const std::string& s, Keep keep) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    char32_t c = next_code_point(s, i);
    if (keep(c)) out.append(s, start, i - start);
  }
  return out;
}

// Each character replaced by what `fn(c, out)` appends (nothing: removed), every byte of that
// aligned to the character: what `tokenizers`' map, filter and per-character transforms keep.
template <class Fn>
void map_chars(AlignedText& t, Fn fn) {
  AlignedText out{std::string(), Alignment(), t.origin};
  out.text.reserve(t.text.size());
  out.align.reserve(t.text.size());
  for (size_t i = 0; i < t.text.size();) {
    const TokenSpan span = t.align[i];
    const char32_t c = next_code_point(t.text, i);
    const size_t before = out.text.size();
    fn(c, out.text);
    out.align.insert(out.align.end(), out.text.size() - before, span);
  }
  t = std::move(out);
}

void lowercase_char(char32_t c, std::string& out) {
  std::string one;
  append_utf8(one, c);
  out += lowercase(one);
}

class UnicodeForm : public Normalizer {
 public:
  explicit UnicodeForm(NormalForm form) : form_(form) {}
  std::string normalize(std::string s) const override { return text::normalize(s, form_); }
  void normalize(AlignedText& t) const override {
    transform(t, normalize_changes(t.text, form_), 0);
  }

 private:
  NormalForm form_;
};

class Lowercase : public Normalizer {
 public:
  std::string normalize(std::string s) const override { return lowercase(s); }
  void normalize(AlignedText& t) const override { map_chars(t, lowercase_char); }
};

class Strip : public Normalizer {
 public:
  Strip(bool left, bool right) : left_(left), right_(right) {}
  std::string normalize(std::string s) const override {
    auto [b, e] = kept(s);
    return s.substr(b, e - b);
  }
  void normalize(AlignedText& t) const override {
    auto [b, e] = kept(t.text);
    if (b == 0 && e == t.text.size()) return;
    t = t.slice(b, e);
  }

 private:
  std::pair<size_t, size_t> kept(const std::string& s) const {
    size_t b = 0, e = s.size();
    if (left_) {
      for (size_t i = 0; i < s.size();) {
        if (!is_whitespace(next_code_point(s, i))) break;
        b = i;
      }
    }
    if (right_) {
      size_t i = b;
      size_t last_non_space_end = b;
      while (i < e) {
        char32_t c = next_code_point(s, i);
        if (!is_whitespace(c)) last_non_space_end = i;
      }
      e = last_non_space_end;
    }
    return {b, e};
  }

  bool left_, right_;
};

class StripAccents : public Normalizer {
 public:
  std::string normalize(std::string s) const override {
    return filter_chars(s, [](char32_t c) { return !is_mark(c); });
  }
  void normalize(AlignedText& t) const override {
    map_chars(t, [](char32_t c, std::string& out) {
      if (!is_mark(c)) append_utf8(out, c);
    });
  }
};

class Replace : public Normalizer {
 public:
  Replace(std::unique_ptr<Regex> regex, std::string literal, std::string content)
      : regex_(std::move(regex)), literal_(std::move(literal)), content_(std::move(content)) {}
  std::string normalize(std::string s) const override {
    std::string out;
    out.reserve(s.size() + s.size() / 4);
    size_t at = 0;
    for_each_match(s, [&](size_t b, size_t e) {
      out.append(s, at, b - at);
      out += content_;
      at = e;
    });
    out.append(s, at, std::string::npos);
    return out;
  }
  // The content takes the alignment of the match's last byte (of the byte before an empty
  // match), as NormalizedString::replace's inserted characters do.
  void normalize(AlignedText& t) const override {
    AlignedText out{std::string(), Alignment(), t.origin};
    size_t at = 0;
    for_each_match(t.text, [&](size_t b, size_t e) {
      out.text.append(t.text, at, b - at);
      out.align.insert(out.align.end(), t.align.begin() + static_cast<ptrdiff_t>(at),
                       t.align.begin() + static_cast<ptrdiff_t>(b));
      const TokenSpan span = e > 0 ? t.align[e - 1] : TokenSpan{t.origin, t.origin};
      out.text += content_;
      out.align.insert(out.align.end(), content_.size(), span);
      at = e;
    });
    out.text.append(t.text, at, std::string::npos);
    out.align.insert(out.align.end(), t.align.begin() + static_cast<ptrdiff_t>(at), t.align.end());
    t = std::move(out);
  }

 private:
  // fn(begin, end) of each match, left to right.
  template <class Fn>
  void for_each_match(const std::string& s, Fn fn) const {
    if (regex_) {
      for (auto [b, e] : regex_->find_all(s)) fn(b, e);
      return;
    }
    if (literal_.empty()) return;
    if (literal_.size() == 1) {  // a byte (a space): found by memchr, without a compare each
      for (size_t b = 0; (b = s.find(literal_[0], b)) != std::string::npos; ++b) fn(b, b + 1);
      return;
    }
    for (size_t b = 0; (b = s.find(literal_, b)) != std::string::npos; b += literal_.size()) {
      fn(b, b + literal_.size());
    }
  }

  std::unique_ptr<Regex> regex_;
  std::string literal_;
  std::string content_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(std::string prefix) : prefix_(std::move(prefix)) {}
  std::string normalize(std::string s) const override {
    return s.empty() ? s : prefix_ + s;
  }
  void normalize(AlignedText& t) const override { prepend(t, prefix_); }

 private:
  std::string prefix_;
};

inline bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

class BertNormalizer : public Normalizer {
 public:
  BertNormalizer(bool clean_text, bool chinese, bool strip_accents, bool lowercase)
      : clean_text_(clean_text), chinese_(chinese), strip_accents_(strip_accents),
        lowercase_(lowercase) {}
  std::string normalize(std::string s) const override {
    if (clean_text_) {
      std::string out;
      out.reserve(s.size());
      for (size_t i = 0; i < s.size();) {
        size_t start = i;
        char32_t c = next_code_point(s, i);
        // Controls go first (a control that is also White_Space, U+0085 or \f, goes too); then
        // whitespace becomes a space.
        bool control = c != '\t' && c != '\n' && c != '\r' && is_other(c);
        if (c == 0 || c == 0xFFFD || control) continue;
        if (is_whitespace(c)) {
          out += ' ';
        } else {
          out.append(s, start, i - start);
        }
      }
      s = std::move(out);
    }
    if (chinese_) {
      std::string out;
      out.reserve(s.size());
      for (size_t i = 0; i < s.size();) {
        size_t start = i;
        const bool chinese = is_chinese_char(next_code_point(s, i));
        if (chinese) out += ' ';
        out.append(s, start, i - start);
        if (chinese) out += ' ';
      }
      s = std::move(out);
    }
    if (strip_accents_) {
      s = filter_chars(text::normalize(s, NormalForm::kNfd),
                       [](char32_t c) { return !is_mark_nonspacing(c); });
    }
    if (lowercase_) s = lowercase(s);
    return s;
  }
  void normalize(AlignedText& t) const override {
    if (clean_text_) {
      map_chars(t, [](char32_t c, std::string& out) {
        bool control = c != '\t' && c != '\n' && c != '\r' && is_other(c);
        if (c == 0 || c == 0xFFFD || control) return;
        append_utf8(out, is_whitespace(c) ? U' ' : c);
      });
    }
    if (chinese_) {
      map_chars(t, [](char32_t c, std::string& out) {
        const bool chinese = is_chinese_char(c);
        if (chinese) out += ' ';
        append_utf8(out, c);
        if (chinese) out += ' ';
      });
    }
    if (strip_accents_) {
      transform(t, normalize_changes(t.text, NormalForm::kNfd), 0);
      map_chars(t, [](char32_t c, std::string& out) {
        if (!is_mark_nonspacing(c)) append_utf8(out, c);
      });
    }
    if (lowercase_) map_chars(t, lowercase_char);
  }

 private:
  bool clean_text_, chinese_, strip_accents_, lowercase_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  std::string normalize(std::string s) const override {
    for (const auto& n : steps_) s = n->normalize(std::move(s));
    return s;
  }
  void normalize(AlignedText& t) const override {
    for (const auto& n : steps_) n->normalize(t);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

}  // namespace

std::unique_ptr<Normalizer> parse_normalizer(simdjson::dom::element e, const std::string& origin) {
  if (e.is_null()) return nullptr;
  const std::string type = json::type_of(e, origin, "normalizer");
  if (type == "NFC") return std::make_unique<UnicodeForm>(NormalForm::kNfc);
  if (type == "NFD") return std::make_unique<UnicodeForm>(NormalForm::kNfd);
  if (type == "NFKC") return std::make_unique<UnicodeForm>(NormalForm::kNfkc);
  if (type == "NFKD") return std::make_unique<UnicodeForm>(NormalForm::kNfkd);
  if (type == "Lowercase") return std::make_unique<Lowercase>();
  if (type == "StripAccents") return std::make_unique<StripAccents>();
  if (type == "Strip") {
    return std::make_unique<Strip>(json::bool_or(e, "strip_left", true),
                                   json::bool_or(e, "strip_right", true));
  }
  if (type == "Prepend") return std::make_unique<Prepend>(json::string_or(e, "prepend", ""));
  if (type == "Replace") {
    simdjson::dom::element pattern;
    if (e["pattern"].get(pattern) != simdjson::SUCCESS) {
      throw InvalidArgument(origin + ": normalizer Replace without a pattern");
    }
    std::string content = json::string_or(e, "content", "");
    if (json::has(pattern, "Regex")) {
      return std::make_unique<Replace>(
          std::make_unique<Regex>(json::string_or(pattern, "Regex", ""),
                                  origin + ": normalizer Replace"),
          "", std::move(content));
    }
    return std::make_unique<Replace>(nullptr, json::string_or(pattern, "String", ""),
                                     std::move(content));
  }
  if (type == "BertNormalizer") {
    bool lower = json::bool_or(e, "lowercase", true);
    bool strip = json::has(e, "strip_accents") ? json::bool_or(e, "strip_accents", lower) : lower;
    return std::make_unique<BertNormalizer>(json::bool_or(e, "clean_text", true),
                                            json::bool_or(e, "handle_chinese_chars", true), strip,
                                            lower);
  }
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> steps;
    simdjson::dom::array items;
    if (e["normalizers"].get(items) == simdjson::SUCCESS) {
      for (auto item : items) steps.push_back(parse_normalizer(item, origin));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw InvalidArgument(origin + ": normalizer " + type +
                        " is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Strip, "
                        "StripAccents, Replace, Prepend, BertNormalizer, Sequence are)");
}

}  // namespace stoker::text
