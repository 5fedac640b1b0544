// The values a chat template computes with, as Python holds them for jinja2: None, bool, int
// (64-bit here; beyond is refused), float, str, list, tuple, dict (insertion-ordered), jinja2's
// Undefined, namespace(), and callables (macros, globals, loop.cycle). Strings, lists and dicts are
// shared and immutable (the sandbox's rule), so a Value copies in O(1); a namespace is the one
// mutable object. Private to src/text/.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stoker::text::jinja {

struct Object {
  virtual ~Object() = default;
};

class Value;
using List = std::vector<Value>;

enum class Type : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,
  kTuple,
  kDict,
  kNamespace,
  kCallable,
  kLoop,
  kIterator,  // what Python holds as a generator, an iterator or a dict view (IteratorObject)
};

class Value {
 public:
  Value() = default;                         // Undefined
  static Value undefined(std::string hint);  // hint: jinja2's message when the value is used
  static Value none() { return Value(Type::kNone); }
  static Value boolean(bool b) {
    Value v(Type::kBool);
    v.i_ = b;
    return v;
  }
  static Value integer(int64_t i) {
    Value v(Type::kInt);
    v.i_ = i;
    return v;
  }
  static Value real(double f) {
    Value v(Type::kFloat);
    v.f_ = f;
    return v;
  }
  static Value string(std::string s);
  // A str that markupsafe's Markup holds (what escape and safe return): escape leaves it as it
  // is, and + escapes the plain str it is added to.
  static Value markup(std::string s);
  bool is_markup() const;
  static Value list(List items, bool tuple = false);
  static Value dict(std::vector<std::pair<Value, Value>> items);
  // A one-pass iterator (a generator of jinja2's map, select, ...; `name` its Python type), or,
  // with `view`, a dict view or range (iterable again, sized, printed as name(list) except range).
  static Value iterator(List items, const char* name, bool view = false);
  static Value object(Type type, std::shared_ptr<const Object> o) {
    Value v(type);
    v.obj_ = std::move(o);
    return v;
  }

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_number() const {
    return type_ == Type::kInt || type_ == Type::kFloat || type_ == Type::kBool;
  }
  bool is_sequence() const { return type_ == Type::kList || type_ == Type::kTuple; }
  bool is_dict() const { return type_ == Type::kDict; }

  bool as_bool() const { return i_ != 0; }
  int64_t as_int() const { return i_; }  // kInt or kBool
  double as_double() const { return type_ == Type::kFloat ? f_ : static_cast<double>(i_); }
  std::string_view str() const;                                 // kString
  const List& items() const;                                    // kList, kTuple
  const std::vector<std::pair<Value, Value>>& entries() const;  // kDict
  const Object* obj() const { return obj_.get(); }
  const std::shared_ptr<const Object>& shared() const { return obj_; }
  std::string_view undefined_hint() const;  // kUndefined: "'x' is undefined", or empty

  // The entry of a dict under a string key, or nullptr.
  const Value* find(std::string_view key) const;

  bool truthy() const;
  // Python's str(): strings as they are, everything else as repr().
  void append_str(std::string& out) const;
  std::string to_str() const {
    std::string s;
    append_str(s);
    return s;
  }
  void append_repr(std::string& out) const;
  // Python's ==, and its sort order (false when the two do not order: compare() throws then).
  bool equals(const Value& other) const;
  const char* type_name() const;  // Python's: 'str', 'int', 'dict', 'NoneType', ...

 private:
  explicit Value(Type t) : type_(t) {}
  Type type_ = Type::kUndefined;
  union {
    int64_t i_ = 0;
    double f_;
  };
  std::shared_ptr<const Object> obj_;
};

struct StringObject : Object {
  explicit StringObject(std::string s, bool is_markup = false)
      : text(std::move(s)), markup(is_markup) {}
  std::string text;
  bool markup;
};
struct ListObject : Object {
  explicit ListObject(List v) : items(std::move(v)) {}
  List items;
};
struct DictObject : Object {
  explicit DictObject(std::vector<std::pair<Value, Value>> v) : entries(std::move(v)) {}
  std::vector<std::pair<Value, Value>> entries;
};
// kIterator. A generator is iterated once: later iterations see it empty, as in Python. Only the
// render that made it holds it, as a namespace.
struct IteratorObject : Object {
  IteratorObject(List v, const char* n, bool is_view)
      : items(std::move(v)), name(n), view(is_view) {}
  List items;
  const char* name;
  bool view;
  mutable size_t position = 0;  // a generator's items before it are consumed
  // A lazy filter (map, select, ...) took the generator as its input: jinja2 would pull its items
  // only when that filter's output is iterated, so iterating it directly is refused.
  mutable bool taken = false;
};
// namespace(): the one object a template mutates (`set ns.x = ...`). Only the render that made it
// holds it, so its mutation is never shared between threads.
struct NamespaceObject : Object {
  mutable std::vector<std::pair<std::string, Value>> attrs;
  Value* find(std::string_view name) const;
};

// Python's repr of a str (quotes chosen as Python chooses them, non-printables escaped).
void append_repr_string(std::string_view s, std::string& out);
// Python's repr of a float: the shortest text that reads back, '1e+16', '0.0001', '1.0'.
void append_float(double d, std::string& out);

// a < b as Python orders them; throws std::invalid_argument (message Python's TypeError) when the
// types do not order.
bool less(const Value& a, const Value& b);

struct JsonOptions {
  std::string indent;  // used when has_indent
  bool has_indent = false;
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;  // \uXXXX for every character outside ' '..'~'
};
// json.dumps(value, ensure_ascii, ...): throws std::invalid_argument for what json refuses.
void append_json(const Value& v, const JsonOptions& options, std::string& out, int level = 0);

// Decodes the UTF-8 code point at s[i], advancing i (an invalid byte reads as itself).
char32_t next_code_point(std::string_view s, size_t& i);
void append_utf8(char32_t c, std::string& out);
// Python's str.isspace() of one code point.
bool is_space(char32_t c);

}  // namespace stoker::text::jinja
