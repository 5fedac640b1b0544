// ChatTemplate: a Hugging Face chat template (a tokenizer_config.json's `chat_template`, Jinja)
// rendered natively, as transformers renders it: jinja2's ImmutableSandboxedEnvironment with
// trim_blocks and lstrip_blocks, loop controls (break, continue), the {% generation %} tag of its
// AssistantTracker, its tojson filter (json.dumps, ensure_ascii=False by default) and its globals
// raise_exception, strftime_now, dict and namespace. Python's jinja2 is never called.
//
// Contract: for the templates it accepts, render() returns the text transformers'
// render_jinja_template returns for the same variables, and the generation spans of
// return_assistant_tokens_mask (as byte offsets into the UTF-8 text, not Python's code points).
// Values print as Python prints them (True, None, 1.0, ['a', 1], {'k': 'v'}); undefined names and
// attributes behave as jinja2's default Undefined (print as '', false, iterate as empty, raise on
// attribute access or arithmetic). The subset, listed in full in src/text/jinja/README.md:
//   tags:    if/elif/else, for (loop.*, an `if` filter, else, tuple targets), break, continue,
//            set (names, tuples, namespace attributes, blocks), macro (defaults, caller), call,
//            filter, with, raw, comments, generation;
//   filters: jinja2's that chat templates use (tojson, trim, join, map, selectattr, ...);
//   tests:   defined, none, string, mapping, sequence, eq, in, divisibleby, ...;
//   methods: str's (strip, split, startswith, replace, ...), dict's items/keys/values/get;
//   globals: range, dict, namespace, raise_exception, strftime_now.
// Anything else (include, extends, import, block, an unknown filter or test) is refused by
// parse(); an unknown method, or a value the subset does not compute exactly (an integer beyond 64
// bits, a generator printed as its address), by render(): an error, never text that differs.
// transformers passes its own variables too (tools and documents as None where not given, the
// messages with reasoning fields aliased): the caller puts in context_json what it wants defined.
//
// Ownership: ChatTemplate is a value; copies share the parsed template, which lives as long as
// any copy. Preconditions: `source` and the strings of `context_json` are UTF-8 (simdjson
// validates the JSON; the template's own bytes are read as they are).
//
// Limits, so that a hostile template ends (jinja2 has none of these but MAX_RANGE; each is far
// beyond what a chat template does), each an InvalidArgument naming origin, line and column:
//   parse():  tags, expressions, brackets, `not` and unary signs nested 600 parser levels deep
//   render(): expressions evaluated inside one another deeper than 1000 (operator and filter
//             chains, macro calls; macros alone: 200 levels); range() of more than 100,000 items
//             (the sandbox's MAX_RANGE); a string repeated (`s * n`) past 2**28 bytes, a list past
//             2**20 items; and a budget of 2**20 steps per render: one per loop iteration, per
//             item of a list (or dict) a call, filter or operator returns, per 256 bytes of a
//             string one returns and of text written (so at most 256 MiB of output).
//
// Thread safety: a parsed ChatTemplate is immutable; render() is safe from many threads at once
// without external synchronization (each call has its own state; each thread keeps its own JSON
// parser).
//
// Errors: parse() throws InvalidArgument naming `origin`, the line and column, and the construct
// (a syntax error, an unknown tag, filter or test). render() throws TemplateError (stoker/errors.h)
// with exactly the message of the template's raise_exception(message), and InvalidArgument naming
// origin, line and column for any other failure (context_json not a JSON object, an undefined
// value's attribute, a type error, a list method that would mutate, as the immutable sandbox
// refuses it).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stoker/errors.h"

namespace stoker::text {

struct RenderedChat {
  std::string text;
  // Byte ranges [begin, end) of `text` rendered inside {% generation %} ... {% endgeneration %},
  // in the order transformers' AssistantTracker records them (a block's end, so an inner block
  // before the block around it). As there, a range counts from the output of the template's top
  // level: a generation block inside a macro, a set block or a filter block starts at the length
  // the top-level output had when the block ran, and ends its own length in bytes further, which
  // need not be where its text lands (transformers' placement, kept so that masks agree).
  std::vector<std::pair<size_t, size_t>> generation;
};

class ChatTemplate {
 public:
  // Parses a template. `origin` names it in errors (a path, or a model name).
  static ChatTemplate parse(std::string_view source, const std::string& origin = "chat_template");

  // Renders with the variables of `context_json`, the text of a JSON object (for example
  // {"messages": [...], "add_generation_prompt": false, "bos_token": "<s>", "tools": [...]}).
  // Names the object does not hold are undefined, as with jinja2.
  RenderedChat render(std::string_view context_json) const;

  // Whether the template has a {% generation %} block.
  bool marks_generation() const;

  const std::string& origin() const;

  struct Parsed;  // src/text/jinja/ast.h

 private:
  explicit ChatTemplate(std::shared_ptr<const Parsed> parsed);
  std::shared_ptr<const Parsed> parsed_;
};

}  // namespace stoker::text
