// ChatTemplate (include/stoker/text/chat_template.h): the parsed template, shared and immutable;
// the lexer and parser are in jinja/parse.cc, the renderer in jinja/render.cc.
#include "stoker/text/chat_template.h"

#include "text/jinja/ast.h"

namespace stoker::text {

ChatTemplate::ChatTemplate(std::shared_ptr<const Parsed> parsed) : parsed_(std::move(parsed)) {}

ChatTemplate ChatTemplate::parse(std::string_view source, const std::string& origin) {
  auto parsed = std::make_shared<Parsed>();
  parsed->origin = origin;
  jinja::parse_template(source, *parsed);
  return ChatTemplate(std::move(parsed));
}

RenderedChat ChatTemplate::render(std::string_view context_json) const {
  return jinja::render_template(*parsed_, context_json);
}

bool ChatTemplate::marks_generation() const { return parsed_->marks_generation; }

const std::string& ChatTemplate::origin() const { return parsed_->origin; }

}  // namespace stoker::text
