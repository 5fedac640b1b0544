// DocumentSource: the documents of a DocumentSet (documents.h) as variable-length samples, for
// batches padded to their longest document or formed by a budget (budget.h): supervised
// fine-tuning without packing, a budget of tokens a batch.
//
// Sample d is document d, truncated to its first max_length tokens when max_length > 0. Fields,
// both ragged (source.h), their length the sample's token count:
//   "input_ids" int64  the tokens; a batch pads them with pad_id.
//   "labels"    int64  the next token of the same document: label_ignore after the document's
//                      last token (a truncated document's last kept token is labelled with the
//                      token that follows it), label_ignore on padding, and label_ignore
//                      where the next token is not trained on (DocumentSet::read_trained).
// Empty documents are samples of length 0.
//
// Thread safety: immutable after construction; read() and length() are safe from any thread.
// Errors: read() throws what the DocumentSet throws (a file truncated under its mapping, a token
// out of the vocabulary), which the loader reports naming the document's file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/source.h"
#include "stoker/sources/documents.h"

namespace stoker {

class DocumentSource final : public Source {
 public:
  // REQUIRES: documents not null (InvalidArgument). Cost: O(documents), for the longest.
  DocumentSource(std::shared_ptr<const DocumentSet> documents, int64_t pad_id = 0,
                 int64_t label_ignore = -100, uint64_t max_length = 0);

  uint64_t size() const override { return documents_->num_documents(); }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  uint64_t length(uint64_t index) const override;
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  std::string path(uint64_t index) const override { return documents_->path(index); }

 private:
  std::shared_ptr<const DocumentSet> documents_;
  int64_t label_ignore_;
  uint64_t max_length_;
  std::vector<FieldSpec> fields_;
};

}  // namespace stoker
