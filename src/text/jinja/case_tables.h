// Python's full case mappings (str.upper, str.lower, str.title of each code point), generated from
// Python's Unicode database by gen_case_tables.py. Private to src/text/.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stoker::text::jinja {

struct CaseSingle {
  uint32_t from, to;
};
struct CaseMulti {
  uint32_t from;
  const char* to;  // UTF-8, several code points
};
struct CaseTable {
  const CaseSingle* single;
  size_t single_size;
  const CaseMulti* multi;
  size_t multi_size;
};

// Sorted by code point; a code point in neither array maps to itself.
extern const CaseTable kUpperTable, kLowerTable, kTitleTable;

}  // namespace stoker::text::jinja
