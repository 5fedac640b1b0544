// The parsed form of a chat template: expressions and statements as jinja2's parser builds them,
// with filters, tests and operators resolved to enums at parse time (so render() never looks a
// name up twice). Immutable after parse(); render.cc walks it. Private to src/text/.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stoker/text/chat_template.h"
#include "text/jinja/value.h"

namespace stoker::text::jinja {

enum class Filter {
  kAbs,
  kBatch,
  kCapitalize,
  kDefault,
  kDictsort,
  kEscape,
  kFirst,
  kFloat,
  kIndent,
  kInt,
  kItems,
  kJoin,
  kLast,
  kLength,
  kList,
  kLower,
  kMap,
  kMax,
  kMin,
  kReject,
  kRejectattr,
  kReplace,
  kReverse,
  kRound,
  kSafe,
  kSelect,
  kSelectattr,
  kSort,
  kString,
  kSum,
  kTitle,
  kTojson,
  kTrim,
  kUnique,
  kUpper,
  kWordcount,
};
enum class Test {
  kBoolean,
  kCallable,
  kDefined,
  kDivisibleby,
  kEq,
  kEven,
  kFalse,
  kFloat,
  kGe,
  kGt,
  kIn,
  kInteger,
  kIterable,
  kLe,
  kLower,
  kLt,
  kMapping,
  kNe,
  kNone,
  kNumber,
  kOdd,
  kSameas,
  kSequence,
  kString,
  kTrue,
  kUndefined,
  kUpper,
};
// By name (jinja2's, with its aliases: d, e, count, equalto, ==, ...); false when unknown.
bool find_filter(std::string_view name, Filter* out);
bool find_test(std::string_view name, Test* out);

enum class Op { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat };
enum class Cmp { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Arg {
  std::string name;  // empty: positional
  ExprPtr value;
};

struct Expr {
  enum class Kind {
    kLiteral,    // literal
    kName,       // name
    kList,       // children
    kTuple,      // children
    kDict,       // children: key, value, key, value, ...
    kGetAttr,    // children[0].name
    kGetItem,    // children[0][children[1]]
    kSlice,      // children[0][children[1]:children[2]:children[3]] (each may be null)
    kCall,       // children[0](args)
    kFilter,     // children[0] | filter(args); children[0] null in a filter block
    kTest,       // children[0] is [not] test(args)
    kNeg,        // -children[0]
    kPos,        // +children[0]
    kNot,        // not children[0]
    kBinary,     // children[0] op children[1]
    kAnd,        // children[0] and children[1]
    kOr,         // children[0] or children[1]
    kCompare,    // children[0] cmps[0] children[1] cmps[1] children[2] ...
    kCondition,  // children[1] if children[0] else children[2] (null: undefined)
  };
  Kind kind = Kind::kLiteral;
  int line = 0, column = 0;
  Value literal;
  std::string name;
  Op op = Op::kAdd;
  Filter filter = Filter::kAbs;
  Test test = Test::kDefined;
  bool negated = false;  // is not
  std::vector<Cmp> cmps;
  std::vector<ExprPtr> children;
  std::vector<Arg> args;
};

// Where a for, set or with puts a value: a name, names to unpack a sequence into, or a
// namespace's attribute (`set ns.attr = ...`).
struct Target {
  std::vector<std::string> names;
  std::string attribute;  // non-empty: names[0].attribute
  bool unpack = false;    // a tuple target, even of one name
};

struct Node;
using Body = std::vector<Node>;

struct Node {
  enum class Kind {
    kText,         // text
    kPrint,        // {{ expr }}
    kIf,           // branches: (condition, body), the else branch's condition null
    kFor,          // for target in expr [if condition]: body [else else_body]
    kSet,          // set target = expr
    kSetBlock,     // set target [| filters, as expr with a null innermost operand]: body
    kMacro,        // macro name(params = defaults): body
    kCallBlock,    // call[(params)] expr: body, as `caller`
    kFilterBlock,  // filter expr (null innermost operand): body
    kWith,         // with assignments: body
    kGeneration,   // generation: body
    kBreak,
    kContinue,
  };
  Kind kind = Kind::kText;
  int line = 0, column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  Target target;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null where none
  std::vector<std::pair<Target, ExprPtr>> assignments;
  // A macro's (and a caller's) body names caller, varargs or kwargs: jinja2 then accepts a
  // caller, extra positional arguments, extra keyword arguments.
  bool uses_caller = false, uses_varargs = false, uses_kwargs = false;
};

}  // namespace stoker::text::jinja

namespace stoker::text {

struct ChatTemplate::Parsed {
  std::string origin;
  jinja::Body body;
  bool marks_generation = false;
};

}  // namespace stoker::text

namespace stoker::text::jinja {

// Lexes and parses `source` as jinja2 does with trim_blocks and lstrip_blocks (parse.cc); throws
// InvalidArgument naming origin:line:column.
void parse_template(std::string_view source, ChatTemplate::Parsed& out);
// Renders a parsed template with the variables of a JSON object's text (render.cc).
RenderedChat render_template(const ChatTemplate::Parsed& parsed, std::string_view context_json);

}  // namespace stoker::text::jinja
