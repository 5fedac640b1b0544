// Where each byte of a normalized text came from, kept as `tokenizers`' NormalizedString keeps it
// (its `alignments`), so that token offsets equal Encoding.offsets: every normalized byte maps to
// the original bytes [begin, end) of the character it was made from. Only encode_with_offsets()
// builds these; encode() runs the same stages on plain strings. Private to src/text/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "stoker/text/tokenizer.h"
#include "text/unicode.h"

namespace stoker::text {

using Alignment = std::vector<TokenSpan>;

// A normalized text and, per byte, the original bytes it stands for (absolute offsets into the
// text given to encode). `origin` is where this text starts in the original (NormalizedString's
// original_shift): a character inserted before any other is aligned to the empty range there.
struct AlignedText {
  std::string text;
  Alignment align;
  uint32_t origin = 0;

  // `original` unchanged, starting at byte `origin` of the whole text.
  static AlignedText identity(std::string_view original, uint32_t origin);
  // The bytes [begin, end) (character boundaries) and their alignment.
  AlignedText slice(size_t begin, size_t end) const;
  // The original bytes of the normalized bytes [begin, end): NormalizedString::convert_offsets.
  TokenSpan original(size_t begin, size_t end) const;
};

// One character of a transformed text, as NormalizedString::transform takes it: change 0 replaces
// the next character of the old text, -n replaces it and removes the n after it, 1 inserts.
struct Change {
  char32_t c;
  int32_t change;
};

// NormalizedString::transform over the whole text: `initial_removed` characters of the old text
// are dropped first; each changed character gets the alignment of the old character it replaces,
// an inserted one that of the old byte before it.
void transform(AlignedText& t, const std::vector<Change>& changes, size_t initial_removed);
// The characters of normalize(s, form) with their changes, as `tokenizers` gets them.
std::vector<Change> normalize_changes(std::string_view s, NormalForm form);
// NormalizedString::prepend: `prefix` aligned to the first character (nothing when t is empty).
void prepend(AlignedText& t, std::string_view prefix);

}  // namespace stoker::text
