// stoker._text.ChatTemplate: a chat template rendered natively
// (include/stoker/text/chat_template.h). Errors reach Python through stoker._native's translator
// (errors.cc): TemplateError (the template's raise_exception) as stoker.errors.TemplateError, a
// ValueError; InvalidArgument as ValueError.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "stoker/text/chat_template.h"

namespace nb = nanobind;
using namespace nb::literals;

void bind_chat_template(nb::module_& m) {
  using stoker::text::ChatTemplate;
  nb::class_<ChatTemplate>(
      m, "ChatTemplate",
      "A Hugging Face chat template (Jinja) parsed once and rendered natively, "
      "as transformers renders it (include/stoker/text/chat_template.h).")
      .def(nb::new_([](std::string_view source, const std::string& origin) {
             return ChatTemplate::parse(source, origin);
           }),
           "source"_a, "origin"_a = "chat_template", nb::call_guard<nb::gil_scoped_release>())
      .def(
          "render",
          [](const ChatTemplate& t, std::string_view context_json) {
            stoker::text::RenderedChat r = t.render(context_json);
            return std::make_pair(std::move(r.text), std::move(r.generation));
          },
          "context_json"_a, nb::call_guard<nb::gil_scoped_release>(),
          "(text, generation): the rendered text and the byte ranges [begin, end) rendered "
          "inside {% generation %} blocks.")
      .def_prop_ro("marks_generation", &ChatTemplate::marks_generation)
      .def_prop_ro("origin", &ChatTemplate::origin);
}
