// The extension module stoker._text: the text wing (src/text/), apart from stoker._native because
// it links PCRE2, utf8proc and simdjson (and sentencepiece, where found), which a build without
// them need not have. It imports
// stoker._native first for the exception translator (errors.cc), shared between the modules.
#include "stoker/text/tokenizer.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "stoker/memory.h"

namespace nb = nanobind;
using namespace nb::literals;

void bind_chat_template(nb::module_& m);  // text_chat.cc

NB_MODULE(_text, m) {
  using stoker::text::Tokenizer;
  nb::module_::import_("stoker._native");  // the exception translator
  // Whether from_file reads SentencePiece .model files (the build found libsentencepiece).
  m.attr("SENTENCEPIECE") = Tokenizer::sentencepiece_supported();

  nb::class_<Tokenizer>(m, "Tokenizer",
                        "A tokenizer.json run natively, or a SentencePiece .model through the "
                        "sentencepiece library (include/stoker/text/tokenizer.h).")
      .def_static("from_json", &Tokenizer::from_json, "json"_a, "origin"_a,
                  nb::call_guard<nb::gil_scoped_release>())
      .def_static("from_file", &Tokenizer::from_file, "path"_a,
                  nb::call_guard<nb::gil_scoped_release>())
      .def("encode", &Tokenizer::encode, "text"_a, "add_special_tokens"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def(
          "encode_batch",
          [](const Tokenizer& t, const std::vector<std::string>& texts, bool add_special_tokens) {
            return t.encode_batch(texts, add_special_tokens, stoker::usable_cores());
          },
          "texts"_a, "add_special_tokens"_a, nb::call_guard<nb::gil_scoped_release>(),
          "encode() of each text, on min(texts, usable cores) threads.")
      .def("decode", &Tokenizer::decode, "ids"_a, "skip_special_tokens"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def("token_to_id", &Tokenizer::token_to_id, "token"_a)
      .def("id_to_token", &Tokenizer::id_to_token, "id"_a);
  bind_chat_template(m);
}
