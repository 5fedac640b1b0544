// stoker._text's TextCorpus and TextCorpusBuilder (include/stoker/text/text_corpus.h): text corpora
// tokenized into a store, the DocumentSet of a TextDataset.
#include "stoker/text/text_corpus.h"

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "stoker/errors.h"
#include "stoker/memory.h"
#include "stoker/text/chat_template.h"
#include "stoker/text/tokenizer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace stoker::text {
namespace {

nb::dict stats_dict(const TextCorpusStats& s) {
  nb::dict d;
  d["rows"] = s.rows;
  d["documents"] = s.documents;
  d["tokens"] = s.tokens;
  d["trained_tokens"] = s.trained_tokens;
  d["truncated"] = s.truncated;
  d["skipped"] = s.skipped;
  d["skipped_reasons"] = s.skipped_reasons;
  return d;
}

// The ArrowArray and ArrowSchema of an object with __arrow_c_array__ (a pyarrow RecordBatch: a
// struct array of its columns), moved out of their capsules.
void* capsule_pointer(const nb::handle& capsule, const char* name) {
  void* p = PyCapsule_GetPointer(capsule.ptr(), name);
  if (p == nullptr) {
    PyErr_Clear();
    throw InvalidArgument(std::string("__arrow_c_array__ did not return an ") + name + " capsule");
  }
  return p;
}

}  // namespace

void bind_text_corpus(nb::module_& m) {
  nb::class_<TextCorpus, DocumentSet>(
      m, "TextCorpus", "Rows of text tokenized into a store (include/stoker/text/text_corpus.h).")
      .def_static("open", &TextCorpus::open, "store_dir"_a,
                  nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("stats", [](const TextCorpus& c) { return stats_dict(c.stats()); })
      .def_prop_ro("has_untrained_tokens", &TextCorpus::has_untrained_tokens)
      .def("path", &TextCorpus::path, "d"_a)
      .def(
          "document_rows",
          [](const TextCorpus& c) {
            auto* origins = new std::vector<uint32_t>(c.num_documents());
            auto* rows = new std::vector<uint64_t>(c.num_documents());
            for (uint64_t d = 0; d < c.num_documents(); ++d) {
              const auto [o, r] = c.row_of(d);
              (*origins)[d] = static_cast<uint32_t>(o);
              (*rows)[d] = r;
            }
            nb::capsule own_o(
                origins, [](void* p) noexcept { delete static_cast<std::vector<uint32_t>*>(p); });
            nb::capsule own_r(
                rows, [](void* p) noexcept { delete static_cast<std::vector<uint64_t>*>(p); });
            return nb::make_tuple(
                nb::ndarray<nb::numpy, uint32_t, nb::ndim<1>>(origins->data(), {origins->size()},
                                                              own_o),
                nb::ndarray<nb::numpy, uint64_t, nb::ndim<1>>(rows->data(), {rows->size()}, own_r));
          },
          "(origin, row) of every document, as two arrays: the input each came from (its position "
          "among those added) and its row there (a JSONL file's line).")
      .def(
          "trained",
          [](const TextCorpus& c, uint64_t d) {
            if (d >= c.num_documents())
              throw nb::index_error(
                  ("document " + std::to_string(d) + " of " + std::to_string(c.num_documents()))
                      .c_str());
            auto* v = new std::vector<uint8_t>(c.trained(d));
            nb::capsule owner(
                v, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
            return nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(v->data(), {v->size()}, owner);
          },
          "d"_a, "Document d's tokens' trained flags (uint8: 1 trained on, 0 not).");

  nb::class_<TextCorpusBuilder>(m, "TextCorpusBuilder")
      .def(
          "__init__",
          [](TextCorpusBuilder* self, const Tokenizer& tokenizer, std::string field, bool messages,
             std::optional<std::string> chat_template, std::string template_variables,
             bool assistant_only, bool add_special_tokens, std::optional<int32_t> bos,
             std::optional<int32_t> eos, uint64_t max_length, std::string store_dir,
             bool skip_bad_rows, int threads, std::string bos_text) {
            RowFormat f;
            f.field = std::move(field);
            f.messages = messages;
            if (chat_template)
              f.chat_template = std::make_shared<const ChatTemplate>(
                  ChatTemplate::parse(*chat_template, "the chat template"));
            f.template_variables = std::move(template_variables);
            f.assistant_only = assistant_only;
            f.add_special_tokens = add_special_tokens;
            f.bos = bos;
            f.eos = eos;
            f.max_length = max_length;
            f.bos_text = std::move(bos_text);
            new (self) TextCorpusBuilder(tokenizer, std::move(f), std::move(store_dir),
                                         skip_bad_rows, threads > 0 ? threads : usable_cores());
          },
          "tokenizer"_a, "field"_a, "messages"_a, "chat_template"_a.none(), "template_variables"_a,
          "assistant_only"_a, "add_special_tokens"_a, "bos"_a.none(), "eos"_a.none(),
          "max_length"_a, "store_dir"_a, "skip_bad_rows"_a, "threads"_a = 0, "bos_text"_a = "",
          nb::keep_alive<1, 2>())
      .def("add_jsonl", &TextCorpusBuilder::add_jsonl, "path"_a, "origin"_a,
           nb::call_guard<nb::gil_scoped_release>())
      .def(
          "add_arrow",
          [](TextCorpusBuilder& b, nb::object batch, const std::string& origin,
             uint64_t first_row) {
            nb::tuple capsules = nb::cast<nb::tuple>(batch.attr("__arrow_c_array__")());
            auto* schema = static_cast<ArrowSchema*>(capsule_pointer(capsules[0], "arrow_schema"));
            auto* array = static_cast<ArrowArray*>(capsule_pointer(capsules[1], "arrow_array"));
            nb::gil_scoped_release release;
            b.add_arrow(array, schema, origin, first_row);
          },
          "batch"_a, "origin"_a, "first_row"_a,
          "The rows of a record batch (anything with __arrow_c_array__ of a struct array).")
      .def("finish", &TextCorpusBuilder::finish, nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace stoker::text
