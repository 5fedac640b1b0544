// The decoders of tokenizer.json (`tokenizers`' decoders/): each maps the tokens' strings to new
// strings (decode_chain); the tokenizer joins the last chain's strings.
#include "stoker/errors.h"
#include "text/components.h"
#include "text/unicode.h"

namespace stoker::text {
namespace {

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  size_t at = 0;
  for (size_t b; (b = s.find(from, at)) != std::string::npos; at = b + from.size()) {
    out.append(s, at, b - at);
    out += to;
  }
  out.append(s, at, std::string::npos);
  return out;
}

class ByteLevel : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      std::string mine;
      bool all = true;
      for (size_t i = 0; i < t.size() && all;) {
        int b = unicode_to_byte(next_code_point(t, i));
        if (b < 0) all = false;
        mine += static_cast<char>(b);
      }
      bytes += all ? mine : t;  // a token with another character passes as its bytes
    }
    return {utf8_lossy(bytes)};
  }
};

class Metaspace : public Decoder {
 public:
  Metaspace(std::string replacement, bool prepend)
      : replacement_(std::move(replacement)), prepend_(prepend) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = replace_all(std::move(tokens[i]), replacement_, i == 0 && prepend_ ? "" : " ");
    }
    return tokens;
  }

 private:
  std::string replacement_;
  bool prepend_;
};

class WordPiece : public Decoder {
 public:
  WordPiece(std::string prefix, bool cleanup) : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      if (i != 0) {
        if (t.compare(0, prefix_.size(), prefix_) == 0) {
          t.erase(0, prefix_.size());
        } else {
          std::string spaced(" ");
          spaced += t;
          t = std::move(spaced);
        }
      }
      if (cleanup_) t = cleanup(std::move(t));
    }
    return tokens;
  }
  static std::string cleanup(std::string s) {
    static const std::pair<const char*, const char*> kRules[] = {
        {" .", "."},   {" ?", "?"},   {" !", "!"},           {" ,", ","},
        {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"},       {" do not", " don't"},
        {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (auto [from, to] : kRules) s = replace_all(std::move(s), from, to);
    return s;
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

class ByteFallback : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::vector<std::string> out;
    std::string bytes;
    auto flush = [&] {
      if (bytes.empty()) return;
      if (valid_utf8(bytes)) {
        out.push_back(bytes);
      } else {
        for (size_t i = 0; i < bytes.size(); ++i) out.push_back("\xEF\xBF\xBD");
      }
      bytes.clear();
    };
    for (auto& t : tokens) {
      int value = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
        auto hex = [](char c) {
          if (c >= '0' && c <= '9') return c - '0';
          if (c >= 'a' && c <= 'f') return c - 'a' + 10;
          if (c >= 'A' && c <= 'F') return c - 'A' + 10;
          return -1;
        };
        int hi = hex(t[3]), lo = hex(t[4]);
        if (hi >= 0 && lo >= 0) value = hi * 16 + lo;
      }
      if (value >= 0) {
        bytes += static_cast<char>(value);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    return out;
  }
};

class Fuse : public Decoder {
 public:
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    std::string all;
    for (const auto& t : tokens) all += t;
    return {all};
  }
};

class Strip : public Decoder {
 public:
  Strip(char32_t content, size_t start, size_t stop)
      : content_(content), start_(start), stop_(stop) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) {
      std::vector<std::pair<char32_t, size_t>> chars;  // the character, its byte offset
      for (size_t i = 0; i < t.size();) {
        size_t at = i;
        chars.emplace_back(next_code_point(t, i), at);
      }
      size_t begin = 0, end = chars.size();
      while (begin < std::min(start_, chars.size()) && chars[begin].first == content_) ++begin;
      for (size_t k = 0; k < stop_ && end > 0 && chars[end - 1].first == content_; ++k) --end;
      if (end <= begin) {
        t.clear();
      } else {
        size_t b = chars[begin].second, e = end < chars.size() ? chars[end].second : t.size();
        t = t.substr(b, e - b);
      }
    }
    return tokens;
  }

 private:
  char32_t content_;
  size_t start_, stop_;
};

class Replace : public Decoder {
 public:
  Replace(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (auto& t : tokens) t = replace_all(std::move(t), from_, to_);
    return tokens;
  }

 private:
  std::string from_, to_;
};

class BpeDecoder : public Decoder {
 public:
  explicit BpeDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = replace_all(std::move(tokens[i]), suffix_, i + 1 == tokens.size() ? "" : " ");
    }
    return tokens;
  }

 private:
  std::string suffix_;
};

class Sequence : public Decoder {
 public:
  explicit Sequence(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  std::vector<std::string> decode_chain(std::vector<std::string> tokens) const override {
    for (const auto& s : steps_) tokens = s->decode_chain(std::move(tokens));
    return tokens;
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace

std::unique_ptr<Decoder> parse_decoder(simdjson::dom::element e, const std::string& origin) {
  if (e.is_null()) return nullptr;
  const std::string type = json::type_of(e, origin, "decoder");
  if (type == "ByteLevel") return std::make_unique<ByteLevel>();
  if (type == "Metaspace") {
    bool prepend = json::bool_or(e, "add_prefix_space", true);
    if (json::has(e, "prepend_scheme")) prepend = json::string_or(e, "prepend_scheme", "") != "never";
    return std::make_unique<Metaspace>(json::string_or(e, "replacement", "\xE2\x96\x81"), prepend);
  }
  if (type == "WordPiece") {
    return std::make_unique<WordPiece>(json::string_or(e, "prefix", "##"),
                                       json::bool_or(e, "cleanup", true));
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallback>();
  if (type == "Fuse") return std::make_unique<Fuse>();
  if (type == "Strip") {
    std::string content = json::string_or(e, "content", " ");
    size_t i = 0;
    char32_t c = content.empty() ? U' ' : next_code_point(content, i);
    return std::make_unique<Strip>(c, static_cast<size_t>(json::int_or(e, "start", 0)),
                                   static_cast<size_t>(json::int_or(e, "stop", 0)));
  }
  if (type == "Replace") {
    simdjson::dom::element pattern;
    if (e["pattern"].get(pattern) != simdjson::SUCCESS || !json::has(pattern, "String")) {
      throw InvalidArgument(origin + ": decoder Replace with a Regex pattern is not supported "
                                     "(a String pattern is)");
    }
    return std::make_unique<Replace>(json::string_or(pattern, "String", ""),
                                     json::string_or(e, "content", ""));
  }
  if (type == "BPEDecoder") return std::make_unique<BpeDecoder>(json::string_or(e, "suffix", "</w>"));
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> steps;
    simdjson::dom::array items;
    if (e["decoders"].get(items) == simdjson::SUCCESS) {
      for (auto item : items) steps.push_back(parse_decoder(item, origin));
    }
    return std::make_unique<Sequence>(std::move(steps));
  }
  throw InvalidArgument(origin + ": decoder " + type +
                        " is not supported (ByteLevel, Metaspace, WordPiece, ByteFallback, Fuse, "
                        "Strip, Replace, BPEDecoder, Sequence are)");
}

}  // namespace stoker::text
