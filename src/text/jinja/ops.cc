// ops.h: access, operators, iteration, globals and the methods of str, dict and list, as Python
// and jinja2's ImmutableSandboxedEnvironment behave.
#include "text/jinja/ops.h"

#include <utf8proc.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <stdexcept>

#include "stoker/text/chat_template.h"
#include "text/jinja/case_tables.h"

namespace stoker::text::jinja {

namespace {

[[noreturn]] void type_error(const std::string& what) { throw std::invalid_argument(what); }

std::string quoted(std::string_view s) {
  std::string q;
  q.reserve(s.size() + 2);
  q += '\'';
  q += s;
  q += '\'';
  return q;
}

bool is_ascii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

// Byte offsets of each code point, and the end.
std::vector<size_t> offsets(std::string_view s) {
  std::vector<size_t> o;
  for (size_t i = 0; i < s.size();) {
    o.push_back(i);
    next_code_point(s, i);
  }
  o.push_back(s.size());
  return o;
}

bool in_list(std::string_view name, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (name == n) return true;
  }
  return false;
}

const std::initializer_list<const char*> kStrMethods = {
    "capitalize",   "casefold",    "center",    "count",      "encode",       "endswith",
    "expandtabs",   "find",        "format",    "format_map", "index",        "isalnum",
    "isalpha",      "isascii",     "isdecimal", "isdigit",    "isidentifier", "islower",
    "isnumeric",    "isprintable", "isspace",   "istitle",    "isupper",      "join",
    "ljust",        "lower",       "lstrip",    "maketrans",  "partition",    "removeprefix",
    "removesuffix", "replace",     "rfind",     "rindex",     "rjust",        "rpartition",
    "rsplit",       "rstrip",      "split",     "splitlines", "startswith",   "strip",
    "swapcase",     "title",       "translate", "upper",      "zfill"};
const std::initializer_list<const char*> kDictMethods = {
    "clear", "copy",    "fromkeys",   "get",    "items", "keys",
    "pop",   "popitem", "setdefault", "update", "values"};
const std::initializer_list<const char*> kListMethods = {"append", "clear",   "copy",   "count",
                                                         "extend", "index",   "insert", "pop",
                                                         "remove", "reverse", "sort"};

Value method(const Value& self, std::string_view name) {
  auto c = std::make_shared<CallableObject>();
  c->kind = CallableObject::Kind::kMethod;
  c->self = self;
  c->name = std::string(name);
  return Value::object(Type::kCallable, std::move(c));
}

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

Value dict_method(const Value& d, std::string_view name, const Args& args) {
  if (name == "items" || name == "keys" || name == "values") {
    Bound b(args, {}, name == "items" ? "items" : "keys");
    List out;
    for (const auto& [k, v] : d.entries()) {
      if (name == "items") {
        out.push_back(Value::list({k, v}, true));
      } else {
        out.push_back(name == "keys" ? k : v);
      }
    }
    return Value::iterator(std::move(out),
                           name == "items"  ? "dict_items"
                           : name == "keys" ? "dict_keys"
                                            : "dict_values",
                           true);
  }
  if (name == "get") {
    Bound b(args, {"key", "default"}, "get");
    for (const auto& [k, v] : d.entries()) {
      if (k.equals(b.get(0))) return v;
    }
    return b.get_or(1, Value::none());
  }
  if (name == "copy") return d;
  type_error("access to attribute '" + std::string(name) + "' of 'dict' object is unsafe.");
}

Value list_method(const Value& l, std::string_view name, const Args& args) {
  if (name == "index" || name == "count") {
    Bound b(args, {"value"}, name == "index" ? "index" : "count");
    int64_t n = 0;
    const List& items = l.items();
    for (size_t k = 0; k < items.size(); ++k) {
      if (items[k].equals(b.get(0))) {
        if (name == "index") return Value::integer(static_cast<int64_t>(k));
        ++n;
      }
    }
    if (name == "index") type_error("value is not in list");
    return Value::integer(n);
  }
  if (name == "copy") return Value::list(l.items());
  type_error("access to attribute '" + std::string(name) + "' of '" + l.type_name() +
             "' object is unsafe.");
}

std::string strftime_now(std::string_view format) {
  auto now = std::chrono::system_clock::now();
  auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  std::time_t t = static_cast<std::time_t>(micros / 1000000);
  std::tm tm{};
  localtime_r(&t, &tm);
  // datetime.strftime's own directives (a naive datetime: %z and %Z are empty), then C's.
  std::string f;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '%' && i + 1 < format.size()) {
      char d = format[i + 1];
      if (d == 'f') {
        char buf[8];
        std::snprintf(buf, sizeof buf, "%06lld", static_cast<long long>(micros % 1000000));
        f += buf;
      } else if (d == 'z' || d == 'Z') {
      } else {
        f += '%';
        f += d;
      }
      ++i;
    } else {
      f += format[i];
    }
  }
  if (f.empty()) return "";
  std::string out(f.size() * 4 + 64, '\0');
  for (;;) {
    size_t n = std::strftime(out.data(), out.size(), f.c_str(), &tm);
    if (n > 0 || out.size() > 65536) {
      out.resize(n);
      return out;
    }
    out.resize(out.size() * 2);
  }
}

bool checked(bool overflow) {
  if (overflow) type_error("integer overflow: the result is beyond 64 bits");
  return true;
}

double py_float_mod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0) {
    if ((b < 0) != (m < 0)) m += b;
  } else {
    m = std::copysign(0.0, b);
  }
  return m;
}

double py_float_floordiv(double a, double b) {
  double m = std::fmod(a, b);
  double div = (a - m) / b;
  if (m != 0 && ((b < 0) != (m < 0))) div -= 1.0;
  if (div == 0) return std::copysign(0.0, a / b);
  double f = std::floor(div);
  if (div - f > 0.5) f += 1.0;
  return f;
}

}  // namespace

Bound::Bound(const Args& args, std::initializer_list<const char*> names, const char* callee)
    : values_(names.size()), set_(names.size(), false) {
  if (args.positional.size() > names.size()) {
    type_error(std::string(callee) + " takes at most " + std::to_string(names.size()) +
               " argument(s), " + std::to_string(args.positional.size()) + " given");
  }
  for (size_t k = 0; k < args.positional.size(); ++k) {
    values_[k] = args.positional[k];
    set_[k] = true;
  }
  for (const auto& [name, value] : args.keywords) {
    size_t k = 0;
    for (const char* n : names) {
      if (name == n) break;
      ++k;
    }
    if (k == names.size()) {
      type_error(std::string(callee) + " got an unexpected keyword argument " + quoted(name));
    }
    values_[k] = value;
    set_[k] = true;
  }
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
  std::vector<size_t> o = offsets(s);
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

void require_defined(const Value& v) {
  if (!v.is_undefined()) return;
  std::string_view hint = v.undefined_hint();
  type_error(hint.empty() ? "undefined value" : std::string(hint));
}

Value global(std::string_view name) {
  using K = CallableObject::Kind;
  auto make = [](K kind) {
    auto c = std::make_shared<CallableObject>();
    c->kind = kind;
    return Value::object(Type::kCallable, std::move(c));
  };
  static const Value range = make(K::kRange), dict = make(K::kDict), ns = make(K::kNamespace),
                     raise = make(K::kRaise), strftime = make(K::kStrftime);
  if (name == "range") return range;
  if (name == "dict") return dict;
  if (name == "namespace") return ns;
  if (name == "raise_exception") return raise;
  if (name == "strftime_now") return strftime;
  if (name == "cycler" || name == "joiner" || name == "lipsum") {
    type_error("unsupported global '" + std::string(name) + "'");
  }
  return Value();
}

Value call_builtin(const CallableObject& c, const Args& args) {
  using K = CallableObject::Kind;
  switch (c.kind) {
    case K::kRange: {
      if (!args.keywords.empty()) type_error("range() takes no keyword arguments");
      const List& p = args.positional;
      if (p.empty() || p.size() > 3) type_error("range expected 1 to 3 arguments");
      for (const Value& v : p) {
        if (v.type() != Type::kInt && v.type() != Type::kBool) {
          type_error(std::string("'") + v.type_name() +
                     "' object cannot be interpreted as an integer");
        }
      }
      int64_t start = p.size() > 1 ? p[0].as_int() : 0;
      int64_t stop = p.size() > 1 ? p[1].as_int() : p[0].as_int();
      int64_t step = p.size() > 2 ? p[2].as_int() : 1;
      if (step == 0) type_error("range() arg 3 must not be zero");
      List out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= 100000) {
          type_error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
        }
        out.push_back(Value::integer(i));
      }
      return Value::iterator(std::move(out), "range", true);
    }
    case K::kDict:
    case K::kNamespace: {
      std::vector<std::pair<Value, Value>> entries;
      if (args.positional.size() > 1) type_error("dict expected at most 1 argument");
      if (!args.positional.empty()) {
        const Value& src = args.positional[0];
        if (src.is_dict()) {
          entries = src.entries();
        } else {
          for (const Value& pair : iterate(src)) {
            if (!pair.is_sequence() || pair.items().size() != 2) {
              type_error("dictionary update sequence element has the wrong length");
            }
            entries.emplace_back(pair.items()[0], pair.items()[1]);
          }
        }
      }
      for (const auto& [k, v] : args.keywords) {
        Value key = Value::string(std::string(k));
        bool replaced = false;
        for (auto& e : entries) {
          if (e.first.equals(key)) {
            e.second = v;
            replaced = true;
          }
        }
        if (!replaced) entries.emplace_back(key, v);
      }
      if (c.kind == K::kDict) return Value::dict(std::move(entries));
      auto ns = std::make_shared<NamespaceObject>();
      for (auto& [k, v] : entries) {
        if (!k.is_string()) type_error("namespace() keys must be strings");
        if (!k.str().empty() && k.str()[0] == '_') {
          type_error(
              "Chat templates cannot store underscore-prefixed attributes on a namespace, "
              "but got " +
              quoted(k.str()) + ". Please rename the attribute.");
        }
        ns->attrs.emplace_back(std::string(k.str()), std::move(v));
      }
      return Value::object(Type::kNamespace, std::move(ns));
    }
    case K::kRaise: {
      Bound b(args, {"message"}, "raise_exception");
      throw TemplateError(b.get(0).to_str());
    }
    case K::kStrftime: {
      Bound b(args, {"format"}, "strftime_now");
      if (!b.get(0).is_string()) type_error("strftime() argument 1 must be str");
      return Value::string(strftime_now(b.get(0).str()));
    }
    case K::kMethod: {
      const Value& self = c.self;
      if (self.is_string()) return str_method(self.str(), c.name, args);
      if (self.is_dict()) return dict_method(self, c.name, args);
      if (self.is_sequence()) return list_method(self, c.name, args);
      if (self.type() == Type::kLoop && c.name == "cycle") {
        if (args.positional.empty()) type_error("no items for cycling given");
        const auto* loop = static_cast<const LoopObject*>(self.obj());
        return args.positional[loop->index % args.positional.size()];
      }
      type_error("unsupported method '" + c.name + "'");
    }
    default:
      type_error("not a builtin");
  }
}

Value get_attribute(const Value& obj, std::string_view name) {
  switch (obj.type()) {
    case Type::kUndefined:
      require_defined(obj);
      break;
    case Type::kDict:
      if (in_list(name, kDictMethods)) return method(obj, name);
      if (const Value* v = obj.find(name)) return *v;
      return Value::undefined("'dict object' has no attribute " + quoted(name));
    case Type::kString:
      if (in_list(name, kStrMethods)) return method(obj, name);
      break;
    case Type::kList:
    case Type::kTuple:
      if (in_list(name, kListMethods)) return method(obj, name);
      break;
    case Type::kNamespace:
      if (const Value* v = static_cast<const NamespaceObject*>(obj.obj())->find(name)) return *v;
      break;
    case Type::kLoop: {
      const auto* loop = static_cast<const LoopObject*>(obj.obj());
      const List& items = loop->items.items();
      auto n = static_cast<int64_t>(items.size());
      auto i = static_cast<int64_t>(loop->index);
      if (name == "index") return Value::integer(i + 1);
      if (name == "index0") return Value::integer(i);
      if (name == "revindex") return Value::integer(n - i);
      if (name == "revindex0") return Value::integer(n - i - 1);
      if (name == "first") return Value::boolean(i == 0);
      if (name == "last") return Value::boolean(i == n - 1);
      if (name == "length") return Value::integer(n);
      if (name == "depth") return Value::integer(1);
      if (name == "depth0") return Value::integer(0);
      if (name == "previtem") {
        return i > 0 ? items[i - 1] : Value::undefined("there is no previous item");
      }
      if (name == "nextitem") {
        return i + 1 < n ? items[i + 1] : Value::undefined("there is no next item");
      }
      if (name == "cycle") return method(obj, name);
      type_error("unsupported loop attribute " + quoted(name));
    }
    default:
      break;
  }
  return Value::undefined(std::string("'") + obj.type_name() + " object' has no attribute " +
                          quoted(name));
}

namespace {

// A Python index into a sequence of n, or -1 when out of range.
int64_t wrap_index(const Value& key, size_t n) {
  int64_t i = key.as_int();
  if (i < 0) i += static_cast<int64_t>(n);
  return (i < 0 || i >= static_cast<int64_t>(n)) ? -1 : i;
}

}  // namespace

Value get_item(const Value& obj, const Value& key) {
  require_defined(obj);
  bool int_key = key.type() == Type::kInt || key.type() == Type::kBool;
  switch (obj.type()) {
    case Type::kDict:
      for (const auto& [k, v] : obj.entries()) {
        if (k.equals(key)) return v;
      }
      break;
    case Type::kList:
    case Type::kTuple:
      if (int_key) {
        int64_t i = wrap_index(key, obj.items().size());
        if (i >= 0) return obj.items()[i];
        return Value::undefined(std::string("'") + obj.type_name() + " object' has no element " +
                                key.to_str());
      }
      break;
    case Type::kString:
      if (int_key) {
        std::string_view s = obj.str();
        if (is_ascii(s)) {
          int64_t i = wrap_index(key, s.size());
          if (i >= 0) return Value::string(std::string(1, s[i]));
        } else {
          std::vector<size_t> o = offsets(s);
          int64_t i = wrap_index(key, o.size() - 1);
          if (i >= 0) return Value::string(std::string(s.substr(o[i], o[i + 1] - o[i])));
        }
        return Value::undefined("'str object' has no element " + key.to_str());
      }
      break;
    case Type::kIterator:
      if (int_key && std::string_view(obj.type_name()) == "range") {
        const List& items = static_cast<const IteratorObject*>(obj.obj())->items;
        int64_t i = wrap_index(key, items.size());
        if (i >= 0) return items[i];
        type_error("range object index out of range");
      }
      break;
    default:
      break;
  }
  if (key.is_string()) return get_attribute(obj, key.str());
  return Value::undefined(std::string("'") + obj.type_name() + " object' has no element " +
                          key.to_str());
}

Value get_slice(const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  require_defined(obj);
  auto as_index = [](const Value& v, const char* what) -> std::pair<bool, int64_t> {
    if (v.is_none() || v.is_undefined()) return {false, 0};
    if (v.type() != Type::kInt && v.type() != Type::kBool) {
      type_error(std::string("slice ") + what + " must be an integer or None");
    }
    return {true, v.as_int()};
  };
  auto [has_step, step] = as_index(step_v, "step");
  if (!has_step) step = 1;
  if (step == 0) type_error("slice step cannot be zero");
  std::vector<size_t> o;
  bool str = obj.is_string(), ascii = str && is_ascii(obj.str());
  int64_t n;
  if (str) {
    if (!ascii) o = offsets(obj.str());
    n = ascii ? static_cast<int64_t>(obj.str().size()) : static_cast<int64_t>(o.size()) - 1;
  } else if (obj.is_sequence()) {
    n = static_cast<int64_t>(obj.items().size());
  } else {
    type_error(std::string("'") + obj.type_name() + "' object is not subscriptable");
  }
  int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? n - 1 : n;
  auto clamp = [&](std::pair<bool, int64_t> v, int64_t fallback) {
    if (!v.first) return fallback;
    int64_t i = v.second < 0 ? v.second + n : v.second;
    return std::clamp(i, lower, upper);
  };
  int64_t start = clamp(as_index(start_v, "indices"), step < 0 ? upper : lower);
  int64_t stop = clamp(as_index(stop_v, "indices"), step < 0 ? lower : upper);
  if (str) {
    std::string_view s = obj.str();
    std::string out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (ascii) {
        out += s[i];
      } else {
        out.append(s.substr(o[i], o[i + 1] - o[i]));
      }
    }
    return Value::string(std::move(out));
  }
  List out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(obj.items()[i]);
  return Value::list(std::move(out), obj.type() == Type::kTuple);
}

Value negate(const Value& v) {
  require_defined(v);
  if (v.type() == Type::kFloat) return Value::real(-v.as_double());
  if (v.type() == Type::kInt || v.type() == Type::kBool) {
    int64_t r;
    checked(__builtin_sub_overflow(int64_t{0}, v.as_int(), &r));
    return Value::integer(r);
  }
  type_error(std::string("bad operand type for unary -: '") + v.type_name() + "'");
}

Value binary(Op op, const Value& a, const Value& b) {
  if (op == Op::kConcat) {
    std::string s = a.to_str();
    b.append_str(s);
    return Value::string(std::move(s));
  }
  require_defined(a);
  require_defined(b);
  static const char* kSymbols[] = {"+", "-", "*", "/", "//", "%", "**", "~"};
  auto unsupported = [&]() -> Value {
    type_error(std::string("unsupported operand type(s) for ") + kSymbols[static_cast<int>(op)] +
               ": '" + a.type_name() + "' and '" + b.type_name() + "'");
  };
  if (a.is_number() && b.is_number()) {
    bool ints = a.type() != Type::kFloat && b.type() != Type::kFloat;
    int64_t x = a.as_int(), y = b.as_int(), r = 0;
    double p = a.as_double(), q = b.as_double();
    switch (op) {
      case Op::kAdd:
        if (ints) return checked(__builtin_add_overflow(x, y, &r)), Value::integer(r);
        return Value::real(p + q);
      case Op::kSub:
        if (ints) return checked(__builtin_sub_overflow(x, y, &r)), Value::integer(r);
        return Value::real(p - q);
      case Op::kMul:
        if (ints) return checked(__builtin_mul_overflow(x, y, &r)), Value::integer(r);
        return Value::real(p * q);
      case Op::kDiv:
        if (q == 0) type_error(ints ? "division by zero" : "float division by zero");
        return Value::real(p / q);
      case Op::kFloorDiv:
        if (q == 0)
          type_error(ints ? "integer division or modulo by zero" : "float floor division by zero");
        if (ints) {
          if (x == INT64_MIN && y == -1) checked(true);
          int64_t d = x / y;
          if ((x % y != 0) && ((x < 0) != (y < 0))) --d;
          return Value::integer(d);
        }
        return Value::real(py_float_floordiv(p, q));
      case Op::kMod:
        if (q == 0) type_error(ints ? "integer division or modulo by zero" : "float modulo");
        if (ints) {
          if (y == -1) return Value::integer(0);
          int64_t m = x % y;
          if (m != 0 && ((m < 0) != (y < 0))) m += y;
          return Value::integer(m);
        }
        return Value::real(py_float_mod(p, q));
      case Op::kPow:
        if (ints && y >= 0) {
          int64_t result = 1, base = x;
          for (int64_t e = y; e > 0; e >>= 1) {
            if (e & 1) checked(__builtin_mul_overflow(result, base, &result));
            if (e > 1) checked(__builtin_mul_overflow(base, base, &base));
          }
          return Value::integer(result);
        }
        if (p == 0 && q < 0) type_error("0.0 cannot be raised to a negative power");
        if (p < 0 && q != std::floor(q)) type_error("complex results are not supported");
        return Value::real(std::pow(p, q));
      default:
        break;
    }
  }
  if (op == Op::kAdd) {
    if (a.is_string() && b.is_string()) {
      std::string s(a.str());
      s += b.str();
      return Value::string(std::move(s));
    }
    if (a.is_sequence() && a.type() == b.type()) {
      List l = a.items();
      l.insert(l.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(l), a.type() == Type::kTuple);
    }
    if (a.is_string()) {
      type_error(std::string("can only concatenate str (not \"") + b.type_name() + "\") to str");
    }
  }
  if (op == Op::kMul) {
    const Value* seq = (a.is_string() || a.is_sequence()) ? &a : &b;
    const Value* times = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_sequence()) &&
        (times->type() == Type::kInt || times->type() == Type::kBool)) {
      int64_t n = std::max<int64_t>(0, times->as_int());
      // Bounded (chat_template.h): n * size must neither overflow nor loop over empty copies.
      if (seq->is_string()) {
        const uint64_t size = seq->str().size();
        if (size == 0 || n == 0) return Value::string("");
        if (static_cast<uint64_t>(n) > (uint64_t{1} << 28) / size)
          type_error("repeated string too long");
        std::string s;
        s.reserve(n * size);
        for (int64_t k = 0; k < n; ++k) s += seq->str();
        return Value::string(std::move(s));
      }
      const uint64_t size = seq->items().size();
      if (size == 0 || n == 0) return Value::list({}, seq->type() == Type::kTuple);
      if (static_cast<uint64_t>(n) > (uint64_t{1} << 20) / size)
        type_error("repeated list too long");
      List l;
      for (int64_t k = 0; k < n; ++k) l.insert(l.end(), seq->items().begin(), seq->items().end());
      return Value::list(std::move(l), seq->type() == Type::kTuple);
    }
  }
  if (op == Op::kMod && a.is_string())
    type_error("printf-style '%' formatting of str is not supported");
  return unsupported();
}

bool contains(const Value& c, const Value& item) {
  switch (c.type()) {
    case Type::kUndefined:
      return false;
    case Type::kString:
      if (!item.is_string()) {
        type_error(std::string("'in <string>' requires string as left operand, not ") +
                   item.type_name());
      }
      return c.str().find(item.str()) != std::string_view::npos;
    case Type::kList:
    case Type::kTuple:
      for (const Value& v : c.items()) {
        if (v.equals(item)) return true;
      }
      return false;
    case Type::kDict:
      for (const auto& [k, v] : c.entries()) {
        if (k.equals(item)) return true;
      }
      return false;
    case Type::kIterator:
      for (const Value& v : iterate(c)) {
        if (v.equals(item)) return true;
      }
      return false;
    default:
      type_error(std::string("argument of type '") + c.type_name() + "' is not iterable");
  }
}

bool compare(Cmp op, const Value& a, const Value& b) {
  switch (op) {
    case Cmp::kEq:
      return a.equals(b);
    case Cmp::kNe:
      return !a.equals(b);
    case Cmp::kIn:
      return contains(b, a);
    case Cmp::kNotIn:
      return !contains(b, a);
    default:
      break;
  }
  require_defined(a);
  require_defined(b);
  switch (op) {
    case Cmp::kLt:
      return less(a, b);
    case Cmp::kGt:
      return less(b, a);
    case Cmp::kLe:
      return less(a, b) || a.equals(b);
    default:
      return less(b, a) || a.equals(b);
  }
}

List iterate(const Value& v) {
  switch (v.type()) {
    case Type::kUndefined:
      return {};
    case Type::kIterator: {
      const auto* it = static_cast<const IteratorObject*>(v.obj());
      if (it->view) return it->items;
      if (it->consumed) return {};
      it->consumed = true;
      return it->items;
    }
    case Type::kList:
    case Type::kTuple:
      return v.items();
    case Type::kDict: {
      List keys;
      for (const auto& [k, value] : v.entries()) keys.push_back(k);
      return keys;
    }
    case Type::kString: {
      List chars;
      std::string_view s = v.str();
      for (size_t i = 0; i < s.size();) {
        size_t start = i;
        next_code_point(s, i);
        chars.push_back(Value::string(std::string(s.substr(start, i - start))));
      }
      return chars;
    }
    default:
      type_error(std::string("'") + v.type_name() + "' object is not iterable");
  }
}

int64_t length(const Value& v) {
  switch (v.type()) {
    case Type::kUndefined:
      return 0;
    case Type::kString:
      return static_cast<int64_t>(code_points(v.str()));
    case Type::kList:
    case Type::kTuple:
      return static_cast<int64_t>(v.items().size());
    case Type::kDict:
      return static_cast<int64_t>(v.entries().size());
    case Type::kIterator: {
      const auto* it = static_cast<const IteratorObject*>(v.obj());
      if (it->view) return static_cast<int64_t>(it->items.size());
      [[fallthrough]];
    }
    default:
      type_error(std::string("object of type '") + v.type_name() + "' has no len()");
  }
}

}  // namespace stoker::text::jinja
