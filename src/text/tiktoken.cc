#include "text/tiktoken.h"

#include <charconv>

#include "stoker/errors.h"

namespace stoker::text {
namespace {

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}

// Standard base64 with its padding; nullopt where `s` is not that.
std::optional<std::string> base64_decode(std::string_view s) {
  while (!s.empty() && s.back() == '=') s.remove_suffix(1);
  std::string out;
  uint32_t bits = 0;
  int held = 0;
  for (char c : s) {
    const int v = base64_value(c);
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    held += 6;
    if (held >= 8) {
      held -= 8;
      out += static_cast<char>((bits >> held) & 0xFF);
    }
  }
  return out;
}

struct Line {
  std::string_view token, rank;
};

std::optional<Line> split_line(std::string_view line) {
  const size_t space = line.find(' ');
  if (space == std::string_view::npos || space == 0) return std::nullopt;
  Line l{line.substr(0, space), line.substr(space + 1)};
  if (l.rank.empty() || l.rank.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  return l;
}

const char* kEndOfText = "<|endoftext|>";
const char* kFimPrefix = "<|fim_prefix|>";
const char* kFimMiddle = "<|fim_middle|>";
const char* kFimSuffix = "<|fim_suffix|>";
const char* kEndOfPrompt = "<|endofprompt|>";

const char* kR50kPattern =
    R"('(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s)";
const char* kCl100kPattern =
    R"('(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+)"
    R"(| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s)";
const char* kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+)"
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*)"
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

bool looks_like_tiktoken(std::string_view bytes) {
  const size_t end = bytes.find('\n');
  std::string_view first = bytes.substr(0, end);
  if (!first.empty() && first.back() == '\r') first.remove_suffix(1);
  const auto line = split_line(first);
  return line && base64_decode(line->token).has_value();
}

std::vector<std::pair<std::string, int32_t>> parse_tiktoken(std::string_view bytes,
                                                            const std::string& origin) {
  std::vector<std::pair<std::string, int32_t>> ranks;
  size_t number = 0;
  for (size_t at = 0; at < bytes.size();) {
    size_t end = bytes.find('\n', at);
    if (end == std::string_view::npos) end = bytes.size();
    std::string_view text = bytes.substr(at, end - at);
    at = end + 1;
    ++number;
    if (!text.empty() && text.back() == '\r') text.remove_suffix(1);
    if (text.empty()) continue;
    const auto line = split_line(text);
    std::optional<std::string> token = line ? base64_decode(line->token) : std::nullopt;
    int64_t rank = -1;
    if (line) std::from_chars(line->rank.data(), line->rank.data() + line->rank.size(), rank);
    if (!token || rank < 0 || rank > INT32_MAX) {
      throw InvalidArgument(origin + ": line " + std::to_string(number) +
                            " of a tiktoken file is not \"<base64 token> <rank>\"");
    }
    ranks.emplace_back(std::move(*token), static_cast<int32_t>(rank));
  }
  return ranks;
}

std::optional<TiktokenEncoding> known_tiktoken_encoding(std::string_view name) {
  if (name == "r50k_base" || name == "p50k_base") {
    return TiktokenEncoding{kR50kPattern, {{kEndOfText, 50256}}};
  }
  if (name == "p50k_edit") {
    return TiktokenEncoding{
        kR50kPattern,
        {{kEndOfText, 50256}, {kFimPrefix, 50281}, {kFimMiddle, 50282}, {kFimSuffix, 50283}}};
  }
  if (name == "cl100k_base") {
    return TiktokenEncoding{kCl100kPattern,
                            {{kEndOfText, 100257},
                             {kFimPrefix, 100258},
                             {kFimMiddle, 100259},
                             {kFimSuffix, 100260},
                             {kEndOfPrompt, 100276}}};
  }
  if (name == "o200k_base") {
    return TiktokenEncoding{kO200kPattern, {{kEndOfText, 199999}, {kEndOfPrompt, 200018}}};
  }
  return std::nullopt;
}

const char* known_tiktoken_names() {
  return "cl100k_base, o200k_base, r50k_base, p50k_base, p50k_edit";
}

}  // namespace stoker::text
