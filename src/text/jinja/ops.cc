// ops.h: access, operators, iteration, globals and the methods of dict and list, as Python
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

bool in_list(std::string_view name, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (name == n) return true;
  }
  return false;
}

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
std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> o;
  for (size_t i = 0; i < s.size();) {
    o.push_back(i);
    next_code_point(s, i);
  }
  o.push_back(s.size());
  return o;
}

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
      if (self.type() == Type::kLoop && c.name == "changed") {
        const auto* loop = static_cast<const LoopObject*>(self.obj());
        Value now = Value::list(args.positional);
        if (!loop->last_changed.is_undefined() && loop->last_changed.equals(now)) {
          return Value::boolean(false);
        }
        loop->last_changed = std::move(now);
        return Value::boolean(true);
      }
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
      if (is_str_method(name)) return method(obj, name);
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
      if (name == "cycle" || name == "changed") return method(obj, name);
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
          std::vector<size_t> o = code_point_offsets(s);
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
    if (!ascii) o = code_point_offsets(obj.str());
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
      if (a.is_markup() != b.is_markup()) {  // Markup's __add__ and __radd__ escape the other
        return Value::markup(a.is_markup() ? std::string(a.str()) + html_escape(b.str())
                                           : html_escape(a.str()) + std::string(b.str()));
      }
      std::string s(a.str());
      s += b.str();
      return a.is_markup() ? Value::markup(std::move(s)) : Value::string(std::move(s));
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
      if (item.type() == Type::kList || item.is_dict() || item.type() == Type::kNamespace) {
        type_error(std::string("unhashable type: '") + item.type_name() + "'");
      }
      for (const auto& [k, v] : c.entries()) {
        if (k.equals(item)) return true;
      }
      return false;
    case Type::kIterator:
      if (static_cast<const IteratorObject*>(c.obj())->view) {
        for (const Value& v : iterate(c)) {
          if (v.equals(item)) return true;
        }
        return false;
      }
      for (Value v; next_item(c, &v);) {  // on a generator, Python's `in` stops at the match
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
      if (it->taken) {
        type_error(std::string("a ") + it->name +
                   " iterated after a filter took it as its input (jinja2 reads it lazily, so "
                   "which items each sees depends on the order they are read): unsupported");
      }
      List rest(it->items.begin() + static_cast<std::ptrdiff_t>(it->position), it->items.end());
      it->position = it->items.size();
      return rest;
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

List take(const Value& v) {
  List items = iterate(v);
  if (v.type() == Type::kIterator) static_cast<const IteratorObject*>(v.obj())->taken = true;
  return items;
}

bool next_item(const Value& v, Value* out) {
  const auto* it = static_cast<const IteratorObject*>(v.obj());
  if (it->view) {
    type_error(std::string("'") + it->name + "' object is not an iterator");
  }
  if (it->taken) iterate(v);  // refused, as there
  if (it->position >= it->items.size()) return false;
  *out = it->items[it->position++];
  return true;
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
