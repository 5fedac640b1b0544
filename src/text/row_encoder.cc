#include "text/row_encoder.h"

#include <simdjson.h>

#include <cstdio>
#include <string>
#include <utility>

#include "stoker/errors.h"
#include "stoker/text/chat_template.h"
#include "stoker/text/tokenizer.h"

namespace stoker::text {
namespace {

using Spans = std::vector<std::pair<size_t, size_t>>;

// The variables of one rendering: the row's messages and tools, add_generation_prompt, and the
// format's own (the special tokens, the user's), as transformers' render_jinja_template passes
// them.
std::string context(std::string_view messages, std::string_view tools, bool generation_prompt,
                    std::string_view variables) {
  std::string c = "{\"messages\": ";
  c += messages;
  c += ", \"tools\": ";
  c += tools.empty() ? std::string_view("null") : tools;
  c += ", \"documents\": null, \"add_generation_prompt\": ";
  c += generation_prompt ? "true" : "false";
  const size_t open = variables.find('{'), close = variables.rfind('}');
  if (open != std::string_view::npos && close != std::string_view::npos && close > open) {
    const std::string_view inner = variables.substr(open + 1, close - open - 1);
    if (inner.find_first_not_of(" \t\n\r") != std::string_view::npos) {
      c += ", ";
      c += inner;
    }
  }
  c += "}";
  return c;
}

// The assistant spans of a template without {% generation %}: for each assistant message i, the
// text that render(messages[:i], add_generation_prompt) lacks and render(messages[:i+1]) has,
// each a prefix of the next and of the whole conversation's rendering.
Spans assistant_spans(const ChatTemplate& t, std::string_view messages, std::string_view tools,
                      std::string_view variables, const std::string& full) {
  simdjson::dom::parser parser;
  simdjson::dom::array list;
  if (parser.parse(messages.data(), messages.size()).get(list) != simdjson::SUCCESS)
    throw InvalidArgument("the messages are not a JSON list");
  std::vector<std::string> each;
  std::vector<bool> assistant;
  for (simdjson::dom::element m : list) {
    each.push_back(simdjson::minify(m));
    std::string_view role;
    assistant.push_back(m["role"].get(role) == simdjson::SUCCESS && role == "assistant");
  }
  const auto prefix = [&](size_t n) {
    std::string s = "[";
    for (size_t i = 0; i < n; ++i) {
      if (i > 0) s += ",";
      s += each[i];
    }
    return s + "]";
  };
  const auto is_prefix = [](const std::string& p, const std::string& of) {
    return of.size() >= p.size() && of.compare(0, p.size(), p) == 0;
  };
  Spans spans;
  for (size_t i = 0; i < each.size(); ++i) {
    if (!assistant[i]) continue;
    const std::string before = t.render(context(prefix(i), tools, true, variables)).text;
    const std::string through =
        i + 1 == each.size() ? full
                             : t.render(context(prefix(i + 1), tools, false, variables)).text;
    if (!is_prefix(before, through) || !is_prefix(through, full))
      throw InvalidArgument(
          "the chat template does not render this conversation message by message (the "
          "rendering up to assistant message " +
          std::to_string(i) +
          " is not a prefix of the whole), so its assistant text cannot be found: mark it with "
          "{% generation %} in the template, or train on every token (loss=\"all\")");
    if (through.size() > before.size()) spans.emplace_back(before.size(), through.size());
  }
  return spans;
}

// transformers' render_jinja_template gives a message with reasoning (under "reasoning_content",
// "thinking" or "reasoning", the first that is not null) both "thinking" and
// "reasoning_content", as the dict {"thinking": r, **message, "reasoning_content": r}: the same
// here, keys in that dict's order. Messages without reasoning are left as they are.
void json_key(std::string_view key, std::string& out) {
  out += '"';
  for (const char c : key) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  out += '"';
}

// The row's messages as the template gets them: each must be an object (a conversation whose
// messages are strings, say, is refused rather than rendered as empty turns). transformers'
// render_jinja_template gives a message with reasoning (under "reasoning_content", "thinking" or
// "reasoning", the first that is not null) both "thinking" and "reasoning_content", as the dict
// {"thinking": r, **message, "reasoning_content": r}: the same here, keys in that dict's order.
std::string prepare_messages(std::string_view messages, simdjson::dom::parser& parser) {
  simdjson::dom::array list;
  if (parser.parse(messages.data(), messages.size()).get(list) != simdjson::SUCCESS)
    throw InvalidArgument("the messages are not a JSON list");
  const bool reasoning_anywhere = messages.find("\"reasoning") != std::string_view::npos ||
                                  messages.find("\"thinking\"") != std::string_view::npos;
  std::string out = "[";
  size_t index = 0;
  for (simdjson::dom::element m : list) {
    simdjson::dom::object o;
    if (m.get(o) != simdjson::SUCCESS)
      throw InvalidArgument("message " + std::to_string(index) + " is " +
                            (m.is_string() ? "a string" : "not an object") +
                            ", not an object with a role and content");
    ++index;
    if (out.size() > 1) out += ",";
    simdjson::dom::element r, unused;
    bool found = false;
    if (reasoning_anywhere) {
      for (const char* key : {"reasoning_content", "thinking", "reasoning"})
        if (o[key].get(r) == simdjson::SUCCESS && !r.is_null()) {
          found = true;
          break;
        }
    }
    if (!found) {
      out += simdjson::minify(m);
      continue;
    }
    const std::string reasoning = simdjson::minify(r);
    std::string object = "{";
    const auto put = [&](std::string_view key, const std::string& value) {
      if (object.size() > 1) object += ",";
      json_key(key, object);
      object += ":";
      object += value;
    };
    if (o["thinking"].get(unused) != simdjson::SUCCESS) put("thinking", reasoning);
    for (auto [key, value] : o)
      put(key, key == "reasoning_content" ? reasoning : simdjson::minify(value));
    if (o["reasoning_content"].get(unused) != simdjson::SUCCESS)
      put("reasoning_content", reasoning);
    out += object + "}";
  }
  return out + "]";
}

}  // namespace

RowEncoder::RowEncoder(const Tokenizer& tokenizer, const RowFormat& format)
    : tokenizer_(tokenizer), format_(format) {}

void RowEncoder::truncate(EncodedRow& out) const {
  if (format_.max_length == 0 || out.ids.size() <= format_.max_length) return;
  out.ids.resize(format_.max_length);
  if (!out.trained.empty()) out.trained.resize(format_.max_length);
  out.truncated = true;
}

void RowEncoder::encode_text(std::string_view text, EncodedRow& out) const {
  std::vector<int32_t> ids = tokenizer_.encode(text, format_.add_special_tokens);
  out.ids.clear();
  out.ids.reserve(ids.size() + 2);
  if (format_.bos) out.ids.push_back(*format_.bos);
  out.ids.insert(out.ids.end(), ids.begin(), ids.end());
  if (format_.eos) out.ids.push_back(*format_.eos);
  truncate(out);
}

void RowEncoder::encode_messages(std::string_view row_messages, std::string_view tools,
                                 EncodedRow& out) const {
  const ChatTemplate& t = *format_.chat_template;
  thread_local simdjson::dom::parser parser;  // one a thread: encode_messages is concurrent
  const std::string messages = prepare_messages(row_messages, parser);
  RenderedChat chat = t.render(context(messages, tools, false, format_.template_variables));
  const bool special = format_.add_special_tokens &&
                       (format_.bos_text.empty() || !chat.text.starts_with(format_.bos_text));
  if (!format_.assistant_only) {
    out.ids = tokenizer_.encode(chat.text, special);
    out.trained.clear();
    return truncate(out);
  }
  Encoding e = tokenizer_.encode_with_offsets(chat.text, special);
  out.ids = std::move(e.ids);
  const Spans spans = t.marks_generation() ? std::move(chat.generation)
                                           : assistant_spans(t, messages, tools,
                                                             format_.template_variables, chat.text);
  // As transformers' apply_chat_template(..., return_assistant_tokens_mask=True): a token is the
  // assistant's when its offsets overlap a span, spans and tokens taken in order.
  out.trained.assign(out.ids.size(), 0);
  size_t s = 0;
  for (size_t i = 0; i < out.ids.size(); ++i) {
    while (s < spans.size() && e.offsets[i].begin >= spans[s].second) ++s;
    if (s == spans.size()) break;
    if (e.offsets[i].end > spans[s].first) out.trained[i] = 1;
  }
  truncate(out);
}

}  // namespace stoker::text
