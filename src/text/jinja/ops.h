// What a template does with values, as jinja2 in its immutable sandbox does it on Python's
// objects: attribute and item access (dict keys through `.`, methods of str, dict and list),
// operators, comparisons, iteration, the filters and tests (filters.cc), and the globals. Each
// throws std::invalid_argument with Python's or jinja2's message; render.cc adds the template's
// line. Private to src/text/.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/jinja/ast.h"
#include "text/jinja/value.h"

namespace stoker::text::jinja {

struct Args {
  List positional;
  std::vector<std::pair<std::string_view, Value>> keywords;
};

// Arguments bound to parameter names, as Python binds a call (unknown keyword: an error).
class Bound {
 public:
  Bound(const Args& args, std::initializer_list<const char*> names, const char* callee);
  bool has(size_t i) const { return set_[i]; }
  const Value& get(size_t i) const { return values_[i]; }
  Value get_or(size_t i, Value fallback) const { return set_[i] ? values_[i] : fallback; }

 private:
  std::vector<Value> values_;
  std::vector<bool> set_;
};

struct Frame;
struct Node;

// A callable value: a global (range, dict, namespace, raise_exception, strftime_now), a method
// bound to its object ('a,b'.split), or a macro or call block's caller (render.cc calls those).
struct CallableObject : Object {
  enum class Kind { kRange, kDict, kNamespace, kRaise, kStrftime, kMethod, kMacro, kCaller };
  Kind kind;
  Value self;                  // kMethod
  std::string name;            // kMethod: the method; kMacro: the macro
  const Node* node = nullptr;  // kMacro, kCaller
  Frame* frame = nullptr;      // kMacro, kCaller: the scope they were defined in
};

// A for loop's `loop`.
struct LoopObject : Object {
  Value items;  // a list
  mutable size_t index = 0;
  mutable Value last_changed;  // loop.changed()'s last arguments (a list), undefined at first
};

Value global(std::string_view name);  // Undefined when not a global
Value call_builtin(const CallableObject& c, const Args& args);

Value get_attribute(const Value& obj, std::string_view name);
Value get_item(const Value& obj, const Value& key);
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

Value binary(Op op, const Value& a, const Value& b);
Value negate(const Value& v);
bool compare(Cmp op, const Value& a, const Value& b);
bool contains(const Value& container, const Value& item);

// The items a for loop (or list()) takes from `v`: a list's items, a dict's keys, a str's
// characters; none from Undefined.
List iterate(const Value& v);
// iterate() for a filter jinja2 evaluates lazily (map, select, reject, selectattr, rejectattr,
// unique, batch): a generator input is marked as taken.
List take(const Value& v);
// A generator's next item (consumed), or false when it has none: Python's next().
bool next_item(const Value& generator, Value* out);
// Python's len(); Undefined's is 0.
int64_t length(const Value& v);
// Raises jinja2's UndefinedError when `v` is undefined.
void require_defined(const Value& v);

Value apply_filter(Filter f, const Value& v, const Args& args);
bool apply_test(Test t, const Value& v, const Args& args);

// str helpers, on code points as Python counts them, with Python's full case mappings
// (case_tables.h: 'ß'.upper() is 'SS'; lower() makes a word's last Σ a ς).
enum class Case { kUpper, kLower, kTitle };
void append_case(Case which, char32_t c, std::string& out);
bool is_cased(char32_t c);
std::string to_lower(std::string_view s);
std::string to_upper(std::string_view s);
std::string py_title(std::string_view s);       // str.title()
std::string py_capitalize(std::string_view s);  // str.capitalize()
size_t code_points(std::string_view s);
std::vector<std::string> split_lines(std::string_view s, bool keep_ends);
std::string strip(std::string_view s, const Value& chars, bool left, bool right);
std::string html_escape(std::string_view s);  // markupsafe.escape's text
bool is_ascii(std::string_view s);
std::vector<size_t> code_point_offsets(std::string_view s);  // each code point's, and the end
std::string quoted(std::string_view s);                      // 'text', for messages

// The str methods (strings.cc): whether `name` is one of Python's (a template's s.name is then
// a method, not undefined), and a call of one; one not supported throws, naming it.
bool is_str_method(std::string_view name);
Value str_method(std::string_view s, std::string_view name, const Args& args);

}  // namespace stoker::text::jinja
