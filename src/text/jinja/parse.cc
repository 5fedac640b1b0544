// parse_template (ast.h): jinja2's lexer (jinja2/lexer.py, with trim_blocks and lstrip_blocks) and
// parser (jinja2/parser.py), for the subset ast.h holds. The whitespace rules follow the lexer's
// regexes step by step: newlines normalized to \n and one trailing newline dropped; `{%-`/`-%}`
// strip all whitespace; lstrip_blocks drops the spaces before a block or comment tag that starts
// its line (unless `{%+`); trim_blocks drops the one \n after a block or comment tag (unless
// `+%}`).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "stoker/errors.h"
#include "text/jinja/ast.h"

namespace stoker::text::jinja {

namespace {

enum class Tok {
  kData,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string text;  // data, name, operator, or a string literal's value
  size_t offset;
  int64_t integer = 0;
  double real = 0;
};

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
  Lexer(std::string_view src, const std::string& origin) : src_(src), origin_(origin) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  [[noreturn]] void fail(size_t offset, const std::string& what) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = it - line_starts_.begin();
    size_t column = offset - line_starts_[line - 1] + 1;
    throw InvalidArgument(origin_ + ":" + std::to_string(line) + ":" + std::to_string(column) +
                          ": " + what);
  }
  std::pair<int, int> position(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t line = it - line_starts_.begin();
    return {static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

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
    auto digit = [&](size_t k) { return k < src_.size() && std::isdigit((unsigned char)src_[k]); };
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
    (void)digit;
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
  const std::string& origin_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

// Tags inside tags, and expressions inside brackets or after unary operators: the parser
// recurses on each (chat_template.h states the limit).
constexpr int kMaxNesting = 100;

class Parser {
 public:
  Parser(std::vector<Token> tokens, const Lexer& lexer, ChatTemplate::Parsed& out)
      : t_(std::move(tokens)), lexer_(lexer), out_(out) {}

  Body parse_all() {
    Body body = subparse({});
    if (cur().type != Tok::kEof) fail("unexpected tag '" + cur().text + "'");
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  void advance() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  [[noreturn]] void fail(const std::string& what) const { lexer_.fail(cur().offset, what); }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().text == n; }
  std::string describe() const {
    switch (cur().type) {
      case Tok::kEof:
        return "end of template";
      case Tok::kBlockEnd:
        return "end of statement block";
      case Tok::kVarEnd:
        return "end of print statement";
      case Tok::kData:
        return "template data";
      case Tok::kString:
        return "string literal";
      default:
        return "'" + cur().text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', got " + describe());
    advance();
  }
  void expect_name(const char* n) {
    if (!is_name(n)) fail(std::string("expected '") + n + "', got " + describe());
    advance();
  }
  std::string expect_identifier() {
    if (cur().type != Tok::kName) fail("expected a name, got " + describe());
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) fail("expected end of statement block, got " + describe());
    advance();
  }
  template <class T>
  void locate(T& node) const {
    auto [line, column] = lexer_.position(cur().offset);
    node.line = line;
    node.column = column;
  }
  ExprPtr make(Expr::Kind kind) const {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    locate(*e);
    return e;
  }

  // Nodes up to a block tag named in `ends` (left current: its name).
  Body subparse(std::initializer_list<const char*> ends) {
    Nested nested(*this);
    Body body;
    for (;;) {
      switch (cur().type) {
        case Tok::kData: {
          Node n;
          n.kind = Node::Kind::kText;
          locate(n);
          n.text = cur().text;
          body.push_back(std::move(n));
          advance();
          break;
        }
        case Tok::kVarBegin: {
          advance();
          Node n;
          n.kind = Node::Kind::kPrint;
          locate(n);
          n.expr = parse_tuple(true, {}, false);
          if (cur().type != Tok::kVarEnd)
            fail("expected end of print statement, got " + describe());
          advance();
          body.push_back(std::move(n));
          break;
        }
        case Tok::kBlockBegin: {
          advance();
          if (cur().type == Tok::kName) {
            for (const char* e : ends) {
              if (cur().text == e) return body;
            }
          }
          body.push_back(parse_statement());
          break;
        }
        case Tok::kEof:
          if (ends.size()) {
            std::string want;
            for (const char* e : ends)
              want += std::string(want.empty() ? "" : " or ") + "'" + e + "'";
            fail("unexpected end of template, expected " + want);
          }
          return body;
        default:
          fail("unexpected " + describe());
      }
    }
  }

  // Counts one level of the parser's recursion while it lives.
  class Nested {
   public:
    explicit Nested(Parser& p) : p_(p) {
      if (++p_.nesting_ > kMaxNesting) {
        --p_.nesting_;
        p_.fail("nested deeper than " + std::to_string(kMaxNesting) + " levels");
      }
    }
    ~Nested() { --p_.nesting_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    Parser& p_;
  };

  // The body of a tag up to `end` (consumed).
  Body parse_body(const char* end) {
    Body b = subparse({end});
    advance();
    expect_block_end();
    return b;
  }

  Node parse_statement() {
    if (cur().type != Tok::kName) fail("expected a tag name, got " + describe());
    Node n;
    n.kind = Node::Kind::kText;
    locate(n);
    std::string tag = cur().text;
    advance();
    if (tag == "if") {
      n.kind = Node::Kind::kIf;
      for (;;) {
        ExprPtr cond = parse_tuple(false, {}, false);
        expect_block_end();
        Body body = subparse({"elif", "else", "endif"});
        n.branches.emplace_back(std::move(cond), std::move(body));
        std::string which = cur().text;
        advance();
        if (which == "elif") continue;
        if (which == "else") {
          expect_block_end();
          n.branches.emplace_back(nullptr, parse_body("endif"));
        } else {
          expect_block_end();
        }
        break;
      }
    } else if (tag == "for") {
      n.kind = Node::Kind::kFor;
      n.target = parse_target(false, "in");
      expect_name("in");
      n.expr = parse_tuple(false, {"recursive"}, false);
      if (is_name("if")) {
        advance();
        n.condition = parse_expression(true);
      }
      if (is_name("recursive")) fail("recursive for loops are not supported");
      expect_block_end();
      ++loops_;
      n.body = subparse({"endfor", "else"});
      --loops_;
      bool has_else = cur().text == "else";
      advance();
      expect_block_end();
      if (has_else) n.else_body = parse_body("endfor");
    } else if (tag == "set") {
      n.target = parse_target(true, nullptr);
      if (is_op("=")) {
        advance();
        n.kind = Node::Kind::kSet;
        n.expr = parse_tuple(true, {}, false);
        expect_block_end();
      } else {
        n.kind = Node::Kind::kSetBlock;
        if (n.target.unpack || !n.target.attribute.empty()) fail("a set block assigns one name");
        if (is_op("|")) n.expr = parse_filters(nullptr);
        expect_block_end();
        n.body = parse_body("endset");
      }
    } else if (tag == "macro") {
      n.kind = Node::Kind::kMacro;
      n.name = expect_identifier();
      parse_signature(n);
      expect_block_end();
      int saved = loops_;
      loops_ = 0;
      n.body = parse_body("endmacro");
      loops_ = saved;
    } else if (tag == "call") {
      n.kind = Node::Kind::kCallBlock;
      if (is_op("(")) parse_signature(n);
      n.expr = parse_expression(true);
      if (n.expr->kind != Expr::Kind::kCall) fail("expected a call after 'call'");
      expect_block_end();
      int saved = loops_;
      loops_ = 0;
      n.body = parse_body("endcall");
      loops_ = saved;
    } else if (tag == "filter") {
      n.kind = Node::Kind::kFilterBlock;
      n.expr = parse_filters(nullptr, true);
      expect_block_end();
      n.body = parse_body("endfilter");
    } else if (tag == "with") {
      n.kind = Node::Kind::kWith;
      while (cur().type != Tok::kBlockEnd) {
        if (!n.assignments.empty()) expect_op(",");
        Target t = parse_target(false, nullptr);
        expect_op("=");
        n.assignments.emplace_back(std::move(t), parse_expression(true));
      }
      advance();
      n.body = parse_body("endwith");
    } else if (tag == "generation") {
      n.kind = Node::Kind::kGeneration;
      out_.marks_generation = true;
      expect_block_end();
      n.body = parse_body("endgeneration");
    } else if (tag == "break" || tag == "continue") {
      if (loops_ == 0) lexer_.fail(t_[i_ - 1].offset, "'" + tag + "' outside of a for loop");
      n.kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expect_block_end();
    } else {
      lexer_.fail(t_[i_ - 1].offset, tag.rfind("end", 0) == 0 || tag == "elif" || tag == "else"
                                         ? "unexpected tag '" + tag + "'"
                                         : "unsupported tag '" + tag +
                                               "' (chat templates render alone: no include, "
                                               "extends, import, block or do)");
    }
    return n;
  }

  void parse_signature(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (!n.params.empty()) expect_op(",");
      if (is_op(")")) break;
      n.params.push_back(expect_identifier());
      if (is_op("=")) {
        advance();
        n.defaults.push_back(parse_expression(true));
      } else {
        n.defaults.push_back(nullptr);
      }
    }
    advance();
  }

  // for/set/with targets: a name, names (a, b), or with namespaces ns.attr.
  Target parse_target(bool with_namespace, const char* end_name) {
    Target t;
    if (with_namespace && cur().type == Tok::kName && peek().type == Tok::kOp &&
        peek().text == ".") {
      t.names.push_back(cur().text);
      advance();
      advance();
      t.attribute = expect_identifier();
      return t;
    }
    bool parens = is_op("(");
    if (parens) advance();
    for (;;) {
      if (cur().type != Tok::kName) fail("expected a name to assign to, got " + describe());
      t.names.push_back(cur().text);
      advance();
      if (!is_op(",")) break;
      t.unpack = true;
      advance();
      if ((end_name && is_name(end_name)) || is_op("=") || is_op(")")) break;
    }
    if (parens) {
      expect_op(")");
      t.unpack = true;
    }
    return t;
  }

  bool tuple_end(std::initializer_list<const char*> extra) const {
    if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || is_op(")")) return true;
    for (const char* e : extra) {
      if (is_name(e)) return true;
    }
    return false;
  }

  ExprPtr parse_tuple(bool condexpr, std::initializer_list<const char*> extra, bool parens) {
    ExprPtr tuple = make(Expr::Kind::kTuple);
    bool is_tuple = false;
    for (;;) {
      if (!tuple->children.empty()) expect_op(",");
      if (tuple_end(extra)) break;
      tuple->children.push_back(parse_expression(condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!tuple->children.empty()) return std::move(tuple->children[0]);
      if (!parens) fail("expected an expression, got " + describe());
    }
    return tuple;
  }

  ExprPtr parse_expression(bool condexpr) {
    Nested nested(*this);
    if (!condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      ExprPtr c = make(Expr::Kind::kCondition);
      advance();
      c->children.push_back(parse_or());
      c->children.push_back(std::move(e));
      if (is_name("else")) {
        advance();
        c->children.push_back(parse_expression(true));
      } else {
        c->children.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, ExprPtr left, ExprPtr right) {
    ExprPtr e = make(kind);
    e->children.push_back(std::move(left));
    e->children.push_back(std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      advance();
      e = binary(Expr::Kind::kOr, std::move(e), parse_and());
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      advance();
      e = binary(Expr::Kind::kAnd, std::move(e), parse_not());
    }
    return e;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      Nested nested(*this);
      ExprPtr e = make(Expr::Kind::kNot);
      advance();
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    ExprPtr e = make(Expr::Kind::kCompare);
    e->children.push_back(std::move(first));
    for (;;) {
      Cmp c;
      if (is_op("==")) {
        c = Cmp::kEq;
      } else if (is_op("!=")) {
        c = Cmp::kNe;
      } else if (is_op("<")) {
        c = Cmp::kLt;
      } else if (is_op("<=")) {
        c = Cmp::kLe;
      } else if (is_op(">")) {
        c = Cmp::kGt;
      } else if (is_op(">=")) {
        c = Cmp::kGe;
      } else if (is_name("in")) {
        c = Cmp::kIn;
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        advance();
        c = Cmp::kNotIn;
      } else {
        break;
      }
      advance();
      e->cmps.push_back(c);
      e->children.push_back(parse_math1());
    }
    if (e->cmps.empty()) return std::move(e->children[0]);
    return e;
  }
  ExprPtr arith(Op op, ExprPtr left, ExprPtr right) {
    ExprPtr e = binary(Expr::Kind::kBinary, std::move(left), std::move(right));
    e->op = op;
    return e;
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      Op op = is_op("+") ? Op::kAdd : Op::kSub;
      advance();
      e = arith(op, std::move(e), parse_concat());
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      advance();
      e = arith(Op::kConcat, std::move(e), parse_math2());
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    for (;;) {
      Op op;
      if (is_op("*")) {
        op = Op::kMul;
      } else if (is_op("/")) {
        op = Op::kDiv;
      } else if (is_op("//")) {
        op = Op::kFloorDiv;
      } else if (is_op("%")) {
        op = Op::kMod;
      } else {
        break;
      }
      advance();
      e = arith(op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      advance();
      e = arith(Op::kPow, std::move(e), parse_unary(true));
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      Nested nested(*this);
      e = make(is_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos);
      advance();
      e->children.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr literal(Value v) {
    ExprPtr e = make(Expr::Kind::kLiteral);
    e->literal = std::move(v);
    advance();
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::kName: {
        const std::string& n = t.text;
        if (n == "true" || n == "True") return literal(Value::boolean(true));
        if (n == "false" || n == "False") return literal(Value::boolean(false));
        if (n == "none" || n == "None") return literal(Value::none());
        ExprPtr e = make(Expr::Kind::kName);
        e->name = n;
        advance();
        return e;
      }
      case Tok::kString: {
        ExprPtr e = make(Expr::Kind::kLiteral);
        std::string s;
        while (cur().type == Tok::kString) {
          s += cur().text;
          advance();
        }
        e->literal = Value::string(std::move(s));
        return e;
      }
      case Tok::kInt:
        return literal(Value::integer(t.integer));
      case Tok::kFloat:
        return literal(Value::real(t.real));
      case Tok::kOp:
        if (t.text == "(") {
          advance();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          ExprPtr e = make(Expr::Kind::kList);
          advance();
          while (!is_op("]")) {
            if (!e->children.empty()) expect_op(",");
            if (is_op("]")) break;
            e->children.push_back(parse_expression(true));
          }
          advance();
          return e;
        }
        if (t.text == "{") {
          ExprPtr e = make(Expr::Kind::kDict);
          advance();
          while (!is_op("}")) {
            if (!e->children.empty()) expect_op(",");
            if (is_op("}")) break;
            e->children.push_back(parse_expression(true));
            expect_op(":");
            e->children.push_back(parse_expression(true));
          }
          advance();
          return e;
        }
        [[fallthrough]];
      default:
        fail("unexpected " + describe());
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        advance();
        if (cur().type == Tok::kName) {
          ExprPtr g = make(Expr::Kind::kGetAttr);
          g->name = cur().text;
          advance();
          g->children.push_back(std::move(e));
          e = std::move(g);
        } else if (cur().type == Tok::kInt) {
          ExprPtr g = make(Expr::Kind::kGetItem);
          g->children.push_back(std::move(e));
          g->children.push_back(literal(Value::integer(cur().integer)));
          e = std::move(g);
        } else {
          fail("expected an attribute name after '.', got " + describe());
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr e) {
    ExprPtr g = make(Expr::Kind::kGetItem);
    advance();
    g->children.push_back(std::move(e));
    std::vector<ExprPtr> parts;  // a slice: start, stop, step
    bool slice = false;
    ExprPtr index;
    if (!is_op(":")) index = parse_expression(true);
    if (is_op(":")) {
      slice = true;
      advance();
      parts.push_back(std::move(index));
      parts.push_back(is_op("]") || is_op(":") ? nullptr : parse_expression(true));
      if (is_op(":")) {
        advance();
        parts.push_back(is_op("]") ? nullptr : parse_expression(true));
      } else {
        parts.push_back(nullptr);
      }
    } else if (is_op(",")) {
      fail("tuple subscripts are not supported");
    }
    expect_op("]");
    if (slice) {
      g->kind = Expr::Kind::kSlice;
      for (auto& p : parts) g->children.push_back(std::move(p));
    } else {
      g->children.push_back(std::move(index));
    }
    return g;
  }

  void parse_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (!e.args.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      Arg a;
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        a.name = cur().text;
        advance();
        advance();
      } else if (!e.args.empty() && !e.args.back().name.empty()) {
        fail("a positional argument after a keyword argument");
      }
      a.value = parse_expression(true);
      e.args.push_back(std::move(a));
    }
    advance();
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr c = make(Expr::Kind::kCall);
    c->children.push_back(std::move(callee));
    parse_args(*c);
    return c;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        e = parse_filters(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // `| name(args) | name ...` on `e` (null: a filter block's or set block's body).
  ExprPtr parse_filters(ExprPtr e, bool start_inline = false) {
    while (is_op("|") || start_inline) {
      if (!start_inline) advance();
      start_inline = false;
      ExprPtr f = make(Expr::Kind::kFilter);
      f->name = expect_identifier();
      if (is_op(".")) fail("dotted filter names are not supported");
      if (!find_filter(f->name, &f->filter)) {
        lexer_.fail(t_[i_ - 1].offset, "unsupported filter '" + f->name + "'");
      }
      if (is_op("(")) parse_args(*f);
      f->children.push_back(std::move(e));
      e = std::move(f);
    }
    return e;
  }

  ExprPtr parse_test(ExprPtr e) {
    ExprPtr t = make(Expr::Kind::kTest);
    advance();
    if (is_name("not")) {
      t->negated = true;
      advance();
    }
    if (cur().type == Tok::kName &&
        (cur().text == "none" || cur().text == "true" || cur().text == "false")) {
      t->name = cur().text;  // keywords as test names
    } else if (cur().type == Tok::kOp &&
               (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      t->name = cur().text;
    } else {
      if (cur().type != Tok::kName) fail("expected a test name, got " + describe());
      t->name = cur().text;
    }
    if (!find_test(t->name, &t->test)) fail("unsupported test '" + t->name + "'");
    advance();
    t->children.push_back(std::move(e));
    if (is_op("(")) {
      parse_args(*t);
    } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                cur().type == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("you cannot chain multiple tests with is");
      Arg a;
      a.value = parse_postfix(parse_primary());
      t->args.push_back(std::move(a));
    }
    return t;
  }

  std::vector<Token> t_;
  int nesting_ = 0;  // Nested levels now open
  size_t i_ = 0;
  const Lexer& lexer_;
  ChatTemplate::Parsed& out_;
  int loops_ = 0;
};

}  // namespace

void parse_template(std::string_view source, ChatTemplate::Parsed& out) {
  // jinja2 reads \r\n and \r as \n, and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  Lexer lexer(src, out.origin);
  Parser parser(lexer.run(), lexer, out);
  out.body = parser.parse_all();
}

}  // namespace stoker::text::jinja
