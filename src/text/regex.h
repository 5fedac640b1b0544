// A compiled PCRE2 pattern (UTF, Unicode properties, JIT where available). Immutable after
// construction: find_all() is safe from many threads (each call has its own match data).
// Private to src/text/.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stoker::text {

class Regex {
 public:
  // Throws InvalidArgument naming `what` when the pattern does not compile.
  Regex(const std::string& pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [begin, end) byte ranges of the non-overlapping matches, left to right (an empty match
  // advances one character). `s` must be valid UTF-8. Throws stoker::Error when PCRE2 stops on a
  // resource limit rather than return fewer matches.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const;

  static std::string escape(std::string_view literal);

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace stoker::text
