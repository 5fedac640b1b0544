// The filters and tests (ops.h), as jinja2/filters.py and jinja2/tests.py define them, with
// transformers' tojson (json.dumps(x, ensure_ascii=False, indent, separators, sort_keys)).
// Filters that return an iterator in jinja2 (reverse of a list, unique, map, select) return a
// list here: the same items wherever they are iterated, joined or counted.
#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "text/jinja/ops.h"

namespace stoker::text::jinja {

namespace {

struct Named {
  const char* name;
  int id;
};

const Named kFilters[] = {
    {"abs", int(Filter::kAbs)},
    {"batch", int(Filter::kBatch)},
    {"capitalize", int(Filter::kCapitalize)},
    {"count", int(Filter::kLength)},
    {"d", int(Filter::kDefault)},
    {"default", int(Filter::kDefault)},
    {"dictsort", int(Filter::kDictsort)},
    {"e", int(Filter::kEscape)},
    {"escape", int(Filter::kEscape)},
    {"first", int(Filter::kFirst)},
    {"float", int(Filter::kFloat)},
    {"indent", int(Filter::kIndent)},
    {"int", int(Filter::kInt)},
    {"items", int(Filter::kItems)},
    {"join", int(Filter::kJoin)},
    {"last", int(Filter::kLast)},
    {"length", int(Filter::kLength)},
    {"list", int(Filter::kList)},
    {"lower", int(Filter::kLower)},
    {"map", int(Filter::kMap)},
    {"max", int(Filter::kMax)},
    {"min", int(Filter::kMin)},
    {"reject", int(Filter::kReject)},
    {"rejectattr", int(Filter::kRejectattr)},
    {"replace", int(Filter::kReplace)},
    {"reverse", int(Filter::kReverse)},
    {"round", int(Filter::kRound)},
    {"safe", int(Filter::kSafe)},
    {"select", int(Filter::kSelect)},
    {"selectattr", int(Filter::kSelectattr)},
    {"sort", int(Filter::kSort)},
    {"string", int(Filter::kString)},
    {"sum", int(Filter::kSum)},
    {"title", int(Filter::kTitle)},
    {"tojson", int(Filter::kTojson)},
    {"trim", int(Filter::kTrim)},
    {"unique", int(Filter::kUnique)},
    {"upper", int(Filter::kUpper)},
    {"wordcount", int(Filter::kWordcount)},
};

const Named kTests[] = {
    {"boolean", int(Test::kBoolean)},
    {"callable", int(Test::kCallable)},
    {"defined", int(Test::kDefined)},
    {"divisibleby", int(Test::kDivisibleby)},
    {"eq", int(Test::kEq)},
    {"equalto", int(Test::kEq)},
    {"==", int(Test::kEq)},
    {"even", int(Test::kEven)},
    {"false", int(Test::kFalse)},
    {"float", int(Test::kFloat)},
    {"ge", int(Test::kGe)},
    {">=", int(Test::kGe)},
    {"gt", int(Test::kGt)},
    {"greaterthan", int(Test::kGt)},
    {">", int(Test::kGt)},
    {"in", int(Test::kIn)},
    {"integer", int(Test::kInteger)},
    {"iterable", int(Test::kIterable)},
    {"le", int(Test::kLe)},
    {"<=", int(Test::kLe)},
    {"lower", int(Test::kLower)},
    {"lt", int(Test::kLt)},
    {"lessthan", int(Test::kLt)},
    {"<", int(Test::kLt)},
    {"mapping", int(Test::kMapping)},
    {"ne", int(Test::kNe)},
    {"!=", int(Test::kNe)},
    {"none", int(Test::kNone)},
    {"number", int(Test::kNumber)},
    {"odd", int(Test::kOdd)},
    {"sameas", int(Test::kSameas)},
    {"sequence", int(Test::kSequence)},
    {"string", int(Test::kString)},
    {"true", int(Test::kTrue)},
    {"undefined", int(Test::kUndefined)},
    {"upper", int(Test::kUpper)},
};

[[noreturn]] void fail(const std::string& what) { throw std::invalid_argument(what); }

std::string_view soft_str(const Value& v, std::string& storage) {
  if (v.is_string()) return v.str();
  storage = v.to_str();
  return storage;
}

// jinja2's make_attrgetter: 'a.b.0' through getitem, each part.
Value attribute_of(const Value& item, std::string_view path) {
  Value v = item;
  size_t start = 0;
  for (;;) {
    size_t dot = path.find('.', start);
    std::string_view part = path.substr(start, dot == path.npos ? path.npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c));
    });
    v = get_item(v, digits ? Value::integer(std::stoll(std::string(part)))
                           : Value::string(std::string(part)));
    if (dot == path.npos) return v;
    start = dot + 1;
  }
}

Value attribute_arg(const Value& a) {
  if (!a.is_string() && a.type() != Type::kInt) fail("attribute must be a string or an integer");
  return a;
}

Value attribute_of(const Value& item, const Value& attr) {
  if (attr.type() == Type::kInt) return get_item(item, attr);
  return attribute_of(item, attr.str());
}

// The sort key of jinja2's ignore_case.
Value fold(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(to_lower(v.str()));
  return v;
}

double python_round(double x, int64_t digits) {
  if (!std::isfinite(x)) return x;
  if (digits > 300) return x;
  char buf[512];
  if (digits >= 0) {
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(digits), x);
    return std::strtod(buf, nullptr);
  }
  double p = std::pow(10.0, static_cast<double>(-digits));
  double y = std::nearbyint(x / p) * p;
  return y;
}

// Python's float(str): whitespace around, digits with underscores between, inf and nan.
bool parse_float(std::string_view s, double* out) {
  std::string t = strip(s, Value::none(), true, true);
  std::string clean;
  for (size_t k = 0; k < t.size(); ++k) {
    char c = t[k];
    if (c == '_') {
      if (k == 0 || k + 1 >= t.size() || !std::isdigit((unsigned char)t[k - 1]) ||
          !std::isdigit((unsigned char)t[k + 1])) {
        return false;
      }
      continue;
    }
    clean += c;
  }
  std::string lower = to_lower(clean);
  std::string_view body = lower;
  if (!body.empty() && (body[0] == '+' || body[0] == '-')) body.remove_prefix(1);
  if (body == "inf" || body == "infinity" || body == "nan") {
    *out = std::strtod(lower.c_str(), nullptr);
    return true;
  }
  if (body.empty() || body.find_first_not_of("0123456789.e+-") != body.npos) return false;
  char* end = nullptr;
  *out = std::strtod(clean.c_str(), &end);
  return end == clean.c_str() + clean.size();
}

// Python's int(str, 10).
bool parse_int(std::string_view s, int64_t* out) {
  std::string t = strip(s, Value::none(), true, true);
  size_t k = 0;
  bool negative = false;
  if (k < t.size() && (t[k] == '+' || t[k] == '-')) negative = t[k++] == '-';
  if (k >= t.size()) return false;
  __int128 v = 0;
  bool digit_before = false;
  for (; k < t.size(); ++k) {
    char c = t[k];
    if (c == '_' && digit_before && k + 1 < t.size() && std::isdigit((unsigned char)t[k + 1])) {
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    v = v * 10 + (c - '0');
    if (v > (static_cast<__int128>(1) << 63)) fail("integer beyond 64 bits: " + t);
    digit_before = true;
  }
  if (negative) v = -v;
  if (v > INT64_MAX) fail("integer beyond 64 bits: " + t);
  *out = static_cast<int64_t>(v);
  return true;
}

}  // namespace

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {

std::string indent(std::string_view s, const Value& width, bool first, bool blank) {
  std::string pad;
  if (width.is_string()) {
    pad = std::string(width.str());
  } else {
    pad = std::string(std::max<int64_t>(0, width.as_int()), ' ');
  }
  std::string text(s);
  text += '\n';
  std::vector<std::string> lines = split_lines(text, false);
  std::string rv;
  if (blank) {
    for (size_t k = 0; k < lines.size(); ++k) {
      if (k) rv += "\n" + pad;
      rv += lines[k];
    }
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t k = 1; k < lines.size(); ++k) {
      rv += '\n';
      if (!lines[k].empty()) rv += pad;
      rv += lines[k];
    }
  }
  if (first) rv = pad + rv;
  return rv;
}

std::string title(std::string_view s) {
  // jinja2's do_title: words split at runs of [-\s({\[<]; each word's first character upper(),
  // the rest lower().
  std::string out;
  size_t word = std::string_view::npos;  // where the current word starts
  auto flush = [&](size_t end) {
    if (word == std::string_view::npos) return;
    size_t i = word;
    append_case(Case::kUpper, next_code_point(s, i), out);
    out += to_lower(s.substr(i, end - i));
    word = std::string_view::npos;
  };
  for (size_t i = 0; i < s.size();) {
    size_t at = i;
    char32_t c = next_code_point(s, i);
    bool delim = is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (delim) {
      flush(at);
      out.append(s.substr(at, i - at));
    } else if (word == std::string_view::npos) {
      word = at;
    }
  }
  flush(s.size());
  return out;
}

int64_t word_count(std::string_view s) {
  int64_t n = 0;
  bool in_word = false;
  for (size_t i = 0; i < s.size();) {
    char32_t c = next_code_point(s, i);
    auto k = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    bool w = c == '_' || (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) ||
             (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return n;
}

// select/reject/selectattr/rejectattr: the test named by the first of `rest`, its arguments the
// others; with none, truthiness.
List select(const Value& v, const Args& args, bool attr, bool keep) {
  List items = v.truthy() ? take(v) : List();  // jinja2: `if value: for item in value`
  size_t k = 0;
  Value attribute;
  if (attr) {
    if (args.positional.empty()) fail("missing the attribute to test");
    attribute = attribute_arg(args.positional[k++]);
  }
  bool has_test = k < args.positional.size();
  Test test = Test::kDefined;
  Args test_args;
  if (has_test) {
    const Value& name = args.positional[k++];
    if (!name.is_string() || !find_test(name.str(), &test)) {
      fail("unsupported test " + name.to_str());
    }
    test_args.positional.assign(args.positional.begin() + k, args.positional.end());
    test_args.keywords = args.keywords;
  }
  List out;
  for (const Value& item : items) {
    Value x = attr ? attribute_of(item, attribute) : item;
    bool ok = has_test ? apply_test(test, x, test_args) : x.truthy();
    if (ok == keep) out.push_back(item);
  }
  return out;
}

List sorted(List items, bool reverse, bool case_sensitive, const Value& attribute) {
  std::vector<std::pair<Value, size_t>> keyed;
  for (size_t k = 0; k < items.size(); ++k) {
    Value key = attribute.is_undefined() ? items[k] : attribute_of(items[k], attribute);
    keyed.emplace_back(fold(key, case_sensitive), k);
  }
  // jinja2's keys are one-item lists, which Python compares with == first: equal keys (two
  // undefined attributes) never reach <.
  auto before = [](const Value& x, const Value& y) { return !x.equals(y) && less(x, y); };
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    return reverse ? before(b.first, a.first) : before(a.first, b.first);
  });
  List out;
  for (auto& [key, k] : keyed) out.push_back(items[k]);
  return out;
}

Value min_max(const Value& v, const Args& args, bool max) {
  Bound b(args, {"case_sensitive", "attribute"}, max ? "max" : "min");
  bool cs = b.has(0) && b.get(0).truthy();
  List items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  Value attr = b.get_or(1, Value());
  auto key = [&](const Value& x) {
    return fold(attr.is_undefined() ? x : attribute_of(x, attr), cs);
  };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t k = 1; k < items.size(); ++k) {
    Value kk = key(items[k]);
    if (max ? less(best_key, kk) : less(kk, best_key)) {
      best = k;
      best_key = kk;
    }
  }
  return items[best];
}

int64_t int_arg(const Value& v, const char* what) {
  if (v.type() != Type::kInt && v.type() != Type::kBool) {
    fail(std::string(what) + " must be an integer, not " + v.type_name());
  }
  return v.as_int();
}

}  // namespace

bool find_filter(std::string_view name, Filter* out) {
  for (const Named& f : kFilters) {
    if (name == f.name) {
      *out = static_cast<Filter>(f.id);
      return true;
    }
  }
  return false;
}

bool find_test(std::string_view name, Test* out) {
  for (const Named& t : kTests) {
    if (name == t.name) {
      *out = static_cast<Test>(t.id);
      return true;
    }
  }
  return false;
}

Value apply_filter(Filter f, const Value& v, const Args& args) {
  std::string storage;
  switch (f) {
    case Filter::kAbs:
      Bound(args, {}, "abs");
      if (v.type() == Type::kFloat) return Value::real(std::fabs(v.as_double()));
      if (v.type() == Type::kInt || v.type() == Type::kBool) {
        if (v.as_int() == INT64_MIN) fail("integer overflow: the result is beyond 64 bits");
        return Value::integer(std::abs(v.as_int()));
      }
      fail(std::string("bad operand type for abs(): '") + v.type_name() + "'");
    case Filter::kBatch: {
      Bound b(args, {"linecount", "fill_with"}, "batch");
      int64_t n = int_arg(b.get(0), "batch size");
      if (n <= 0) fail("batch size must be positive");
      List rows, row;
      for (const Value& item : take(v)) {
        row.push_back(item);
        if (static_cast<int64_t>(row.size()) == n) {
          rows.push_back(Value::list(std::move(row)));
          row.clear();
        }
      }
      if (!row.empty()) {
        if (b.has(1) && !b.get(1).is_none()) {
          while (static_cast<int64_t>(row.size()) < n) row.push_back(b.get(1));
        }
        rows.push_back(Value::list(std::move(row)));
      }
      return Value::iterator(std::move(rows), "generator");
    }
    case Filter::kCapitalize:
      Bound(args, {}, "capitalize");
      return Value::string(py_capitalize(soft_str(v, storage)));
    case Filter::kDefault: {
      Bound b(args, {"default_value", "boolean"}, "default");
      bool boolean = b.has(1) && b.get(1).truthy();
      if (v.is_undefined() || (boolean && !v.truthy())) {
        return b.get_or(0, Value::string(""));
      }
      return v;
    }
    case Filter::kDictsort: {
      Bound b(args, {"case_sensitive", "by", "reverse"}, "dictsort");
      if (!v.is_dict()) fail("You can only sort by either a dict");
      bool by_value = b.has(1) && b.get(1).is_string() && b.get(1).str() == "value";
      if (b.has(1) && !by_value && !(b.get(1).is_string() && b.get(1).str() == "key")) {
        fail("You can only sort by either \"key\" or \"value\"");
      }
      List pairs;
      for (const auto& [k, value] : v.entries()) pairs.push_back(Value::list({k, value}, true));
      return Value::list(sorted(std::move(pairs), b.has(2) && b.get(2).truthy(),
                                b.has(0) && b.get(0).truthy(), Value::integer(by_value ? 1 : 0)));
    }
    case Filter::kEscape:
      Bound(args, {}, "escape");
      if (v.is_markup()) return v;
      return Value::markup(html_escape(soft_str(v, storage)));
    case Filter::kFirst: {
      Bound(args, {}, "first");
      if (v.type() == Type::kIterator && !static_cast<const IteratorObject*>(v.obj())->view) {
        Value item;  // next(iter(seq)): one item of a generator, the rest left for later
        if (next_item(v, &item)) return item;
        return Value::undefined("No first item, sequence was empty.");
      }
      List items = iterate(v);
      if (items.empty()) return Value::undefined("No first item, sequence was empty.");
      return items.front();
    }
    case Filter::kLast: {
      Bound(args, {}, "last");
      if (v.type() == Type::kIterator && !static_cast<const IteratorObject*>(v.obj())->view) {
        fail(std::string("'") + v.type_name() + "' object is not reversible");
      }
      List items = iterate(v);
      if (items.empty()) return Value::undefined("No last item, sequence was empty.");
      return items.back();
    }
    case Filter::kFloat: {
      Bound b(args, {"default"}, "float");
      Value fallback = b.get_or(0, Value::real(0.0));
      require_defined(v);  // float(Undefined) raises UndefinedError, which do_float lets through
      if (v.is_number()) return Value::real(v.as_double());
      double d;
      if (v.is_string() && parse_float(v.str(), &d)) return Value::real(d);
      return fallback;
    }
    case Filter::kIndent: {
      Bound b(args, {"width", "first", "blank"}, "indent");
      Value width = b.get_or(0, Value::integer(4));
      if (!width.is_string()) int_arg(width, "indent width");
      require_defined(v);
      if (!v.is_string()) {  // jinja2 appends "\n" to the value itself
        fail(std::string("unsupported operand type(s) for +=: '") + v.type_name() + "' and 'str'");
      }
      return Value::string(
          indent(v.str(), width, b.has(1) && b.get(1).truthy(), b.has(2) && b.get(2).truthy()));
    }
    case Filter::kInt: {
      Bound b(args, {"default", "base"}, "int");
      Value fallback = b.get_or(0, Value::integer(0));
      if (b.has(1) && b.get(1).as_int() != 10)
        fail("int with a base other than 10 is not supported");
      require_defined(v);
      if (v.type() == Type::kInt || v.type() == Type::kBool) return Value::integer(v.as_int());
      if (v.type() == Type::kFloat) {
        double d = std::trunc(v.as_double());
        if (!std::isfinite(d)) return fallback;
        if (std::fabs(d) >= 9.2e18) fail("integer beyond 64 bits");
        return Value::integer(static_cast<int64_t>(d));
      }
      if (v.is_string()) {
        int64_t i;
        if (parse_int(v.str(), &i)) return Value::integer(i);
        double d;
        if (parse_float(v.str(), &d) && std::isfinite(d)) {
          if (std::fabs(d) >= 9.2e18) fail("integer beyond 64 bits");
          return Value::integer(static_cast<int64_t>(std::trunc(d)));
        }
      }
      return fallback;
    }
    case Filter::kItems: {
      Bound(args, {}, "items");
      if (v.is_undefined()) return Value::iterator({}, "generator");
      if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
      List out;
      for (const auto& [k, value] : v.entries()) out.push_back(Value::list({k, value}, true));
      return Value::iterator(std::move(out), "generator");
    }
    case Filter::kJoin: {
      Bound b(args, {"d", "attribute"}, "join");
      std::string sep_storage;
      std::string_view sep = b.has(0) ? soft_str(b.get(0), sep_storage) : std::string_view();
      std::string out;
      bool first = true;
      for (const Value& item : iterate(v)) {
        if (!first) out += sep;
        first = false;
        (b.has(1) ? attribute_of(item, attribute_arg(b.get(1))) : item).append_str(out);
      }
      return Value::string(std::move(out));
    }
    case Filter::kLength:
      Bound(args, {}, "length");
      return Value::integer(length(v));
    case Filter::kList:
      Bound(args, {}, "list");
      return Value::list(iterate(v));
    case Filter::kLower:
      Bound(args, {}, "lower");
      return Value::string(to_lower(soft_str(v, storage)));
    case Filter::kUpper:
      Bound(args, {}, "upper");
      return Value::string(to_upper(soft_str(v, storage)));
    case Filter::kMap: {
      List out;
      if (!v.truthy()) return Value::iterator({}, "generator");  // jinja2: `if value: ...`
      bool by_attribute = args.positional.empty();
      for (const auto& [name, value] : args.keywords) by_attribute |= name == "attribute";
      if (by_attribute) {
        Bound b(args, {"attribute", "default"}, "map");
        if (!b.has(0)) fail("map needs a filter name or attribute=");
        Value attr = attribute_arg(b.get(0));
        for (const Value& item : take(v)) {
          Value x = attribute_of(item, attr);
          out.push_back(b.has(1) && x.is_undefined() ? b.get(1) : x);
        }
      } else {
        const Value& name = args.positional[0];
        Filter inner;
        if (!name.is_string() || !find_filter(name.str(), &inner)) {
          fail("unsupported filter " + name.to_str() + " in map");
        }
        Args rest;
        rest.positional.assign(args.positional.begin() + 1, args.positional.end());
        rest.keywords = args.keywords;
        for (const Value& item : take(v)) out.push_back(apply_filter(inner, item, rest));
      }
      return Value::iterator(std::move(out), "generator");
    }
    case Filter::kMax:
      return min_max(v, args, true);
    case Filter::kMin:
      return min_max(v, args, false);
    case Filter::kReject:
      return Value::iterator(select(v, args, false, false), "generator");
    case Filter::kRejectattr:
      return Value::iterator(select(v, args, true, false), "generator");
    case Filter::kSelect:
      return Value::iterator(select(v, args, false, true), "generator");
    case Filter::kSelectattr:
      return Value::iterator(select(v, args, true, true), "generator");
    case Filter::kReplace: {
      Bound b(args, {"old", "new", "count"}, "replace");
      Args call;
      call.positional = {Value::string(b.get(0).to_str()), Value::string(b.get(1).to_str())};
      if (b.has(2) && !b.get(2).is_none()) call.positional.push_back(b.get(2));
      CallableObject m;
      m.kind = CallableObject::Kind::kMethod;
      m.self = v.is_string() ? v : Value::string(v.to_str());
      m.name = "replace";
      return call_builtin(m, call);
    }
    case Filter::kReverse: {
      Bound(args, {}, "reverse");
      if (v.is_string()) return get_slice(v, Value::none(), Value::none(), Value::integer(-1));
      // reversed() where Python has it (a one-pass iterator), else a reversed list.
      bool reversible =
          v.is_sequence() || v.is_dict() ||
          (v.type() == Type::kIterator && static_cast<const IteratorObject*>(v.obj())->view);
      List items = iterate(v);
      std::reverse(items.begin(), items.end());
      if (!reversible) return Value::list(std::move(items));
      return Value::iterator(std::move(items), v.is_dict()               ? "dict_reversekeyiterator"
                                               : v.type() == Type::kList ? "list_reverseiterator"
                                                                         : "reversed");
    }
    case Filter::kRound: {
      Bound b(args, {"precision", "method"}, "round");
      int64_t precision = b.has(0) ? int_arg(b.get(0), "precision") : 0;
      std::string method = b.has(1) ? b.get(1).to_str() : "common";
      if (method != "common" && method != "ceil" && method != "floor") {
        fail("method must be common, ceil or floor");
      }
      if (!v.is_number())
        fail(std::string("type ") + v.type_name() + " doesn't define __round__ method");
      if (method == "common") {
        if (v.type() != Type::kFloat) {
          if (precision >= 0) return Value::integer(v.as_int());
          fail("round of an integer to negative digits is not supported");
        }
        return Value::real(python_round(v.as_double(), precision));
      }
      double p = std::pow(10.0, static_cast<double>(precision));
      double x = v.as_double() * p;
      return Value::real((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
    }
    case Filter::kSafe:
      Bound(args, {}, "safe");
      if (v.is_markup()) return v;
      return Value::markup(std::string(soft_str(v, storage)));
    case Filter::kSort: {
      Bound b(args, {"reverse", "case_sensitive", "attribute"}, "sort");
      Value attr = b.has(2) ? attribute_arg(b.get(2)) : Value();
      if (attr.is_string() && attr.str().find(',') != std::string_view::npos) {
        fail("sort by several attributes is not supported");
      }
      return Value::list(
          sorted(iterate(v), b.has(0) && b.get(0).truthy(), b.has(1) && b.get(1).truthy(), attr));
    }
    case Filter::kString:
      Bound(args, {}, "string");
      if (v.is_string()) return v;
      return Value::string(v.to_str());
    case Filter::kSum: {
      Bound b(args, {"attribute", "start"}, "sum");
      Value total = b.get_or(1, Value::integer(0));
      for (const Value& item : iterate(v)) {
        total =
            binary(Op::kAdd, total, b.has(0) ? attribute_of(item, attribute_arg(b.get(0))) : item);
      }
      return total;
    }
    case Filter::kTitle:
      Bound(args, {}, "title");
      return Value::string(title(soft_str(v, storage)));
    case Filter::kTojson: {
      Bound b(args, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
      JsonOptions o;
      o.ensure_ascii = b.has(0) && b.get(0).truthy();
      if (b.has(1) && !b.get(1).is_none()) {
        o.has_indent = true;
        const Value& i = b.get(1);
        if (i.is_string()) {
          o.indent = std::string(i.str());
        } else {
          o.indent = std::string(std::max<int64_t>(0, int_arg(i, "indent")), ' ');
        }
        o.item_separator = ",";
      }
      if (b.has(2) && !b.get(2).is_none()) {
        const Value& s = b.get(2);
        if (!s.is_sequence() || s.items().size() != 2 || !s.items()[0].is_string() ||
            !s.items()[1].is_string()) {
          fail("separators must be a pair of strings");
        }
        o.item_separator = std::string(s.items()[0].str());
        o.key_separator = std::string(s.items()[1].str());
      }
      o.sort_keys = b.has(3) && b.get(3).truthy();
      std::string out;
      append_json(v, o, out);
      return Value::string(std::move(out));
    }
    case Filter::kTrim: {
      Bound b(args, {"chars"}, "trim");
      return Value::string(strip(soft_str(v, storage), b.get_or(0, Value::none()), true, true));
    }
    case Filter::kUnique: {
      Bound b(args, {"case_sensitive", "attribute"}, "unique");
      bool cs = b.has(0) && b.get(0).truthy();
      List seen, out;
      for (const Value& item : take(v)) {
        Value key = fold(b.has(1) ? attribute_of(item, attribute_arg(b.get(1))) : item, cs);
        if (key.type() == Type::kList || key.is_dict() || key.type() == Type::kNamespace) {
          fail(std::string("unhashable type: '") + key.type_name() + "'");
        }
        bool dup = false;
        for (const Value& s : seen) dup = dup || s.equals(key);
        if (!dup) {
          seen.push_back(key);
          out.push_back(item);
        }
      }
      return Value::iterator(std::move(out), "generator");
    }
    case Filter::kWordcount:
      Bound(args, {}, "wordcount");
      return Value::integer(word_count(soft_str(v, storage)));
  }
  fail("unsupported filter");
}

bool apply_test(Test t, const Value& v, const Args& args) {
  auto arg = [&](const char* name) {
    Bound b(args, {name}, "test");
    return b.get(0);
  };
  switch (t) {
    case Test::kBoolean:
      return v.type() == Type::kBool;
    case Test::kCallable:
      return v.type() == Type::kCallable;
    case Test::kDefined:
      return !v.is_undefined();
    case Test::kUndefined:
      return v.is_undefined();
    case Test::kDivisibleby: {
      Value m = binary(Op::kMod, v, arg("num"));
      return m.as_double() == 0;
    }
    case Test::kEven:
      return binary(Op::kMod, v, Value::integer(2)).as_double() == 0;
    case Test::kOdd:
      return binary(Op::kMod, v, Value::integer(2)).as_double() == 1;
    case Test::kEq:
      return compare(Cmp::kEq, v, arg("other"));
    case Test::kNe:
      return compare(Cmp::kNe, v, arg("other"));
    case Test::kGe:
      return compare(Cmp::kGe, v, arg("other"));
    case Test::kGt:
      return compare(Cmp::kGt, v, arg("other"));
    case Test::kLe:
      return compare(Cmp::kLe, v, arg("other"));
    case Test::kLt:
      return compare(Cmp::kLt, v, arg("other"));
    case Test::kIn:
      return contains(arg("seq"), v);
    case Test::kFalse:
      return v.type() == Type::kBool && !v.as_bool();
    case Test::kTrue:
      return v.type() == Type::kBool && v.as_bool();
    case Test::kFloat:
      return v.type() == Type::kFloat;
    case Test::kInteger:
      return v.type() == Type::kInt;
    case Test::kNumber:
      return v.is_number();
    case Test::kIterable:
      return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict() ||
             v.type() == Type::kLoop || v.type() == Type::kIterator;
    case Test::kSequence:
      return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict() ||
             (v.type() == Type::kIterator && std::string_view(v.type_name()) == "range");
    case Test::kMapping:
      return v.is_dict();
    case Test::kNone:
      return v.is_none();
    case Test::kString:
      return v.is_string();
    case Test::kLower: {
      std::string s = v.to_str();
      CallableObject m;
      m.kind = CallableObject::Kind::kMethod;
      m.self = Value::string(s);
      m.name = "islower";
      return call_builtin(m, {}).as_bool();
    }
    case Test::kUpper: {
      CallableObject m;
      m.kind = CallableObject::Kind::kMethod;
      m.self = Value::string(v.to_str());
      m.name = "isupper";
      return call_builtin(m, {}).as_bool();
    }
    case Test::kSameas: {
      Value o = arg("other");
      if (v.type() != o.type()) return false;
      switch (v.type()) {
        case Type::kNone:
        case Type::kUndefined:
          return v.type() == Type::kNone;
        case Type::kBool:
          return v.as_bool() == o.as_bool();
        case Type::kInt:
          return v.as_int() == o.as_int() && v.as_int() >= -5 && v.as_int() <= 256;
        default:
          return v.obj() == o.obj();
      }
    }
  }
  fail("unsupported test");
}

}  // namespace stoker::text::jinja
