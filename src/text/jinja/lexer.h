// jinja2's lexer (lexer.cc), for parse.cc: a template's text as tokens, the template data among
// them already stripped as trim_blocks, lstrip_blocks and `-`/`+` say. Private to src/text/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stoker::text::jinja {

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

// Line and column of a byte offset of the (newline-normalized) source, for errors.
class SourceMap {
 public:
  SourceMap(std::string_view src, std::string origin);
  std::pair<int, int> position(size_t offset) const;  // 1-based line and column (bytes)
  // Throws InvalidArgument "origin:line:column: what".
  [[noreturn]] void fail(size_t offset, const std::string& what) const;

 private:
  std::string origin_;
  std::vector<size_t> line_starts_;
};

// REQUIRES: `src` has \n line ends only (parse_template normalizes them). Throws through `map`.
std::vector<Token> lex(std::string_view src, const SourceMap& map);

}  // namespace stoker::text::jinja
