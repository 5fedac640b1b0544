// Value (value.h): Python's str, repr, ==, ordering and json.dumps of the template's values.
#include "text/jinja/value.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace stoker::text::jinja {

Value Value::undefined(std::string hint) {
  Value v(Type::kUndefined);
  v.obj_ = std::make_shared<StringObject>(std::move(hint));
  return v;
}

Value Value::string(std::string s) {
  Value v(Type::kString);
  v.obj_ = std::make_shared<StringObject>(std::move(s));
  return v;
}

Value Value::list(List items, bool tuple) {
  Value v(tuple ? Type::kTuple : Type::kList);
  v.obj_ = std::make_shared<ListObject>(std::move(items));
  return v;
}

Value Value::dict(std::vector<std::pair<Value, Value>> items) {
  Value v(Type::kDict);
  v.obj_ = std::make_shared<DictObject>(std::move(items));
  return v;
}

Value Value::iterator(List items, const char* name, bool view) {
  Value v(Type::kIterator);
  v.obj_ = std::make_shared<IteratorObject>(std::move(items), name, view);
  return v;
}

Value Value::markup(std::string s) {
  Value v(Type::kString);
  v.obj_ = std::make_shared<StringObject>(std::move(s), true);
  return v;
}

bool Value::is_markup() const {
  return type_ == Type::kString && static_cast<const StringObject*>(obj_.get())->markup;
}

std::string_view Value::str() const { return static_cast<const StringObject*>(obj_.get())->text; }

const List& Value::items() const { return static_cast<const ListObject*>(obj_.get())->items; }

const std::vector<std::pair<Value, Value>>& Value::entries() const {
  return static_cast<const DictObject*>(obj_.get())->entries;
}

std::string_view Value::undefined_hint() const {
  if (!obj_) return {};
  return static_cast<const StringObject*>(obj_.get())->text;
}

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : entries()) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

Value* NamespaceObject::find(std::string_view name) const {
  for (auto& [k, v] : attrs) {
    if (k == name) return &v;
  }
  return nullptr;
}

bool Value::truthy() const {
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
    case Type::kInt:
      return i_ != 0;
    case Type::kFloat:
      return f_ != 0.0;
    case Type::kString:
      return !str().empty();
    case Type::kList:
    case Type::kTuple:
      return !items().empty();
    case Type::kDict:
      return !entries().empty();
    case Type::kIterator: {
      const auto* it = static_cast<const IteratorObject*>(obj_.get());
      return !it->view || !it->items.empty();
    }
    default:
      return true;
  }
}

const char* Value::type_name() const {
  switch (type_) {
    case Type::kUndefined:
      return "Undefined";
    case Type::kNone:
      return "NoneType";
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "int";
    case Type::kFloat:
      return "float";
    case Type::kString:
      return "str";
    case Type::kList:
      return "list";
    case Type::kTuple:
      return "tuple";
    case Type::kDict:
      return "dict";
    case Type::kNamespace:
      return "Namespace";
    case Type::kCallable:
      return "function";
    case Type::kLoop:
      return "LoopContext";
    case Type::kIterator:
      return static_cast<const IteratorObject*>(obj_.get())->name;
  }
  return "object";
}

char32_t next_code_point(std::string_view s, size_t& i) {
  auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 0 : (b >> 5) == 6 ? 1 : (b >> 4) == 14 ? 2 : (b >> 3) == 30 ? 3 : -1;
  if (n <= 0 || i + n >= s.size()) {
    ++i;
    return b;
  }
  char32_t c = b & (0x3F >> n);
  for (int k = 1; k <= n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n + 1;
  return c;
}

void append_utf8(char32_t c, std::string& out) {
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

bool is_space(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_ZS:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
      return true;
    default:
      return c == 0x85;
  }
}

namespace {

bool printable(char32_t c) {
  if (c == ' ') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

void append_hex(char32_t c, int digits, std::string& out) {
  static const char* kHex = "0123456789abcdef";
  for (int k = digits - 1; k >= 0; --k) out += kHex[(c >> (4 * k)) & 0xF];
}

}  // namespace

void append_repr_string(std::string_view s, std::string& out) {
  char quote = (s.find('\'') != s.npos && s.find('"') == s.npos) ? '"' : '\'';
  out += quote;
  for (size_t i = 0; i < s.size();) {
    size_t start = i;
    char32_t c = next_code_point(s, i);
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      append_hex(c, 2, out);
    } else if (c < 0x80 || printable(c)) {
      out.append(s.substr(start, i - start));
    } else if (c < 0x100) {
      out += "\\x";
      append_hex(c, 2, out);
    } else if (c < 0x10000) {
      out += "\\u";
      append_hex(c, 4, out);
    } else {
      out += "\\U";
      append_hex(c, 8, out);
    }
  }
  out += quote;
}

void append_float(double d, std::string& out) {
  if (std::isnan(d)) {
    out += "nan";
    return;
  }
  if (std::isinf(d)) {
    out += d > 0 ? "inf" : "-inf";
    return;
  }
  if (d == 0) {
    out += std::signbit(d) ? "-0.0" : "0.0";
    return;
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string_view sci(buf, r.ptr - buf);  // [-]d[.ddd]e[+-]xx
  if (sci[0] == '-') {
    out += '-';
    sci.remove_prefix(1);
  }
  size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits += c;
  }
  int exponent = std::stoi(std::string(sci.substr(e + 1)));
  int point = exponent + 1;  // the value is 0.digits * 10^point
  int n = static_cast<int>(digits.size());
  if (point > -4 && point <= 16) {
    if (point <= 0) {
      out += "0.";
      out.append(-point, '0');
      out += digits;
    } else if (point >= n) {
      out += digits;
      out.append(point - n, '0');
      out += ".0";
    } else {
      out.append(digits, 0, point);
      out += '.';
      out.append(digits, point);
    }
    return;
  }
  out += digits[0];
  if (n > 1) {
    out += '.';
    out.append(digits, 1);
  }
  out += exponent < 0 ? "e-" : "e+";
  int a = std::abs(exponent);
  if (a < 10) out += '0';
  out += std::to_string(a);
}

void Value::append_repr(std::string& out) const {
  switch (type_) {
    case Type::kString:
      append_repr_string(str(), out);
      return;
    case Type::kList:
    case Type::kTuple: {
      bool tuple = type_ == Type::kTuple;
      out += tuple ? '(' : '[';
      const List& v = items();
      for (size_t k = 0; k < v.size(); ++k) {
        if (k) out += ", ";
        v[k].append_repr(out);
      }
      if (tuple && v.size() == 1) out += ',';
      out += tuple ? ')' : ']';
      return;
    }
    case Type::kDict: {
      out += '{';
      bool first = true;
      for (const auto& [k, v] : entries()) {
        if (!first) out += ", ";
        first = false;
        k.append_repr(out);
        out += ": ";
        v.append_repr(out);
      }
      out += '}';
      return;
    }
    case Type::kNamespace: {
      out += "<Namespace {";
      bool first = true;
      for (const auto& [k, v] : static_cast<const NamespaceObject*>(obj_.get())->attrs) {
        if (!first) out += ", ";
        first = false;
        append_repr_string(k, out);
        out += ": ";
        v.append_repr(out);
      }
      out += "}>";
      return;
    }
    case Type::kUndefined:
      out += "Undefined";
      return;
    case Type::kIterator: {
      const auto* it = static_cast<const IteratorObject*>(obj_.get());
      if (!it->view || std::string_view(it->name) == "range") {
        throw std::invalid_argument(std::string("cannot print a ") + it->name +
                                    " (Python prints its address or its bounds)");
      }
      out += it->name;
      out += '(';
      Value::list(it->items).append_repr(out);
      out += ')';
      return;
    }
    default:
      append_str(out);
  }
}

void Value::append_str(std::string& out) const {
  switch (type_) {
    case Type::kUndefined:
      return;
    case Type::kNone:
      out += "None";
      return;
    case Type::kBool:
      out += i_ ? "True" : "False";
      return;
    case Type::kInt:
      out += std::to_string(i_);
      return;
    case Type::kFloat:
      append_float(f_, out);
      return;
    case Type::kString:
      out += str();
      return;
    case Type::kCallable:
    case Type::kLoop:
      throw std::invalid_argument(std::string("cannot print a ") + type_name() +
                                  " (its text is Python's object address)");
    default:
      append_repr(out);
  }
}

bool Value::equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (type_ == Type::kFloat || o.type_ == Type::kFloat) return as_double() == o.as_double();
    return i_ == o.i_;
  }
  bool seq = is_sequence() && o.is_sequence();
  if (type_ != o.type_ && !seq) return false;
  if (seq && type_ != o.type_) return false;  // [1] != (1,)
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone:
      return true;
    case Type::kString:
      return str() == o.str();
    case Type::kList:
    case Type::kTuple: {
      const List &a = items(), &b = o.items();
      if (a.size() != b.size()) return false;
      for (size_t k = 0; k < a.size(); ++k) {
        if (!a[k].equals(b[k])) return false;
      }
      return true;
    }
    case Type::kDict: {
      const auto &a = entries(), &b = o.entries();
      if (a.size() != b.size()) return false;
      for (const auto& [k, v] : a) {
        bool found = false;
        for (const auto& [k2, v2] : b) {
          if (k.equals(k2)) {
            if (!v.equals(v2)) return false;
            found = true;
            break;
          }
        }
        if (!found) return false;
      }
      return true;
    }
    default:
      return obj_ == o.obj_;
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type() == Type::kFloat || b.type() == Type::kFloat) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.type() == b.type() && a.is_sequence()) {
    const List &x = a.items(), &y = b.items();
    for (size_t k = 0; k < x.size() && k < y.size(); ++k) {
      if (!x[k].equals(y[k])) return less(x[k], y[k]);
    }
    return x.size() < y.size();
  }
  throw std::invalid_argument(std::string("'<' not supported between instances of '") +
                              a.type_name() + "' and '" + b.type_name() + "'");
}

namespace {

void append_json_string(std::string_view s, bool ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size(); ++i) {
    char ch = s[i];
    auto c = static_cast<unsigned char>(ch);
    if (ascii && (c >= 0x7F)) {
      char32_t cp = next_code_point(s, i);
      --i;
      auto unit = [&](char32_t u) {
        out += "\\u";
        append_hex(u, 4, out);
      };
      if (cp >= 0x10000) {
        unit(0xD800 + ((cp - 0x10000) >> 10));
        unit(0xDC00 + ((cp - 0x10000) & 0x3FF));
      } else {
        unit(cp);
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          append_hex(c, 2, out);
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void append_json_float(double d, std::string& out) {
  if (std::isnan(d)) {
    out += "NaN";
  } else if (std::isinf(d)) {
    out += d > 0 ? "Infinity" : "-Infinity";
  } else {
    append_float(d, out);
  }
}

void newline(const JsonOptions& o, int level, std::string& out) {
  out += '\n';
  for (int k = 0; k < level; ++k) out += o.indent;
}

}  // namespace

void append_json(const Value& v, const JsonOptions& o, std::string& out, int level) {
  switch (v.type()) {
    case Type::kNone:
      out += "null";
      return;
    case Type::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Type::kInt:
      out += std::to_string(v.as_int());
      return;
    case Type::kFloat:
      append_json_float(v.as_double(), out);
      return;
    case Type::kString:
      append_json_string(v.str(), o.ensure_ascii, out);
      return;
    case Type::kList:
    case Type::kTuple: {
      const List& items = v.items();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += o.item_separator;
        if (o.has_indent) newline(o, level + 1, out);
        append_json(items[k], o, out, level + 1);
      }
      if (o.has_indent) newline(o, level, out);
      out += ']';
      return;
    }
    case Type::kDict: {
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : v.entries()) entries.push_back(&e);
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return less(a->first, b->first); });
      }
      out += '{';
      bool first = true;
      for (const auto* e : entries) {
        if (!first) out += o.item_separator;
        first = false;
        if (o.has_indent) newline(o, level + 1, out);
        const Value& k = e->first;
        switch (k.type()) {
          case Type::kString:
            append_json_string(k.str(), o.ensure_ascii, out);
            break;
          case Type::kNone:
            out += "\"null\"";
            break;
          case Type::kBool:
            out += k.as_bool() ? "\"true\"" : "\"false\"";
            break;
          case Type::kInt:
            out += '"' + std::to_string(k.as_int()) + '"';
            break;
          case Type::kFloat: {
            out += '"';
            append_json_float(k.as_double(), out);
            out += '"';
            break;
          }
          default:
            throw std::invalid_argument(std::string("keys must be str, int, float, bool or None, "
                                                    "not ") +
                                        k.type_name());
        }
        out += o.key_separator;
        append_json(e->second, o, out, level + 1);
      }
      if (o.has_indent) newline(o, level, out);
      out += '}';
      return;
    }
    default:
      throw std::invalid_argument(std::string("Object of type ") + v.type_name() +
                                  " is not JSON serializable");
  }
}

}  // namespace stoker::text::jinja
