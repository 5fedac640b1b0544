// Python's str for templates (ops.h): its methods, full case mappings (case_tables.h), splitting
// and stripping on Python's whitespace, all on code points as Python counts them.
#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "text/jinja/case_tables.h"
#include "text/jinja/ops.h"

namespace stoker::text::jinja {

namespace {

[[noreturn]] void type_error(const std::string& what) { throw std::invalid_argument(what); }

const std::initializer_list<const char*> kStrMethods = {
    "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
    "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
    "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
    "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
    "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
    "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
    "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
    "swapcase",     "title",       "translate", "upper",      "zfill"};
utf8proc_category_t category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}
bool is_alpha(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
}
bool is_numeric(char32_t c) {
  auto k = category(c);
  return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}
bool is_decimal(char32_t c) { return category(c) == UTF8PROC_CATEGORY_ND; }

template <class P>
bool all_of_code_points(std::string_view s, P p) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size();) {
    if (!p(next_code_point(s, i))) return false;
  }
  return true;
}

// Python's str.islower/isupper: some cased character, and none of the other case.
bool py_is_case(std::string_view s, bool upper) {
  bool cased = false;
  for (size_t i = 0; i < s.size();) {
    char32_t c = next_code_point(s, i);
    auto k = category(c);
    if (k == UTF8PROC_CATEGORY_LT) return false;
    if (k == (upper ? UTF8PROC_CATEGORY_LL : UTF8PROC_CATEGORY_LU)) return false;
    if (k == (upper ? UTF8PROC_CATEGORY_LU : UTF8PROC_CATEGORY_LL)) cased = true;
  }
  return cased;
}

std::string replace(std::string_view s, std::string_view old, std::string_view with,
                    int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python inserts `with` before each code point and at the end.
    int64_t n = 0;
    size_t i = 0;
    while (i < s.size()) {
      if (count >= 0 && n >= count) break;
      out += with;
      ++n;
      size_t start = i;
      next_code_point(s, i);
      out.append(s.substr(start, i - start));
    }
    if (i < s.size()) {
      out.append(s.substr(i));
    } else if (count < 0 || n < count) {
      out += with;
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t f = s.find(old, pos);
    if (f == s.npos) break;
    out.append(s.substr(pos, f - pos));
    out += with;
    pos = f + old.size();
    ++n;
  }
  out.append(s.substr(pos));
  return out;
}

List split(std::string_view s, const Value& sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    // Runs of whitespace; leading and trailing whitespace ignored.
    std::vector<std::pair<size_t, size_t>> words;
    for (size_t i = 0; i < s.size();) {
      size_t start = i;
      char32_t c = next_code_point(s, i);
      if (is_space(c)) continue;
      size_t end = i;
      while (i < s.size()) {
        size_t k = i;
        if (is_space(next_code_point(s, k))) break;
        i = k;
        end = i;
      }
      words.emplace_back(start, end);
    }
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= words.size()) {
      for (auto [a, b] : words) parts.emplace_back(s.substr(a, b - a));
    } else if (!from_right) {
      for (int64_t k = 0; k < maxsplit; ++k) {
        parts.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
      }
      parts.emplace_back(s.substr(words[maxsplit].first));  // Python keeps its trailing spaces
    } else {
      size_t first = words.size() - maxsplit;
      parts.emplace_back(s.substr(0, words[first - 1].second));
      for (size_t k = first; k < words.size(); ++k) {
        parts.emplace_back(s.substr(words[k].first, words[k].second - words[k].first));
      }
    }
  } else {
    if (!sep.is_string()) type_error("must be str or None, not " + std::string(sep.type_name()));
    std::string_view d = sep.str();
    if (d.empty()) type_error("empty separator");
    if (!from_right) {
      size_t pos = 0;
      int64_t n = 0;
      for (;;) {
        size_t f = (maxsplit < 0 || n < maxsplit) ? s.find(d, pos) : s.npos;
        if (f == s.npos) break;
        parts.emplace_back(s.substr(pos, f - pos));
        pos = f + d.size();
        ++n;
      }
      parts.emplace_back(s.substr(pos));
    } else {
      size_t end = s.size();
      int64_t n = 0;
      std::vector<std::string> rev;
      for (;;) {
        if (!(maxsplit < 0 || n < maxsplit) || end < d.size()) break;
        size_t f = s.rfind(d, end - d.size());
        if (f == s.npos) break;
        rev.emplace_back(s.substr(f + d.size(), end - f - d.size()));
        end = f;
        ++n;
      }
      rev.emplace_back(s.substr(0, end));
      parts.assign(rev.rbegin(), rev.rend());
    }
  }
  List out;
  out.reserve(parts.size());
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

int64_t find(std::string_view s, std::string_view sub, bool from_right) {
  size_t f = from_right ? s.rfind(sub) : s.find(sub);
  if (f == s.npos) return -1;
  return static_cast<int64_t>(code_points(s.substr(0, f)));
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(code_points(s)) + 1;
  int64_t n = 0;
  for (size_t f = s.find(sub); f != s.npos; f = s.find(sub, f + sub.size())) ++n;
  return n;
}

bool affix(std::string_view s, const Value& arg, bool start) {
  auto one = [&](const Value& a) {
    if (!a.is_string()) {
      type_error(std::string(start ? "startswith" : "endswith") +
                 " first arg must be str or a tuple of str, not " + a.type_name());
    }
    std::string_view p = a.str();
    return p.size() <= s.size() &&
           (start ? s.substr(0, p.size()) == p : s.substr(s.size() - p.size()) == p);
  };
  if (arg.type() == Type::kTuple) {
    for (const Value& a : arg.items()) {
      if (one(a)) return true;
    }
    return false;
  }
  return one(arg);
}

// str.format with {} / {0} / {name} fields and no format spec or conversion.
std::string format(std::string_view f, const Args& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    char c = f[i];
    if (c == '{' && i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
    } else if (c == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (c == '{') {
      size_t close = f.find('}', i);
      if (close == f.npos) type_error("Single '{' encountered in format string");
      std::string_view field = f.substr(i + 1, close - i - 1);
      if (field.find_first_of(":!.[") != field.npos) {
        type_error("str.format with a format spec, conversion or attribute is not supported");
      }
      const Value* v = nullptr;
      if (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))) {
        size_t k = field.empty() ? auto_index++ : std::stoul(std::string(field));
        if (k >= args.positional.size()) type_error("Replacement index out of range");
        v = &args.positional[k];
      } else {
        for (const auto& [name, value] : args.keywords) {
          if (name == field) v = &value;
        }
        if (!v) type_error(quoted(field));
      }
      v->append_str(out);
      i = close;
    } else if (c == '}') {
      type_error("Single '}' encountered in format string");
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

Value str_method(std::string_view s, std::string_view name, const Args& args) {
  auto bound = [&](std::initializer_list<const char*> names) {
    return Bound(args, names, "str method");
  };
  auto text = [&](const Value& v, const char* what) -> std::string_view {
    if (!v.is_string()) type_error(std::string(what) + " must be str, not " + v.type_name());
    return v.str();
  };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Bound b = bound({"chars"});
    return Value::string(strip(s, b.get_or(0, Value::none()), name != "rstrip", name != "lstrip"));
  }
  if (name == "split" || name == "rsplit") {
    Bound b = bound({"sep", "maxsplit"});
    int64_t maxsplit = b.has(1) ? b.get(1).as_int() : -1;
    return Value::list(split(s, b.get_or(0, Value::none()), maxsplit, name == "rsplit"));
  }
  if (name == "startswith" || name == "endswith") {
    Bound b = bound({"prefix"});
    return Value::boolean(affix(s, b.get(0), name == "startswith"));
  }
  if (name == "upper") return Value::string(to_upper(s));
  if (name == "lower" || name == "casefold") return Value::string(to_lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "swapcase") {
    std::string out;
    for (size_t i = 0; i < s.size();) {
      char32_t c = next_code_point(s, i);
      auto k = category(c);
      if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL) {
        append_case(k == UTF8PROC_CATEGORY_LU ? Case::kLower : Case::kUpper, c, out);
      } else {
        append_utf8(c, out);
      }
    }
    return Value::string(std::move(out));
  }
  if (name == "replace") {
    Bound b = bound({"old", "new", "count"});
    return Value::string(replace(s, text(b.get(0), "replace() argument 1"),
                                 text(b.get(1), "replace() argument 2"),
                                 b.has(2) ? b.get(2).as_int() : -1));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    Bound b = bound({"sub"});
    int64_t at = find(s, text(b.get(0), "argument"), name[0] == 'r');
    if (at < 0 && name.find("index") != name.npos) type_error("substring not found");
    return Value::integer(at);
  }
  if (name == "count") return Value::integer(count(s, text(bound({"sub"}).get(0), "argument")));
  if (name == "join") {
    Bound b = bound({"iterable"});
    std::string out;
    List items = iterate(b.get(0));
    for (size_t k = 0; k < items.size(); ++k) {
      if (!items[k].is_string()) {
        type_error("sequence item " + std::to_string(k) + ": expected str instance, " +
                   items[k].type_name() + " found");
      }
      if (k) out += s;
      out += items[k].str();
    }
    return Value::string(std::move(out));
  }
  if (name == "splitlines") {
    Bound b = bound({"keepends"});
    List out;
    for (auto& line : split_lines(s, b.has(0) && b.get(0).truthy())) {
      out.push_back(Value::string(std::move(line)));
    }
    return Value::list(std::move(out));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    std::string_view a = text(bound({"affix"}).get(0), "argument");
    bool prefix = name == "removeprefix";
    if (a.size() <= s.size() &&
        (prefix ? s.substr(0, a.size()) == a : s.substr(s.size() - a.size()) == a)) {
      return Value::string(
          std::string(prefix ? s.substr(a.size()) : s.substr(0, s.size() - a.size())));
    }
    return Value::string(std::string(s));
  }
  if (name == "format") return Value::string(format(s, args));
  if (name == "isdigit" || name == "isnumeric")
    return Value::boolean(all_of_code_points(s, is_numeric));
  if (name == "isdecimal") return Value::boolean(all_of_code_points(s, is_decimal));
  if (name == "isalpha") return Value::boolean(all_of_code_points(s, is_alpha));
  if (name == "isalnum") {
    return Value::boolean(
        all_of_code_points(s, [](char32_t c) { return is_alpha(c) || is_numeric(c); }));
  }
  if (name == "isspace") return Value::boolean(all_of_code_points(s, is_space));
  if (name == "isupper") return Value::boolean(py_is_case(s, true));
  if (name == "islower") return Value::boolean(py_is_case(s, false));
  if (name == "isascii") return Value::boolean(is_ascii(s));
  type_error("unsupported str method '" + std::string(name) + "'");
}

bool is_str_method(std::string_view name) {
  for (const char* n : kStrMethods) {
    if (name == n) return true;
  }
  return false;
}

bool is_cased(char32_t c) {
  auto k = category(c);
  return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}

void append_case(Case which, char32_t c, std::string& out) {
  const CaseTable& t = which == Case::kUpper   ? kUpperTable
                       : which == Case::kLower ? kLowerTable
                                               : kTitleTable;
  const CaseSingle* single_end = t.single + t.single_size;
  const CaseSingle* one = std::lower_bound(
      t.single, single_end, c, [](const CaseSingle& e, char32_t v) { return e.from < v; });
  if (one != single_end && one->from == c) {
    append_utf8(one->to, out);
    return;
  }
  const CaseMulti* multi_end = t.multi + t.multi_size;
  const CaseMulti* many = std::lower_bound(
      t.multi, multi_end, c, [](const CaseMulti& e, char32_t v) { return e.from < v; });
  if (many != multi_end && many->from == c) {
    out += many->to;
    return;
  }
  append_utf8(c, out);
}

namespace {

// Python's lower() of the code point c at [at, next) of s: a capital sigma that ends a word (a
// cased letter before it, none after) becomes the final sigma.
void append_lower_at(std::string_view s, size_t at, size_t next, char32_t c, std::string& out) {
  if (c == 0x3A3) {
    bool before = false, after = false;
    if (at > 0) {
      size_t p = at - 1;
      while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
      before = is_cased(next_code_point(s, p));
    }
    if (next < s.size()) {
      size_t q = next;
      after = is_cased(next_code_point(s, q));
    }
    if (before && !after) {
      append_utf8(0x3C2, out);
      return;
    }
  }
  append_case(Case::kLower, c, out);
}

}  // namespace

std::string to_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (is_ascii(s)) {
    for (char c : s) out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
  }
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    char32_t c = next_code_point(s, i);
    append_lower_at(s, at, i, c, out);
  }
  return out;
}

std::string to_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  if (is_ascii(s)) {
    for (char c : s) out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return out;
  }
  for (size_t i = 0; i < s.size();) append_case(Case::kUpper, next_code_point(s, i), out);
  return out;
}

std::string py_title(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    char32_t c = next_code_point(s, i);
    if (prev_cased) {
      append_lower_at(s, at, i, c, out);
    } else {
      append_case(Case::kTitle, c, out);
    }
    prev_cased = is_cased(c);
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    char32_t c = next_code_point(s, i);
    if (at == 0) {
      append_case(Case::kTitle, c, out);
    } else {
      append_lower_at(s, at, i, c, out);
    }
  }
  return out;
}

size_t code_points(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::vector<std::string> split_lines(std::string_view s, bool keep_ends) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    char32_t c = next_code_point(s, i);
    bool br = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
              c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!br) continue;
    if (c == '\r' && i < s.size() && s[i] == '\n') ++i;
    lines.emplace_back(s.substr(start, (keep_ends ? i : at) - start));
    start = i;
  }
  if (start < s.size()) lines.emplace_back(s.substr(start));
  return lines;
}

std::string strip(std::string_view s, const Value& chars, bool left, bool right) {
  std::vector<char32_t> set;
  bool spaces = chars.is_none() || chars.is_undefined();
  if (!spaces) {
    if (!chars.is_string()) type_error("strip arg must be None or str");
    std::string_view c = chars.str();
    for (size_t i = 0; i < c.size();) set.push_back(next_code_point(c, i));
  }
  auto strip_it = [&](char32_t c) {
    return spaces ? is_space(c) : std::find(set.begin(), set.end(), c) != set.end();
  };
  std::vector<size_t> o = code_point_offsets(s);
  size_t a = 0, b = o.size() - 1;  // code point indices
  if (left) {
    while (a < b) {
      size_t i = o[a];
      if (!strip_it(next_code_point(s, i))) break;
      ++a;
    }
  }
  if (right) {
    while (b > a) {
      size_t i = o[b - 1];
      if (!strip_it(next_code_point(s, i))) break;
      --b;
    }
  }
  return std::string(s.substr(o[a], o[b] - o[a]));
}

}  // namespace stoker::text::jinja
