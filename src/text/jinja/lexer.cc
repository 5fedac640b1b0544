// lex (lexer.h): jinja2's lexer (jinja2/lexer.py) with trim_blocks and lstrip_blocks. The
// whitespace rules follow its regexes step by step: `{%-`/`-%}` strip all whitespace;
// lstrip_blocks drops the spaces before a block or comment tag that starts its line (unless
// `{%+`); trim_blocks drops the one \n after a block or comment tag (unless `+%}`), not after
// `{% raw %}` (jinja2's raw rule has no such suffix).
#include "text/jinja/lexer.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "stoker/errors.h"
#include "text/jinja/value.h"

namespace stoker::text::jinja {

SourceMap::SourceMap(std::string_view src, std::string origin) : origin_(std::move(origin)) {
  line_starts_.push_back(0);
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\n') line_starts_.push_back(i + 1);
  }
}

std::pair<int, int> SourceMap::position(size_t offset) const {
  auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
  size_t line = it - line_starts_.begin();
  return {static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
}

void SourceMap::fail(size_t offset, const std::string& what) const {
  auto [line, column] = position(offset);
  throw InvalidArgument(origin_ + ":" + std::to_string(line) + ":" + std::to_string(column) + ": " +
                        what);
}

namespace {

bool space_at(std::string_view s, size_t i, size_t* len) {
  size_t j = i;
  char32_t c = next_code_point(s, j);
  *len = j - i;
  return is_space(c);
}

size_t skip_space(std::string_view s, size_t i) {
  size_t len;
  while (i < s.size() && space_at(s, i, &len)) i += len;
  return i;
}

// Python's str.rstrip() length.
size_t rstrip_end(std::string_view s) {
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    bool sp = space_at(s, i, &len);
    i += len;
    if (!sp) end = i;
  }
  return end;
}

bool all_space(std::string_view s) {
  if (s.empty()) return false;
  return skip_space(s, 0) == s.size();
}

class Lexer {
 public:
  Lexer(std::string_view src, const SourceMap& map) : src_(src), map_(map) {}

  [[noreturn]] void fail(size_t offset, const std::string& what) const { map_.fail(offset, what); }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t p = find_tag(pos);
      if (p == src_.npos) {
        emit(Tok::kData, std::string(src_.substr(pos)), pos);
        break;
      }
      char kind = src_[p + 1];
      size_t q = p + 2;
      char sign = (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) ? src_[q] : 0;
      size_t raw_end = kind == '%' ? match_raw(p, "raw") : 0;
      std::string_view text = src_.substr(pos, p - pos);
      text = strip_before(text, sign, kind != '{', line_starting);
      if (!text.empty()) emit(Tok::kData, std::string(text), pos);
      if (raw_end) {
        pos = lex_raw(raw_end, &line_starting);
      } else if (kind == '#') {
        pos = lex_comment(q + (sign ? 1 : 0), p, &line_starting);
      } else {
        pos = lex_tag(kind == '%', q + (sign ? 1 : 0), p, &line_starting);
      }
    }
    tokens_.push_back({Tok::kEof, "", src_.size()});
    return std::move(tokens_);
  }

 private:
  void emit(Tok t, std::string text, size_t offset) {
    tokens_.push_back({t, std::move(text), offset});
  }

  size_t find_tag(size_t pos) const {
    for (size_t p = src_.find('{', pos); p != src_.npos; p = src_.find('{', p + 1)) {
      if (p + 1 < src_.size() && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#')) {
        return p;
      }
    }
    return src_.npos;
  }

  // The text before a tag, as the lexer's OptionalLStrip leaves it.
  std::string_view strip_before(std::string_view text, char sign, bool lstrip,
                                bool line_starting) const {
    if (sign == '-') return text.substr(0, rstrip_end(text));
    if (sign != '+' && lstrip) {
      size_t l = text.rfind('\n');
      l = l == text.npos ? 0 : l + 1;
      if ((l > 0 || line_starting) && all_space(text.substr(l))) return text.substr(0, l);
    }
    return text;
  }

  // `{%(-|+|)\s*<word>\s*(-%}\s*|%})` at p for raw (no trim_blocks after it, as jinja2's rule
  // has none), or `...(+%}|-%}\s*|%}\n?)` for endraw: the end of the match, or 0.
  size_t match_raw(size_t p, std::string_view word, bool trim = false) const {
    size_t i = p + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    i = skip_space(src_, i);
    if (src_.compare(i, word.size(), word) != 0) return 0;
    i += word.size();
    if (i < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[i])) || src_[i] == '_')) {
      return 0;
    }
    i = skip_space(src_, i);
    if (trim && src_.compare(i, 3, "+%}") == 0) return i + 3;
    if (src_.compare(i, 3, "-%}") == 0) return skip_space(src_, i + 3);
    if (src_.compare(i, 2, "%}") == 0) {
      i += 2;
      if (trim && i < src_.size() && src_[i] == '\n') ++i;
      return i;
    }
    return 0;
  }

  size_t lex_raw(size_t begin, bool* line_starting) {
    *line_starting = src_[begin - 1] == '\n';
    for (size_t p = src_.find("{%", begin); p != src_.npos; p = src_.find("{%", p + 1)) {
      size_t end = match_raw(p, "endraw", true);
      if (!end) continue;
      char sign = (src_[p + 2] == '-' || src_[p + 2] == '+') ? src_[p + 2] : 0;
      std::string_view text =
          strip_before(src_.substr(begin, p - begin), sign, true, *line_starting);
      if (!text.empty()) emit(Tok::kData, std::string(text), begin);
      *line_starting = src_[end - 1] == '\n';
      return end;
    }
    fail(begin, "missing end of raw directive ({% endraw %})");
  }

  size_t lex_comment(size_t i, size_t start, bool* line_starting) {
    for (size_t h = src_.find("#}", i); h != src_.npos; h = src_.find("#}", h + 1)) {
      size_t end = h + 2;
      if (h > i && src_[h - 1] == '-') {
        end = skip_space(src_, end);
      } else if (h > i && src_[h - 1] == '+') {
      } else if (end < src_.size() && src_[end] == '\n') {
        ++end;
      }
      *line_starting = src_[end - 1] == '\n';
      return end;
    }
    fail(start, "missing end of comment tag");
  }

  size_t lex_tag(bool block, size_t i, size_t start, bool* line_starting) {
    emit(block ? Tok::kBlockBegin : Tok::kVarBegin, "", start);
    int depth = 0;
    for (;;) {
      i = skip_space(src_, i);
      if (i >= src_.size())
        fail(start, block ? "missing end of block tag (%})" : "missing end of print tag (}})");
      if (depth == 0) {
        size_t end = 0;
        if (block) {
          if (src_.compare(i, 3, "+%}") == 0) {
            end = i + 3;
          } else if (src_.compare(i, 3, "-%}") == 0) {
            end = skip_space(src_, i + 3);
          } else if (src_.compare(i, 2, "%}") == 0) {
            end = i + 2;
            if (end < src_.size() && src_[end] == '\n') ++end;
          }
        } else if (src_.compare(i, 3, "-}}") == 0) {
          end = skip_space(src_, i + 3);
        } else if (src_.compare(i, 2, "}}") == 0) {
          end = i + 2;
        }
        if (end) {
          emit(block ? Tok::kBlockEnd : Tok::kVarEnd, "", i);
          *line_starting = src_[end - 1] == '\n';
          return end;
        }
      }
      i = lex_token(i, &depth);
    }
  }

  size_t lex_token(size_t i, int* depth) {
    char c = src_[i];
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number(i);
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[j])) || src_[j] == '_')) {
        ++j;
      }
      emit(Tok::kName, std::string(src_.substr(i, j - i)), i);
      return j;
    }
    if (c == '\'' || c == '"') return lex_string(i);
    static const char* kOps2[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kOps2) {
      if (src_.compare(i, 2, op) == 0) {
        emit(Tok::kOp, op, i);
        return i + 2;
      }
    }
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      fail(i, std::string("unexpected character '") + c + "'");
    }
    if (c == '(' || c == '[' || c == '{') ++*depth;
    if (c == ')' || c == ']' || c == '}') {
      if (*depth == 0) fail(i, std::string("unexpected '") + c + "'");
      --*depth;
    }
    emit(Tok::kOp, std::string(1, c), i);
    return i + 1;
  }

  size_t lex_number(size_t i) {
    // jinja2's float_re and integer_re (decimal; underscores between digits).
    auto digits = [&](size_t k) {
      size_t j = k;
      while (j < src_.size() && (std::isdigit((unsigned char)src_[j]) ||
                                 (src_[j] == '_' && j + 1 < src_.size() &&
                                  std::isdigit((unsigned char)src_[j + 1]) && j > k))) {
        ++j;
      }
      return j;
    };
    if (src_[i] == '0' && i + 1 < src_.size() && std::strchr("bBoOxX", src_[i + 1])) {
      fail(i, "binary, octal and hexadecimal literals are not supported");
    }
    size_t j = digits(i);
    bool is_float = false;
    if (j + 1 < src_.size() && src_[j] == '.' && std::isdigit((unsigned char)src_[j + 1])) {
      j = digits(j + 1);
      is_float = true;
    }
    if (j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
      size_t k = j + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && std::isdigit((unsigned char)src_[k])) {
        j = digits(k);
        is_float = true;
      }
    }
    std::string text;
    for (size_t k = i; k < j; ++k) {
      if (src_[k] != '_') text += src_[k];
    }
    Token t{is_float ? Tok::kFloat : Tok::kInt, text, i};
    errno = 0;
    if (is_float) {
      t.real = std::strtod(text.c_str(), nullptr);
    } else {
      t.integer = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) fail(i, "integer literal beyond 64 bits: " + text);
    }
    tokens_.push_back(std::move(t));
    return j;
  }

  size_t lex_string(size_t i) {
    char quote = src_[i];
    std::string out;
    size_t j = i + 1;
    for (;;) {
      if (j >= src_.size()) fail(i, "unterminated string literal");
      char c = src_[j];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++j;
        continue;
      }
      if (j + 1 >= src_.size()) fail(i, "unterminated string literal");
      char e = src_[j + 1];
      j += 2;
      auto hex = [&](int n) {
        if (j + n > src_.size()) fail(i, "truncated \\x, \\u or \\U escape in a string literal");
        char32_t v = 0;
        for (int k = 0; k < n; ++k) {
          char h = src_[j + k];
          if (!std::isxdigit(static_cast<unsigned char>(h))) {
            fail(i, "truncated \\x, \\u or \\U escape in a string literal");
          }
          v = v * 16 +
              (std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (h | 0x20) - 'a' + 10);
        }
        j += n;
        append_utf8(v, out);
      };
      switch (e) {
        case '\n':
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          hex(2);
          break;
        case 'u':
          hex(4);
          break;
        case 'U':
          hex(8);
          break;
        case 'N':
          fail(j - 2, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = e - '0';
            for (int k = 0; k < 2 && j < src_.size() && src_[j] >= '0' && src_[j] <= '7'; ++k) {
              v = v * 8 + (src_[j++] - '0');
            }
            append_utf8(v, out);
          } else {
            out += '\\';
            --j;  // Python keeps an unknown escape as it is
          }
      }
    }
    emit(Tok::kString, std::move(out), i);
    return j + 1;
  }

  std::string_view src_;
  const SourceMap& map_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view src, const SourceMap& map) { return Lexer(src, map).run(); }

}  // namespace stoker::text::jinja
