// The extension module stoker._text: the text wing (src/text/), apart from stoker._native because
// it links PCRE2, utf8proc and simdjson (and sentencepiece, where found), which a build without
// them need not have. It imports
// stoker._native first for the exception translator (errors.cc), shared between the modules.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include "stoker/memory.h"
#include "stoker/text/tokenizer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace stoker::text {
void bind_text_corpus(nb::module_& m);  // text_corpus.cc
}
void bind_chat_template(nb::module_& m);  // text_chat.cc
namespace stoker::image_text {
void bind_image_text(nb::module_& m);  // image_text.cc: the submodule image_text
}

namespace {
// Python indexes a str by characters: the offsets made character offsets, as tuples.
std::pair<std::vector<int32_t>, std::vector<std::pair<uint32_t, uint32_t>>> with_char_offsets(
    std::string_view text, stoker::text::Encoding e) {
  stoker::text::Tokenizer::to_char_offsets(text, e.offsets);
  std::vector<std::pair<uint32_t, uint32_t>> offsets;
  offsets.reserve(e.offsets.size());
  for (const auto& o : e.offsets) offsets.emplace_back(o.begin, o.end);
  return {std::move(e.ids), std::move(offsets)};
}
}  // namespace

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
      .def_static(
          "from_file",
          [](const std::string& path, std::optional<std::string> pattern,
             std::optional<std::map<std::string, int32_t>> special_tokens) {
            return Tokenizer::from_file(
                path, stoker::text::TiktokenOptions{std::move(pattern), std::move(special_tokens)});
          },
          "path"_a, "pattern"_a = nb::none(), "special_tokens"_a = nb::none(),
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
      .def(
          "encode_with_offsets",
          [](const Tokenizer& t, std::string_view text, bool add_special_tokens) {
            return with_char_offsets(text, t.encode_with_offsets(text, add_special_tokens));
          },
          "text"_a, "add_special_tokens"_a, nb::call_guard<nb::gil_scoped_release>(),
          "(ids, offsets): offsets in characters of the str, as tokenizers' Encoding.offsets.")
      .def(
          "encode_batch_with_offsets",
          [](const Tokenizer& t, const std::vector<std::string>& texts, bool add_special_tokens) {
            auto encodings =
                t.encode_batch_with_offsets(texts, add_special_tokens, stoker::usable_cores());
            std::vector<std::pair<std::vector<int32_t>, std::vector<std::pair<uint32_t, uint32_t>>>>
                out;
            out.reserve(texts.size());
            for (size_t i = 0; i < texts.size(); ++i) {
              out.push_back(with_char_offsets(texts[i], std::move(encodings[i])));
            }
            return out;
          },
          "texts"_a, "add_special_tokens"_a, nb::call_guard<nb::gil_scoped_release>(),
          "encode_with_offsets() of each text, on min(texts, usable cores) threads.")
      .def("decode", &Tokenizer::decode, "ids"_a, "skip_special_tokens"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("vocab_size", &Tokenizer::vocab_size)
      .def("token_to_id", &Tokenizer::token_to_id, "token"_a)
      .def("id_to_token", &Tokenizer::id_to_token, "id"_a);
  bind_chat_template(m);
  stoker::text::bind_text_corpus(m);
  stoker::image_text::bind_image_text(m);
}
