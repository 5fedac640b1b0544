// TextCorpus: rows of raw text or conversations (JSONL files, Arrow record batches), tokenized
// once by the text wing's threads into a store of token ids: the DocumentSet (documents.h) that
// the packers (packing.h) and DocumentSource (document_source.h) read, one document per row, in
// the order the rows were added.
//
// A row becomes a document as its RowFormat says:
// - text: the row's `field` (a string), encoded by the tokenizer (with its post-processor's
//   special tokens when add_special_tokens), then `bos` before and `eos` after, where given.
// - messages: the row's `field` (a list of messages) rendered by the chat template with the
//   template's variables, and the row's "tools" (when it has any) as `tools`; the text is encoded
//   without special tokens (the template writes them), as transformers' apply_chat_template does
//   (with add_special_tokens, as a processor's does: see RowFormat).
//   With assistant_only, the tokens trained on (DocumentSet::read_trained) are the assistant's:
//   - a template that marks them ({% generation %}): the tokens transformers'
//     apply_chat_template(..., return_assistant_tokens_mask=True) marks: for each generation
//     block, from the token holding its first character to the token holding its last
//     (Tokenizer::encode_with_offsets, whose offsets are tokenizers');
//   - one that does not: each assistant message's span is the text that the conversation up to
//     it (with add_generation_prompt) lacks and the conversation through it has, both rendered
//     with the same template: render(messages[:i], add_generation_prompt=True) is a prefix of
//     render(messages[:i+1]), whose rest is message i's span (and so on to the last); a
//     template for which the renderings are not prefixes of each other is refused at that row.
//   Without assistant_only, every token is trained on.
// Then the first max_length tokens are kept (0: all).
//
// Bad rows: a line that is not JSON (or not an object), a missing field, a value of the wrong
// type, text that is not UTF-8, a conversation the template rejects (raise_exception). With
// skip_bad_rows, such a row is left out and counted (stats().skipped, the first reasons kept);
// otherwise finish() (or the add_* call that met it) throws SampleError: index the row's position
// among all rows added, path "<file>:<line>" (JSONL, lines from 1) or "<origin>: row <r>" (Arrow,
// rows from 0), the cause the typed error (DecodeError, InvalidArgument). The first bad row in
// row order is the one reported, whatever the threads. Empty lines of a JSONL file are not rows.
//
// The store: the token ids (uint32), the trained flags (one byte a token, only with
// assistant_only), the documents' starts and each document's row, and index.json (counts,
// origins, skipped rows). Written into `store_dir` (created; it must not hold a store already),
// or, with an empty store_dir, into unnamed temporary files that vanish with the corpus. A store
// that finish() completed opens again with TextCorpus::open (a cache of a tokenized corpus).
//
// Thread safety: a TextCorpusBuilder is used from one thread at a time (its own threads encode);
// a TextCorpus is immutable, every member safe from any number of threads.
// Ownership: the builder reads the tokenizer and template it was given, which must outlive it;
// the corpus keeps its store mapped for its lifetime and owns nothing else.
// Errors: IoError naming the file for a file that cannot be read or a store that cannot be
// written; DecodeError naming the file for a corrupt .gz/.zst; InvalidArgument for a RowFormat
// that cannot work (messages without a template) and for an Arrow batch without the field.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stoker/sources/documents.h"

struct ArrowArray;
struct ArrowSchema;

namespace stoker::text {

class Tokenizer;
class ChatTemplate;

struct RowFormat {
  std::string field = "text";
  bool messages = false;
  // messages only: the template (non-null), its variables as a JSON object's text (bos_token,
  // eos_token, the user's own), and whether only the assistant's tokens are trained on.
  std::shared_ptr<const ChatTemplate> chat_template;
  std::string template_variables = "{}";
  bool assistant_only = false;
  // The tokenizer's post-processor special tokens. Messages: as a processor's
  // apply_chat_template(..., tokenize=True) adds them (a vision-language model's): unless the
  // rendered text starts with bos_text (the bos token's text; empty: none); they are not trained.
  bool add_special_tokens = false;
  std::string bos_text;
  std::optional<int32_t> bos, eos;
  uint64_t max_length = 0;
};

struct TextCorpusStats {
  uint64_t rows = 0;       // rows met (documents + skipped)
  uint64_t documents = 0;  // rows kept
  uint64_t tokens = 0;
  uint64_t trained_tokens = 0;  // tokens trained on (all of them without assistant_only)
  uint64_t truncated = 0;       // documents cut to max_length
  uint64_t skipped = 0;
  std::vector<std::string> skipped_reasons;  // the first few, "<path>: <reason>"
};

class TextCorpus final : public DocumentSet {
 public:
  // Opens a store that TextCorpusBuilder::finish() completed in `store_dir`. Throws IoError when
  // it is missing or incomplete.
  static std::shared_ptr<TextCorpus> open(const std::string& store_dir);
  ~TextCorpus() override;

  uint64_t num_documents() const override { return num_documents_; }
  uint64_t num_tokens() const override { return num_tokens_; }
  uint64_t document_length(uint64_t d) const override { return starts_[d + 1] - starts_[d]; }
  void read(uint64_t d, uint64_t offset, uint64_t count, int64_t* out) const override;
  std::string path(uint64_t d) const override;
  int64_t last_token(uint64_t d) const override { return tokens_[starts_[d + 1] - 1]; }
  bool has_untrained_tokens() const override { return trained_ != nullptr; }
  void read_trained(uint64_t d, uint64_t offset, uint64_t count, uint8_t* out) const override;

  const TextCorpusStats& stats() const { return stats_; }
  // Document d's origin (its position among the inputs added, in order) and its row there (a
  // JSONL file's line): what a caller that keeps its own per-row data (a row's images) needs.
  std::pair<size_t, uint64_t> row_of(uint64_t d) const;
  // Document d's tokens' trained flags (all 1 without assistant_only), for inspection.
  std::vector<uint8_t> trained(uint64_t d) const;

  struct Store;  // the mapped files (text_corpus.cc)
  struct Origin {
    std::string name;
    bool lines = false;           // JSONL: rows are lines, numbered from 1
    uint64_t first_document = 0;  // its first document's number
  };
  TextCorpus(std::unique_ptr<Store> store, std::vector<Origin> origins, TextCorpusStats stats);

 private:
  std::unique_ptr<Store> store_;
  std::vector<Origin> origins_;
  TextCorpusStats stats_;
  uint64_t num_documents_ = 0, num_tokens_ = 0;
  const uint32_t* tokens_ = nullptr;
  const uint8_t* trained_ = nullptr;  // null without assistant_only
  const uint64_t* starts_ = nullptr;  // num_documents_ + 1
  const uint64_t* rows_ = nullptr;    // each document's row (line) in its origin
};

class TextCorpusBuilder {
 public:
  // `threads` encoders (at least 1). See the header comment for the rest.
  TextCorpusBuilder(const Tokenizer& tokenizer, RowFormat format, std::string store_dir,
                    bool skip_bad_rows, int threads);
  ~TextCorpusBuilder();
  TextCorpusBuilder(const TextCorpusBuilder&) = delete;
  TextCorpusBuilder& operator=(const TextCorpusBuilder&) = delete;

  // Every row of a JSONL file (plain, or .gz / .zst by its name), in line order; `origin` names
  // it in errors (the path, or a URL it was fetched from). Returns when the file is read; its
  // last rows may still be encoding.
  void add_jsonl(const std::string& path, const std::string& origin);
  // Every row of a record batch given through the Arrow C data interface (a struct array whose
  // children are the columns), whose rows are numbered from `first_row` in `origin`. Takes
  // ownership of both (their release callbacks are called once the rows are encoded) and leaves
  // them released. Returns at once unless too many batches are waiting to be encoded.
  void add_arrow(ArrowArray* array, ArrowSchema* schema, const std::string& origin,
                 uint64_t first_row);
  // Waits for every row and completes the store. Throws the first bad row's SampleError unless
  // skip_bad_rows. REQUIRES: called once; the builder is spent after.
  std::shared_ptr<TextCorpus> finish();

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker::text
