// render_template (ast.h): walks the parsed template with jinja2's scoping (a for loop's body, a
// macro, a caller, and a with, set, filter or generation block have their own scope; if does
// not; each loop iteration starts from the enclosing scope again), writing the output and
// recording the generation spans as transformers' AssistantTracker does.
#include <simdjson.h>

#include <deque>
#include <stdexcept>

#include "stoker/errors.h"
#include "text/jinja/ast.h"
#include "text/jinja/ops.h"

namespace stoker::text::jinja {

struct Frame {
  Frame* parent = nullptr;
  std::vector<std::pair<std::string_view, Value>> vars;

  Value* find(std::string_view name) {
    for (auto& [k, v] : vars) {
      if (k == name) return &v;
    }
    return nullptr;
  }
  void set(std::string_view name, Value v) {
    if (Value* slot = find(name)) {
      *slot = std::move(v);
    } else {
      vars.emplace_back(name, std::move(v));
    }
  }
};

namespace {

constexpr int kMaxCallDepth = 200;
// Hostile templates must end: a render spends at most kMaxRenderSteps (chat_template.h): one per
// loop iteration, per item of a list a call, filter or operator returned, per 256 bytes of a
// string one returned and of text written out.
constexpr uint64_t kMaxRenderSteps = uint64_t{1} << 20;
// Expressions evaluated inside one another (operator chains, filter chains, macro calls).
constexpr int kMaxEvalDepth = 1000;

Value from_json(simdjson::dom::element e) {
  switch (e.type()) {
    case simdjson::dom::element_type::OBJECT: {
      std::vector<std::pair<Value, Value>> entries;
      simdjson::dom::object object;
      if (e.get(object) != simdjson::SUCCESS) throw std::invalid_argument("bad JSON object");
      for (auto field : object) {
        Value key = Value::string(std::string(field.key));
        Value value = from_json(field.value);
        bool replaced = false;  // json.loads keeps a repeated key's last value, at its first place
        for (auto& [k, v] : entries) {
          if (k.str() == key.str()) {
            v = value;
            replaced = true;
          }
        }
        if (!replaced) entries.emplace_back(std::move(key), std::move(value));
      }
      return Value::dict(std::move(entries));
    }
    case simdjson::dom::element_type::ARRAY: {
      List items;
      simdjson::dom::array array;
      if (e.get(array) != simdjson::SUCCESS) throw std::invalid_argument("bad JSON array");
      for (auto item : array) items.push_back(from_json(item));
      return Value::list(std::move(items));
    }
    case simdjson::dom::element_type::STRING:
      return Value::string(std::string(e.get_string().value_unsafe()));
    case simdjson::dom::element_type::INT64:
      return Value::integer(e.get_int64().value_unsafe());
    case simdjson::dom::element_type::UINT64:
      throw std::invalid_argument("an integer beyond 64 bits in the context");
    case simdjson::dom::element_type::DOUBLE:
      return Value::real(e.get_double().value_unsafe());
    case simdjson::dom::element_type::BOOL:
      return Value::boolean(e.get_bool().value_unsafe());
    case simdjson::dom::element_type::NULL_VALUE:
      return Value::none();
  }
  return Value::none();
}

class Renderer {
 public:
  Renderer(const ChatTemplate::Parsed& parsed, Value context)
      : parsed_(parsed), context_(std::move(context)) {}

  RenderedChat run() {
    RenderedChat result;
    out_ = &result.text;
    top_ = &result.text;
    spans_ = &result.generation;
    Frame* root = new_frame(nullptr);
    exec(parsed_.body, root);
    return result;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  [[noreturn]] void fail_at(int line, int column, const std::string& what) const {
    throw InvalidArgument(parsed_.origin + ":" + std::to_string(line) + ":" +
                          std::to_string(column) + ": " + what);
  }

  Frame* new_frame(Frame* parent) {
    frames_.emplace_back();
    frames_.back().parent = parent;
    return &frames_.back();
  }

  Value lookup(std::string_view name, Frame* f) const {
    for (; f; f = f->parent) {
      if (Value* v = f->find(name)) return *v;
    }
    if (const Value* v = context_.find(name)) return *v;
    Value g = global(name);
    if (!g.is_undefined()) return g;
    return Value::undefined("'" + std::string(name) + "' is undefined");
  }

  Flow exec(const Body& body, Frame* f) {
    for (const Node& n : body) {
      Flow flow;
      try {
        flow = exec(n, f);
      } catch (const std::invalid_argument& e) {
        fail_at(n.line, n.column, e.what());
      }
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  // Renders `body` into a string of its own (a macro, a set block, a filter block).
  std::string capture(const Body& body, Frame* f, Flow* flow = nullptr) {
    std::string buffer;
    std::string* saved = out_;
    out_ = &buffer;
    Flow result;
    try {
      result = exec(body, f);
    } catch (...) {
      out_ = saved;
      throw;
    }
    out_ = saved;
    if (flow) *flow = result;
    return buffer;
  }

  void assign(const Target& t, Value v, Frame* f) {
    if (!t.attribute.empty()) {
      Value ns = lookup(t.names[0], f);
      if (ns.type() != Type::kNamespace) {
        throw std::invalid_argument("cannot assign attribute on non-namespace object");
      }
      if (t.attribute[0] == '_') {
        throw std::invalid_argument(
            "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
            t.attribute + "'. Please rename the attribute.");
      }
      auto* object = static_cast<const NamespaceObject*>(ns.obj());
      if (Value* slot = object->find(t.attribute)) {
        *slot = std::move(v);
      } else {
        object->attrs.emplace_back(t.attribute, std::move(v));
      }
      return;
    }
    if (!t.unpack) {
      f->set(t.names[0], std::move(v));
      return;
    }
    List items = iterate(v);
    if (items.size() != t.names.size()) {
      throw std::invalid_argument(
          items.size() < t.names.size()
              ? "not enough values to unpack (expected " + std::to_string(t.names.size()) +
                    ", got " + std::to_string(items.size()) + ")"
              : "too many values to unpack (expected " + std::to_string(t.names.size()) + ")");
    }
    for (size_t k = 0; k < items.size(); ++k) f->set(t.names[k], std::move(items[k]));
  }

  Flow exec(const Node& n, Frame* f) {
    switch (n.kind) {
      case Node::Kind::kText:
        write(n.text);
        return Flow::kNormal;
      case Node::Kind::kPrint:
        write(eval(*n.expr, f));
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (const auto& [cond, body] : n.branches) {
          if (!cond || eval(*cond, f).truthy()) return exec(body, f);
        }
        return Flow::kNormal;
      case Node::Kind::kFor:
        return exec_for(n, f);
      case Node::Kind::kSet:
        assign(n.target, eval(*n.expr, f), f);
        return Flow::kNormal;
      case Node::Kind::kSetBlock: {
        Flow flow;
        Value v = Value::string(capture(n.body, new_frame(f), &flow));
        // A break or continue inside leaves before the assignment, as in jinja2's code.
        if (flow != Flow::kNormal) return flow;
        if (n.expr) v = eval_filters(*n.expr, f, std::move(v));
        assign(n.target, std::move(v), f);
        return flow;
      }
      case Node::Kind::kFilterBlock: {
        Flow flow;
        Value v = Value::string(capture(n.body, new_frame(f), &flow));
        if (flow != Flow::kNormal) return flow;  // jinja2 drops the block's output then
        write(eval_filters(*n.expr, f, std::move(v)));
        return flow;
      }
      case Node::Kind::kMacro: {
        auto c = std::make_shared<CallableObject>();
        c->kind = CallableObject::Kind::kMacro;
        c->name = n.name;
        c->node = &n;
        c->frame = f;
        f->set(n.name, Value::object(Type::kCallable, std::move(c)));
        return Flow::kNormal;
      }
      case Node::Kind::kCallBlock: {
        auto c = std::make_shared<CallableObject>();
        c->kind = CallableObject::Kind::kCaller;
        c->name = "caller";
        c->node = &n;
        c->frame = f;
        const Expr& call = *n.expr;
        Value callee = eval(*call.children[0], f);
        Args args = eval_args(call, f);
        args.keywords.emplace_back("caller", Value::object(Type::kCallable, std::move(c)));
        write(call_value(callee, args, call));
        return Flow::kNormal;
      }
      case Node::Kind::kWith: {
        Frame* inner = new_frame(f);
        for (const auto& [target, value] : n.assignments) assign(target, eval(*value, f), inner);
        return exec(n.body, inner);
      }
      case Node::Kind::kGeneration: {
        std::string text = capture(n.body, new_frame(f));
        // AssistantTracker: the start is the length of what the template's top level has
        // yielded so far, wherever the block is.
        size_t start = top_->size();
        spans_->emplace_back(start, start + text.size());
        write(text);
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Node& n, Frame* f) {
    Value seq = eval(*n.expr, f);
    List items = iterate(seq);
    if (n.condition) {
      List kept;
      for (Value& item : items) {
        spend(1);
        Frame* probe = new_frame(f);
        assign(n.target, item, probe);
        if (eval(*n.condition, probe).truthy()) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    // The else block runs unless an iteration ran to its end: jinja2's generated code clears its
    // flag at the end of the body, which a break or continue skips.
    bool completed = false;
    if (!items.empty()) {
      auto loop = std::make_shared<LoopObject>();
      loop->items = Value::list(std::move(items));
      const List& list = loop->items.items();
      Value loop_value = Value::object(Type::kLoop, loop);
      for (size_t k = 0; k < list.size(); ++k) {
        spend(1);
        loop->index = k;
        Frame* inner = new_frame(f);
        assign(n.target, list[k], inner);
        inner->set("loop", loop_value);
        Flow flow = exec(n.body, inner);
        if (flow == Flow::kBreak) break;
        completed |= flow == Flow::kNormal;
      }
    }
    if (completed || n.else_body.empty()) return Flow::kNormal;
    return exec(n.else_body, new_frame(f));
  }

  // A filter chain (a filter block's, or a set block's) applied to `input`.
  Value eval_filters(const Expr& e, Frame* f, Value input) {
    Value v = e.children[0] ? eval_filters(*e.children[0], f, std::move(input)) : std::move(input);
    return apply_filter(e.filter, v, eval_args(e, f));
  }

  Args eval_args(const Expr& e, Frame* f) {
    Args args;
    for (const Arg& a : e.args) {
      if (a.name.empty()) {
        args.positional.push_back(eval(*a.value, f));
      } else {
        args.keywords.emplace_back(a.name, eval(*a.value, f));
      }
    }
    return args;
  }

  Value call_value(const Value& callee, const Args& args, const Expr& at) {
    if (callee.is_undefined()) require_defined(callee);
    if (callee.type() != Type::kCallable) {
      throw std::invalid_argument(std::string("'") + callee.type_name() +
                                  "' object is not callable");
    }
    const auto& c = *static_cast<const CallableObject*>(callee.obj());
    if (c.kind != CallableObject::Kind::kMacro && c.kind != CallableObject::Kind::kCaller) {
      return call_builtin(c, args);
    }
    if (++depth_ > kMaxCallDepth) {
      --depth_;
      fail_at(at.line, at.column,
              "macro calls nested deeper than " + std::to_string(kMaxCallDepth));
    }
    const Node& n = *c.node;
    Frame* inner = new_frame(c.frame);
    if (args.positional.size() > n.params.size() && !n.uses_varargs) {
      throw std::invalid_argument("macro '" + c.name + "' takes not more than " +
                                  std::to_string(n.params.size()) + " argument(s)");
    }
    std::vector<bool> given(n.params.size(), false);
    List varargs;
    for (size_t k = 0; k < args.positional.size(); ++k) {
      if (k < n.params.size()) {
        inner->set(n.params[k], args.positional[k]);
        given[k] = true;
      } else {
        varargs.push_back(args.positional[k]);
      }
    }
    std::vector<std::pair<Value, Value>> kwargs;
    for (const auto& [name, value] : args.keywords) {
      auto it = std::find(n.params.begin(), n.params.end(), name);
      if (it != n.params.end()) {
        inner->set(*it, value);
        given[it - n.params.begin()] = true;
      } else if (name == "caller" && n.uses_caller) {
        inner->set("caller", value);
      } else if (n.uses_kwargs) {
        kwargs.emplace_back(Value::string(std::string(name)), value);
      } else {
        throw std::invalid_argument("macro '" + c.name + "' takes no keyword argument '" +
                                    std::string(name) + "'");
      }
    }
    if (n.uses_varargs) inner->set("varargs", Value::list(std::move(varargs), true));
    if (n.uses_kwargs) inner->set("kwargs", Value::dict(std::move(kwargs)));
    for (size_t k = 0; k < n.params.size(); ++k) {
      if (given[k]) continue;
      inner->set(n.params[k], n.defaults[k] ? eval(*n.defaults[k], inner)
                                            : Value::undefined("parameter '" + n.params[k] +
                                                               "' was not provided"));
    }
    std::string text;
    try {
      text = capture(n.body, inner);
    } catch (...) {
      --depth_;
      throw;
    }
    --depth_;
    return Value::string(std::move(text));
  }

  Value eval(const Expr& e, Frame* f) {
    if (eval_depth_ >= kMaxEvalDepth) {
      fail_at(e.line, e.column, "expressions nested deeper than " + std::to_string(kMaxEvalDepth));
    }
    ++eval_depth_;
    try {
      Value v = eval_inner(e, f);
      --eval_depth_;
      if (e.kind == Expr::Kind::kCall || e.kind == Expr::Kind::kFilter ||
          e.kind == Expr::Kind::kBinary) {
        spend_on(v);
      }
      return v;
    } catch (const std::invalid_argument& ex) {
      --eval_depth_;
      fail_at(e.line, e.column, ex.what());
    } catch (...) {
      --eval_depth_;
      throw;
    }
  }

  // Charges the render's step budget for work of `steps`.
  void spend(uint64_t steps) {
    steps_ += steps;
    if (steps_ > kMaxRenderSteps) {
      throw std::invalid_argument("the template did more than " + std::to_string(kMaxRenderSteps) +
                                  " steps of work (loop iterations, items and text made)");
    }
  }
  // For a value an operation made: its items, or its bytes / 256.
  void spend_on(const Value& v) {
    if (v.is_string()) {
      spend(v.str().size() / 256);
    } else if (v.is_sequence()) {
      spend(v.items().size());
    } else if (v.type() == Type::kIterator) {
      spend(static_cast<const IteratorObject*>(v.obj())->items.size());
    } else if (v.is_dict()) {
      spend(v.entries().size());
    }
  }
  // Text written out, charged by its size.
  void write(std::string_view text) {
    charge_written(text.size());
    *out_ += text;
  }
  void write(const Value& v) {
    const size_t before = out_->size();
    v.append_str(*out_);
    charge_written(out_->size() - before);
  }
  void charge_written(size_t bytes) {
    const uint64_t before = written_;
    written_ += bytes;
    spend(written_ / 256 - before / 256);
  }

  Value eval_inner(const Expr& e, Frame* f) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return lookup(e.name, f);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List items;
        items.reserve(e.children.size());
        for (const auto& c : e.children) items.push_back(eval(*c, f));
        return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        std::vector<std::pair<Value, Value>> entries;
        for (size_t k = 0; k + 1 < e.children.size(); k += 2) {
          Value key = eval(*e.children[k], f);
          Value value = eval(*e.children[k + 1], f);
          bool replaced = false;
          for (auto& [k2, v2] : entries) {
            if (k2.equals(key)) {
              v2 = value;
              replaced = true;
            }
          }
          if (!replaced) entries.emplace_back(std::move(key), std::move(value));
        }
        return Value::dict(std::move(entries));
      }
      case Expr::Kind::kGetAttr:
        return get_attribute(eval(*e.children[0], f), e.name);
      case Expr::Kind::kGetItem:
        return get_item(eval(*e.children[0], f), eval(*e.children[1], f));
      case Expr::Kind::kSlice: {
        Value obj = eval(*e.children[0], f);
        auto part = [&](size_t k) {
          return e.children[k] ? eval(*e.children[k], f) : Value::none();
        };
        return get_slice(obj, part(1), part(2), part(3));
      }
      case Expr::Kind::kCall: {
        Value callee = eval(*e.children[0], f);
        return call_value(callee, eval_args(e, f), e);
      }
      case Expr::Kind::kFilter:
        return apply_filter(e.filter, eval(*e.children[0], f), eval_args(e, f));
      case Expr::Kind::kTest:
        return Value::boolean(apply_test(e.test, eval(*e.children[0], f), eval_args(e, f)) !=
                              e.negated);
      case Expr::Kind::kNeg:
        return negate(eval(*e.children[0], f));
      case Expr::Kind::kPos: {
        Value v = eval(*e.children[0], f);
        require_defined(v);
        if (!v.is_number()) {
          throw std::invalid_argument(std::string("bad operand type for unary +: '") +
                                      v.type_name() + "'");
        }
        return v.type() == Type::kBool ? Value::integer(v.as_int()) : v;
      }
      case Expr::Kind::kNot:
        return Value::boolean(!eval(*e.children[0], f).truthy());
      case Expr::Kind::kBinary: {
        const Expr& left = *e.children[0];
        if (e.op == Op::kPow && left.kind == Expr::Kind::kLiteral && left.literal.is_number() &&
            left.literal.as_double() < 0 && e.children[1]->kind != Expr::Kind::kLiteral) {
          // jinja2 writes a folded negative constant as "-3" into Python's `(-3 ** x)`, which
          // Python reads as -(3 ** x).
          return negate(binary(Op::kPow, negate(left.literal), eval(*e.children[1], f)));
        }
        return binary(e.op, eval(left, f), eval(*e.children[1], f));
      }
      case Expr::Kind::kAnd: {
        Value a = eval(*e.children[0], f);
        return a.truthy() ? eval(*e.children[1], f) : a;
      }
      case Expr::Kind::kOr: {
        Value a = eval(*e.children[0], f);
        return a.truthy() ? a : eval(*e.children[1], f);
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.children[0], f);
        for (size_t k = 0; k < e.cmps.size(); ++k) {
          Value right = eval(*e.children[k + 1], f);
          if (!compare(e.cmps[k], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::kCondition:
        if (eval(*e.children[0], f).truthy()) return eval(*e.children[1], f);
        if (e.children[2]) return eval(*e.children[2], f);
        return Value::undefined("the inline if-expression on line " + std::to_string(e.line) +
                                " evaluated to false and no else section was defined.");
    }
    return Value();
  }

  const ChatTemplate::Parsed& parsed_;
  Value context_;
  std::string* out_ = nullptr;
  std::string* top_ = nullptr;
  std::vector<std::pair<size_t, size_t>>* spans_ = nullptr;
  std::deque<Frame> frames_;  // every scope of this render: macros keep pointers to theirs
  int depth_ = 0;             // macro calls
  int eval_depth_ = 0;        // eval() inside eval()
  uint64_t steps_ = 0;        // spent of kMaxRenderSteps
  uint64_t written_ = 0;
};

}  // namespace

RenderedChat render_template(const ChatTemplate::Parsed& parsed, std::string_view context_json) {
  thread_local simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (auto error = parser.parse(context_json.data(), context_json.size()).get(root)) {
    throw InvalidArgument(parsed.origin +
                          ": the context is not JSON: " + simdjson::error_message(error));
  }
  if (!root.is_object())
    throw InvalidArgument(parsed.origin + ": the context is not a JSON object");
  Value context;
  try {
    context = from_json(root);
  } catch (const std::invalid_argument& e) {
    throw InvalidArgument(parsed.origin + ": " + e.what());
  }
  return Renderer(parsed, std::move(context)).run();
}

}  // namespace stoker::text::jinja
