#include "stoker/sources/document_source.h"

#include <algorithm>
#include <cstring>

#include "stoker/errors.h"

namespace stoker {

DocumentSource::DocumentSource(std::shared_ptr<const DocumentSet> documents, int64_t pad_id,
                               int64_t label_ignore, uint64_t max_length)
    : documents_(std::move(documents)), label_ignore_(label_ignore), max_length_(max_length) {
  if (!documents_) throw InvalidArgument("DocumentSource needs documents");
  uint64_t longest = 0;
  for (uint64_t d = 0; d < documents_->num_documents(); ++d) longest = std::max(longest, length(d));
  FieldSpec ids{"input_ids", kInt64, {static_cast<int64_t>(longest)}};
  ids.ragged = true;
  ids.pad_value = static_cast<double>(pad_id);
  FieldSpec labels{"labels", kInt64, {static_cast<int64_t>(longest)}};
  labels.ragged = true;
  labels.pad_value = static_cast<double>(label_ignore);
  fields_ = {ids, labels};
}

uint64_t DocumentSource::length(uint64_t index) const {
  const uint64_t n = documents_->document_length(index);
  return max_length_ > 0 ? std::min(n, max_length_) : n;
}

void DocumentSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                          WorkerState*) const {
  const uint64_t full = documents_->document_length(key.index), n = length(key.index);
  if (n == 0) return;
  auto* ids = reinterpret_cast<int64_t*>(slots[0]);
  auto* labels = reinterpret_cast<int64_t*>(slots[1]);
  documents_->read(key.index, 0, n, ids);
  std::memcpy(labels, ids + 1, (n - 1) * sizeof(int64_t));
  if (n < full) {
    documents_->read(key.index, n, 1, labels + n - 1);  // the token after the cut
  } else {
    labels[n - 1] = label_ignore_;
  }
  ignore_untrained_labels(*documents_, key.index, 1, n < full ? n : n - 1, labels, label_ignore_);
}

}  // namespace stoker
