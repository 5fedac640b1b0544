// RowEncoder: one row of a text corpus to its document, as RowFormat (text_corpus.h) says: a text
// field encoded, or a conversation rendered by its chat template and encoded, with the flags of
// the tokens trained on.
//
// Thread safety: immutable; encode_* are safe from many threads (each call its own output).
// Errors: DecodeError for text that is not UTF-8; InvalidArgument (or the template's
// TemplateError) for a conversation the template rejects or whose assistant spans cannot be found.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "stoker/text/text_corpus.h"

namespace stoker::text {

struct EncodedRow {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // one a token, with assistant_only; empty otherwise
  bool truncated = false;        // cut to max_length
};

class RowEncoder {
 public:
  // REQUIRES: format.messages implies a chat_template. Both arguments outlive the encoder.
  RowEncoder(const Tokenizer& tokenizer, const RowFormat& format);

  // A text row.
  void encode_text(std::string_view text, EncodedRow& out) const;
  // A conversation: its messages as a JSON array's text, its tools as JSON text (empty: none).
  void encode_messages(std::string_view messages, std::string_view tools, EncodedRow& out) const;

 private:
  void truncate(EncodedRow& out) const;

  const Tokenizer& tokenizer_;
  const RowFormat& format_;
};

}  // namespace stoker::text
