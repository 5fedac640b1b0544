#include "text/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <memory>

namespace stoker::text {

size_t utf8_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  size_t n = std::min(utf8_length(p[0]), s.size() - i);
  char32_t c = n == 1 ? p[0] : (p[0] & (0x7F >> n));
  for (size_t k = 1; k < n; ++k) c = (c << 6) | (p[k] & 0x3F);
  i += n;
  return c;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// The length of a valid UTF-8 sequence at s[i], or 0 with `bad` set to how many bytes form the
// maximal invalid subpart (Unicode's "substitution of maximal subparts", as Rust does).
static size_t valid_sequence(std::string_view s, size_t i, size_t& bad) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  unsigned char b0 = p[i];
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    bad = 1;
    return 0;
  }
  for (size_t k = 1; k < need; ++k) {
    unsigned char b = i + k < n ? p[i + k] : 0;
    bool ok = i + k < n && (k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF));
    if (!ok) {
      bad = k;
      return 0;
    }
  }
  return need;
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t bad = 0, n = valid_sequence(s, i, bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t bad = 0, n = valid_sequence(s, i, bad);
    if (n == 0) {
      out += "\xEF\xBF\xBD";
      i += bad;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

bool is_whitespace(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

static utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

bool is_alphanumeric(char32_t c) {
  auto k = category(c);
  return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
         (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}
bool is_numeric(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}
bool is_punctuation(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO;
}
bool is_other(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_CC && k <= UTF8PROC_CATEGORY_CO;
}
bool is_mark(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_MN && k <= UTF8PROC_CATEGORY_ME;
}
bool is_mark_nonspacing(char32_t c) { return category(c) == UTF8PROC_CATEGORY_MN; }

std::string normalize(std::string_view s, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  // ASCII is the same in every form, and two ASCII characters side by side cut the text into
  // parts that normalize apart: each is a starter (combining class 0, so nothing reorders across
  // it, and it blocks a composition across it), and no composition has an ASCII second
  // character nor two ASCII characters. So only the parts with other characters go to utf8proc,
  // each with the ASCII character before it (it may compose with a mark after it).
  auto ascii = [&](size_t k) { return static_cast<unsigned char>(s[k]) < 0x80; };
  std::string out;
  out.reserve(s.size());
  for (size_t at = 0; at < s.size();) {
    size_t other = at;  // the next byte that is not ASCII
    while (other < s.size() && ascii(other)) ++other;
    if (other == s.size()) {
      out.append(s.substr(at));
      break;
    }
    const size_t begin = other > at ? other - 1 : other;
    out.append(s.substr(at, begin - at));
    size_t end = other;  // past the next ASCII character that an ASCII character follows
    while (end < s.size() && !(ascii(end) && (end + 1 == s.size() || ascii(end + 1)))) ++end;
    end = std::min(end + 1, s.size());
    utf8proc_uint8_t* part = nullptr;
    auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + begin),
                          static_cast<utf8proc_ssize_t>(end - begin), &part,
                          static_cast<utf8proc_option_t>(options));
    std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(part, &std::free);
    if (n < 0) {  // invalid input never reaches here (encode checks it)
      out.append(s.substr(begin, end - begin));
    } else {
      out.append(reinterpret_cast<const char*>(part), static_cast<size_t>(n));
    }
    at = end;
  }
  return out;
}

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t c = next_code_point(s, i);
    if (c == 0x130) {  // the one full (multi-character) lowercase mapping: İ -> i + combining dot
      out += "i\xCC\x87";
      continue;
    }
    append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  }
  return out;
}

int combining_class(char32_t c) {
  return utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class;
}

void decompose(char32_t c, bool compat, std::vector<char32_t>& out) {
  utf8proc_int32_t buf[32];
  int last_boundclass = 0;
  const int options = UTF8PROC_DECOMPOSE | (compat ? UTF8PROC_COMPAT : 0);
  auto n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), buf, 32,
                                   static_cast<utf8proc_option_t>(options), &last_boundclass);
  out.clear();
  if (n < 0 || n > 32) {
    out.push_back(c);
    return;
  }
  for (utf8proc_ssize_t i = 0; i < n; ++i) out.push_back(static_cast<char32_t>(buf[i]));
}

std::optional<char32_t> compose(char32_t starter, char32_t c) {
  if (c < 0x300) return std::nullopt;  // no composition has a second character below U+0300
  utf8proc_int32_t buf[2] = {static_cast<utf8proc_int32_t>(starter),
                             static_cast<utf8proc_int32_t>(c)};
  if (utf8proc_normalize_utf32(buf, 2, UTF8PROC_COMPOSE) != 1) return std::nullopt;
  return static_cast<char32_t>(buf[0]);
}

namespace {
struct ByteMap {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 324> to_byte;  // the characters used are all below U+0144
  ByteMap() {
    to_byte.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      char32_t c = printable ? static_cast<char32_t>(b) : static_cast<char32_t>(256 + n++);
      append_utf8(to_unicode[b], c);
      to_byte[c] = static_cast<int16_t>(b);
    }
  }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}
}  // namespace

const std::string& byte_to_unicode(uint8_t b) { return byte_map().to_unicode[b]; }
int unicode_to_byte(char32_t c) { return c < 324 ? byte_map().to_byte[c] : -1; }

}  // namespace stoker::text
