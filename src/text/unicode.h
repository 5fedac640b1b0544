// UTF-8 and Unicode helpers of the text wing, over utf8proc: code points, general categories,
// normalization forms, case, and GPT-2's byte-to-character map. Private to src/text/.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace stoker::text {

// Decodes the code point at s[i] (s is valid UTF-8) and advances i past it.
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(std::string& out, char32_t c);
size_t utf8_length(unsigned char lead);  // 1 to 4 (1 for a stray byte)
bool valid_utf8(std::string_view s);
// Bytes as UTF-8, each maximal invalid subsequence replaced by U+FFFD (Rust's from_utf8_lossy).
std::string utf8_lossy(std::string_view bytes);

// Properties as Rust's char methods see them (which `tokenizers` calls).
bool is_whitespace(char32_t c);   // White_Space
bool is_alphanumeric(char32_t c);  // letters and numbers
bool is_numeric(char32_t c);      // Nd, Nl, No
bool is_punctuation(char32_t c);  // P*
bool is_other(char32_t c);        // Cc, Cf, Cs, Co: not Cn (as the unicode_categories crate)
bool is_mark(char32_t c);         // M*
bool is_mark_nonspacing(char32_t c);  // Mn

enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
std::string normalize(std::string_view s, NormalForm form);
std::string lowercase(std::string_view s);  // per character, full mappings (Rust's to_lowercase)
// One character at a time, for the alignment of normalized text (text/alignment.h).
int combining_class(char32_t c);
// The full canonical (or, with compat, compatibility) decomposition of c into `out`.
void decompose(char32_t c, bool compat, std::vector<char32_t>& out);
// The primary composite of a starter and the character after it, where there is one.
std::optional<char32_t> compose(char32_t starter, char32_t c);

// GPT-2's reversible map of the 256 bytes to printable characters (as UTF-8), and back.
const std::string& byte_to_unicode(uint8_t b);
// The byte a character stands for, or -1 when it is none of the 256.
int unicode_to_byte(char32_t c);

}  // namespace stoker::text
