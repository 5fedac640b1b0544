// parse_template (ast.h): jinja2's parser (jinja2/parser.py) over lexer.h's tokens, for the subset
// ast.h holds: the same grammar and precedence, number constants folded as jinja2's optimizer
// folds them, names of filters and tests resolved once here.
#include <algorithm>
#include <string>

#include "stoker/errors.h"
#include "text/jinja/ast.h"
#include "text/jinja/lexer.h"
#include "text/jinja/ops.h"

namespace stoker::text::jinja {

namespace {

class Parser {
 public:
  Parser(std::vector<Token> tokens, const SourceMap& lexer, ChatTemplate::Parsed& out)
      : t_(std::move(tokens)), lexer_(lexer), out_(out) {}

  Body parse_all() {
    Body body = subparse({});
    if (cur().type != Tok::kEof) fail("unexpected tag '" + cur().text + "'");
    return body;
  }

 private:
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  void advance() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  [[noreturn]] void fail(const std::string& what) const { lexer_.fail(cur().offset, what); }
  bool is_op(const char* op) const { return cur().type == Tok::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::kName && cur().text == n; }
  std::string describe() const {
    switch (cur().type) {
      case Tok::kEof:
        return "end of template";
      case Tok::kBlockEnd:
        return "end of statement block";
      case Tok::kVarEnd:
        return "end of print statement";
      case Tok::kData:
        return "template data";
      case Tok::kString:
        return "string literal";
      default:
        return "'" + cur().text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', got " + describe());
    advance();
  }
  void expect_name(const char* n) {
    if (!is_name(n)) fail(std::string("expected '") + n + "', got " + describe());
    advance();
  }
  std::string expect_identifier() {
    if (cur().type != Tok::kName) fail("expected a name, got " + describe());
    std::string n = cur().text;
    advance();
    return n;
  }
  void expect_block_end() {
    if (cur().type != Tok::kBlockEnd) fail("expected end of statement block, got " + describe());
    advance();
  }
  template <class T>
  void locate(T& node) const {
    auto [line, column] = lexer_.position(cur().offset);
    node.line = line;
    node.column = column;
  }
  ExprPtr make(Expr::Kind kind) const {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    locate(*e);
    return e;
  }

  // Nodes up to a block tag named in `ends` (left current: its name).
  Body subparse(std::initializer_list<const char*> ends) {
    Nesting guard(*this);
    Body body;
    for (;;) {
      switch (cur().type) {
        case Tok::kData: {
          Node n;
          n.kind = Node::Kind::kText;
          locate(n);
          n.text = cur().text;
          body.push_back(std::move(n));
          advance();
          break;
        }
        case Tok::kVarBegin: {
          advance();
          Node n;
          n.kind = Node::Kind::kPrint;
          locate(n);
          n.expr = parse_tuple(true, {}, false);
          if (cur().type != Tok::kVarEnd)
            fail("expected end of print statement, got " + describe());
          advance();
          body.push_back(std::move(n));
          break;
        }
        case Tok::kBlockBegin: {
          advance();
          if (cur().type == Tok::kName) {
            for (const char* e : ends) {
              if (cur().text == e) return body;
            }
          }
          body.push_back(parse_statement());
          break;
        }
        case Tok::kEof:
          if (ends.size()) {
            std::string want;
            for (const char* e : ends)
              want += std::string(want.empty() ? "" : " or ") + "'" + e + "'";
            fail("unexpected end of template, expected " + want);
          }
          return body;
        default:
          fail("unexpected " + describe());
      }
    }
  }

  // The body of a tag up to `end` (consumed).
  Body parse_body(const char* end) {
    Body b = subparse({end});
    advance();
    expect_block_end();
    return b;
  }

  Node parse_statement() {
    if (cur().type != Tok::kName) fail("expected a tag name, got " + describe());
    Node n;
    n.kind = Node::Kind::kText;
    locate(n);
    std::string tag = cur().text;
    advance();
    if (tag == "if") {
      n.kind = Node::Kind::kIf;
      for (;;) {
        ExprPtr cond = parse_tuple(false, {}, false);
        expect_block_end();
        Body body = subparse({"elif", "else", "endif"});
        n.branches.emplace_back(std::move(cond), std::move(body));
        std::string which = cur().text;
        advance();
        if (which == "elif") continue;
        if (which == "else") {
          expect_block_end();
          n.branches.emplace_back(nullptr, parse_body("endif"));
        } else {
          expect_block_end();
        }
        break;
      }
    } else if (tag == "for") {
      n.kind = Node::Kind::kFor;
      n.target = parse_target(false, "in");
      expect_name("in");
      n.expr = parse_tuple(false, {"recursive"}, false);
      if (is_name("if")) {
        advance();
        n.condition = parse_expression(true);
      }
      if (is_name("recursive")) fail("recursive for loops are not supported");
      expect_block_end();
      ++loops_;
      n.body = subparse({"endfor", "else"});
      --loops_;
      bool has_else = cur().text == "else";
      advance();
      expect_block_end();
      if (has_else) n.else_body = parse_body("endfor");
    } else if (tag == "set") {
      n.target = parse_target(true, nullptr);
      if (is_op("=")) {
        advance();
        n.kind = Node::Kind::kSet;
        n.expr = parse_tuple(true, {}, false);
        expect_block_end();
      } else {
        n.kind = Node::Kind::kSetBlock;
        if (n.target.unpack || !n.target.attribute.empty()) fail("a set block assigns one name");
        if (is_op("|")) n.expr = parse_filters(nullptr);
        expect_block_end();
        n.body = parse_body("endset");
      }
    } else if (tag == "macro") {
      n.kind = Node::Kind::kMacro;
      n.name = expect_identifier();
      parse_signature(n);
      expect_block_end();
      int saved = loops_;
      loops_ = 0;
      n.body = parse_macro_body(n, "endmacro");
      loops_ = saved;
    } else if (tag == "call") {
      n.kind = Node::Kind::kCallBlock;
      if (is_op("(")) parse_signature(n);
      n.expr = parse_expression(true);
      if (n.expr->kind != Expr::Kind::kCall) fail("expected a call after 'call'");
      expect_block_end();
      int saved = loops_;
      loops_ = 0;
      n.body = parse_macro_body(n, "endcall");
      loops_ = saved;
    } else if (tag == "filter") {
      n.kind = Node::Kind::kFilterBlock;
      n.expr = parse_filters(nullptr, true);
      expect_block_end();
      n.body = parse_body("endfilter");
    } else if (tag == "with") {
      n.kind = Node::Kind::kWith;
      while (cur().type != Tok::kBlockEnd) {
        if (!n.assignments.empty()) expect_op(",");
        Target t = parse_target(false, nullptr);
        expect_op("=");
        n.assignments.emplace_back(std::move(t), parse_expression(true));
      }
      advance();
      n.body = parse_body("endwith");
    } else if (tag == "generation") {
      n.kind = Node::Kind::kGeneration;
      out_.marks_generation = true;
      expect_block_end();
      int saved = loops_;
      loops_ = 0;  // jinja2 renders the body as a macro: no break or continue out of it
      n.body = parse_body("endgeneration");
      loops_ = saved;
    } else if (tag == "break" || tag == "continue") {
      if (loops_ == 0) lexer_.fail(t_[i_ - 1].offset, "'" + tag + "' outside of a for loop");
      n.kind = tag == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      expect_block_end();
    } else {
      lexer_.fail(t_[i_ - 1].offset, tag.rfind("end", 0) == 0 || tag == "elif" || tag == "else"
                                         ? "unexpected tag '" + tag + "'"
                                         : "unsupported tag '" + tag +
                                               "' (chat templates render alone: no include, "
                                               "extends, import, block or do)");
    }
    return n;
  }

  // A macro's or caller's body, noting which of caller, varargs and kwargs it names.
  Body parse_macro_body(Node& n, const char* end) {
    std::vector<std::string> names;
    std::vector<std::string>* outer = names_;
    names_ = &names;
    Body body = parse_body(end);
    names_ = outer;
    for (const std::string& name : names) {
      n.uses_caller |= name == "caller";
      n.uses_varargs |= name == "varargs";
      n.uses_kwargs |= name == "kwargs";
      if (outer) outer->push_back(name);
    }
    return body;
  }

  void parse_signature(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (!n.params.empty()) expect_op(",");
      if (is_op(")")) break;
      n.params.push_back(expect_identifier());
      if (is_op("=")) {
        advance();
        n.defaults.push_back(parse_expression(true));
      } else {
        n.defaults.push_back(nullptr);
      }
    }
    advance();
  }

  // for/set/with targets: a name, names (a, b), or with namespaces ns.attr.
  Target parse_target(bool with_namespace, const char* end_name) {
    Target t;
    if (with_namespace && cur().type == Tok::kName && peek().type == Tok::kOp &&
        peek().text == ".") {
      t.names.push_back(cur().text);
      advance();
      advance();
      t.attribute = expect_identifier();
      return t;
    }
    bool parens = is_op("(");
    if (parens) advance();
    for (;;) {
      if (cur().type != Tok::kName) fail("expected a name to assign to, got " + describe());
      t.names.push_back(cur().text);
      advance();
      if (!is_op(",")) break;
      t.unpack = true;
      advance();
      if ((end_name && is_name(end_name)) || is_op("=") || is_op(")")) break;
    }
    if (parens) {
      expect_op(")");
      t.unpack = true;
    }
    return t;
  }

  bool tuple_end(std::initializer_list<const char*> extra) const {
    if (cur().type == Tok::kVarEnd || cur().type == Tok::kBlockEnd || is_op(")")) return true;
    for (const char* e : extra) {
      if (is_name(e)) return true;
    }
    return false;
  }

  ExprPtr parse_tuple(bool condexpr, std::initializer_list<const char*> extra, bool parens) {
    ExprPtr tuple = make(Expr::Kind::kTuple);
    bool is_tuple = false;
    for (;;) {
      if (!tuple->children.empty()) expect_op(",");
      if (tuple_end(extra)) break;
      tuple->children.push_back(parse_expression(condexpr));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!tuple->children.empty()) return std::move(tuple->children[0]);
      if (!parens) fail("expected an expression, got " + describe());
    }
    return tuple;
  }

  // Guards the recursion of nested expressions (jinja2 has Python's recursion limit).
  struct Nesting {
    explicit Nesting(Parser& p) : parser(p) {
      if (++parser.nesting_ > kMaxNesting)
        parser.fail("nested deeper than " + std::to_string(kMaxNesting) + " parser levels");
    }
    ~Nesting() { --parser.nesting_; }
    Parser& parser;
  };
  static constexpr int kMaxNesting = 600;

  ExprPtr parse_expression(bool condexpr) {
    Nesting guard(*this);
    if (!condexpr) return parse_or();
    ExprPtr e = parse_or();
    while (is_name("if")) {
      ExprPtr c = make(Expr::Kind::kCondition);
      advance();
      c->children.push_back(parse_or());
      c->children.push_back(std::move(e));
      if (is_name("else")) {
        advance();
        c->children.push_back(parse_expression(true));
      } else {
        c->children.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, ExprPtr left, ExprPtr right) {
    ExprPtr e = make(kind);
    e->children.push_back(std::move(left));
    e->children.push_back(std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      advance();
      e = binary(Expr::Kind::kOr, std::move(e), parse_and());
    }
    return e;
  }
  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      advance();
      e = binary(Expr::Kind::kAnd, std::move(e), parse_not());
    }
    return e;
  }
  ExprPtr parse_not() {
    Nesting guard(*this);
    if (is_name("not")) {
      ExprPtr e = make(Expr::Kind::kNot);
      advance();
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr first = parse_math1();
    ExprPtr e = make(Expr::Kind::kCompare);
    e->children.push_back(std::move(first));
    for (;;) {
      Cmp c;
      if (is_op("==")) {
        c = Cmp::kEq;
      } else if (is_op("!=")) {
        c = Cmp::kNe;
      } else if (is_op("<")) {
        c = Cmp::kLt;
      } else if (is_op("<=")) {
        c = Cmp::kLe;
      } else if (is_op(">")) {
        c = Cmp::kGt;
      } else if (is_op(">=")) {
        c = Cmp::kGe;
      } else if (is_name("in")) {
        c = Cmp::kIn;
      } else if (is_name("not") && peek().type == Tok::kName && peek().text == "in") {
        advance();
        c = Cmp::kNotIn;
      } else {
        break;
      }
      advance();
      e->cmps.push_back(c);
      e->children.push_back(parse_math1());
    }
    if (e->cmps.empty()) return std::move(e->children[0]);
    return e;
  }
  static bool number_literal(const Expr& e) {
    return e.kind == Expr::Kind::kLiteral && e.literal.is_number();
  }

  // jinja2's optimizer folds arithmetic on number constants at compile time; render.cc depends on
  // it (a folded negative constant before ** is jinja2's -(a ** b)).
  ExprPtr arith(Op op, ExprPtr left, ExprPtr right) {
    ExprPtr e = binary(Expr::Kind::kBinary, std::move(left), std::move(right));
    e->op = op;
    if (op != Op::kConcat && number_literal(*e->children[0]) && number_literal(*e->children[1])) {
      try {
        Value v = jinja::binary(op, e->children[0]->literal, e->children[1]->literal);
        e->children.clear();
        e->kind = Expr::Kind::kLiteral;
        e->literal = std::move(v);
      } catch (const std::invalid_argument&) {  // left for render() to report
      }
    }
    return e;
  }
  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      Op op = is_op("+") ? Op::kAdd : Op::kSub;
      advance();
      e = arith(op, std::move(e), parse_concat());
    }
    return e;
  }
  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      advance();
      e = arith(Op::kConcat, std::move(e), parse_math2());
    }
    return e;
  }
  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    for (;;) {
      Op op;
      if (is_op("*")) {
        op = Op::kMul;
      } else if (is_op("/")) {
        op = Op::kDiv;
      } else if (is_op("//")) {
        op = Op::kFloorDiv;
      } else if (is_op("%")) {
        op = Op::kMod;
      } else {
        break;
      }
      advance();
      e = arith(op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      advance();
      e = arith(Op::kPow, std::move(e), parse_unary(true));
    }
    return e;
  }
  ExprPtr parse_unary(bool with_filter) {
    Nesting guard(*this);
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      e = make(is_op("-") ? Expr::Kind::kNeg : Expr::Kind::kPos);
      advance();
      e->children.push_back(parse_unary(false));
      if (number_literal(*e->children[0])) {  // folded, as jinja2's optimizer does
        Value v = e->children[0]->literal;
        e->literal = e->kind == Expr::Kind::kNeg ? negate(v)
                     : v.type() == Type::kBool   ? Value::integer(v.as_int())
                                                 : v;
        e->children.clear();
        e->kind = Expr::Kind::kLiteral;
      }
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr literal(Value v) {
    ExprPtr e = make(Expr::Kind::kLiteral);
    e->literal = std::move(v);
    advance();
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case Tok::kName: {
        const std::string& n = t.text;
        if (n == "true" || n == "True") return literal(Value::boolean(true));
        if (n == "false" || n == "False") return literal(Value::boolean(false));
        if (n == "none" || n == "None") return literal(Value::none());
        ExprPtr e = make(Expr::Kind::kName);
        e->name = n;
        if (names_) names_->push_back(n);
        advance();
        return e;
      }
      case Tok::kString: {
        ExprPtr e = make(Expr::Kind::kLiteral);
        std::string s;
        while (cur().type == Tok::kString) {
          s += cur().text;
          advance();
        }
        e->literal = Value::string(std::move(s));
        return e;
      }
      case Tok::kInt:
        return literal(Value::integer(t.integer));
      case Tok::kFloat:
        return literal(Value::real(t.real));
      case Tok::kOp:
        if (t.text == "(") {
          advance();
          ExprPtr e = parse_tuple(true, {}, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          ExprPtr e = make(Expr::Kind::kList);
          advance();
          while (!is_op("]")) {
            if (!e->children.empty()) expect_op(",");
            if (is_op("]")) break;
            e->children.push_back(parse_expression(true));
          }
          advance();
          return e;
        }
        if (t.text == "{") {
          ExprPtr e = make(Expr::Kind::kDict);
          advance();
          while (!is_op("}")) {
            if (!e->children.empty()) expect_op(",");
            if (is_op("}")) break;
            e->children.push_back(parse_expression(true));
            expect_op(":");
            e->children.push_back(parse_expression(true));
          }
          advance();
          return e;
        }
        [[fallthrough]];
      default:
        fail("unexpected " + describe());
    }
  }

  ExprPtr parse_postfix(ExprPtr e) {
    for (;;) {
      if (is_op(".")) {
        advance();
        if (cur().type == Tok::kName) {
          ExprPtr g = make(Expr::Kind::kGetAttr);
          g->name = cur().text;
          advance();
          g->children.push_back(std::move(e));
          e = std::move(g);
        } else if (cur().type == Tok::kInt) {
          ExprPtr g = make(Expr::Kind::kGetItem);
          g->children.push_back(std::move(e));
          g->children.push_back(literal(Value::integer(cur().integer)));
          e = std::move(g);
        } else {
          fail("expected an attribute name after '.', got " + describe());
        }
      } else if (is_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr e) {
    ExprPtr g = make(Expr::Kind::kGetItem);
    advance();
    g->children.push_back(std::move(e));
    std::vector<ExprPtr> parts;  // a slice: start, stop, step
    bool slice = false;
    ExprPtr index;
    if (!is_op(":")) index = parse_expression(true);
    if (is_op(":")) {
      slice = true;
      advance();
      parts.push_back(std::move(index));
      parts.push_back(is_op("]") || is_op(":") ? nullptr : parse_expression(true));
      if (is_op(":")) {
        advance();
        parts.push_back(is_op("]") ? nullptr : parse_expression(true));
      } else {
        parts.push_back(nullptr);
      }
    } else if (is_op(",")) {
      fail("tuple subscripts are not supported");
    }
    expect_op("]");
    if (slice) {
      g->kind = Expr::Kind::kSlice;
      for (auto& p : parts) g->children.push_back(std::move(p));
    } else {
      g->children.push_back(std::move(index));
    }
    return g;
  }

  void parse_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (!e.args.empty()) expect_op(",");
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail("*args and **kwargs in calls are not supported");
      Arg a;
      if (cur().type == Tok::kName && peek().type == Tok::kOp && peek().text == "=") {
        a.name = cur().text;
        advance();
        advance();
      } else if (!e.args.empty() && !e.args.back().name.empty()) {
        fail("a positional argument after a keyword argument");
      }
      a.value = parse_expression(true);
      e.args.push_back(std::move(a));
    }
    advance();
  }

  ExprPtr parse_call(ExprPtr callee) {
    ExprPtr c = make(Expr::Kind::kCall);
    c->children.push_back(std::move(callee));
    parse_args(*c);
    return c;
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    for (;;) {
      if (is_op("|")) {
        e = parse_filters(std::move(e));
      } else if (is_name("is")) {
        e = parse_test(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  // `| name(args) | name ...` on `e` (null: a filter block's or set block's body).
  ExprPtr parse_filters(ExprPtr e, bool start_inline = false) {
    while (is_op("|") || start_inline) {
      if (!start_inline) advance();
      start_inline = false;
      ExprPtr f = make(Expr::Kind::kFilter);
      f->name = expect_identifier();
      if (is_op(".")) fail("dotted filter names are not supported");
      if (!find_filter(f->name, &f->filter)) {
        lexer_.fail(t_[i_ - 1].offset, "unsupported filter '" + f->name + "'");
      }
      if (is_op("(")) parse_args(*f);
      f->children.push_back(std::move(e));
      e = std::move(f);
    }
    return e;
  }

  ExprPtr parse_test(ExprPtr e) {
    ExprPtr t = make(Expr::Kind::kTest);
    advance();
    if (is_name("not")) {
      t->negated = true;
      advance();
    }
    if (cur().type == Tok::kName &&
        (cur().text == "none" || cur().text == "true" || cur().text == "false")) {
      t->name = cur().text;  // keywords as test names
    } else if (cur().type == Tok::kOp &&
               (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                cur().text == "<=" || cur().text == ">" || cur().text == ">=")) {
      t->name = cur().text;
    } else {
      if (cur().type != Tok::kName) fail("expected a test name, got " + describe());
      t->name = cur().text;
    }
    if (!find_test(t->name, &t->test)) fail("unsupported test '" + t->name + "'");
    advance();
    t->children.push_back(std::move(e));
    if (is_op("(")) {
      parse_args(*t);
    } else if ((cur().type == Tok::kName || cur().type == Tok::kString || cur().type == Tok::kInt ||
                cur().type == Tok::kFloat || is_op("(") || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail("you cannot chain multiple tests with is");
      Arg a;
      a.value = parse_postfix(parse_primary());
      t->args.push_back(std::move(a));
    }
    return t;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  const SourceMap& lexer_;
  ChatTemplate::Parsed& out_;
  int loops_ = 0;
  int nesting_ = 0;
  std::vector<std::string>* names_ = nullptr;  // where names are noted, in a macro's body
};

}  // namespace

void parse_template(std::string_view source, ChatTemplate::Parsed& out) {
  // jinja2 reads \r\n and \r as \n, and drops one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  SourceMap map(src, out.origin);
  Parser parser(lex(src, map), map, out);
  out.body = parser.parse_all();
}

}  // namespace stoker::text::jinja
