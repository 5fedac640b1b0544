// Tokenizer: text to token ids and back, as Hugging Face `tokenizers` does it, read from a
// tokenizer.json; or as the sentencepiece library does it, read from a SentencePiece .model.
//
// Contract: for the files it accepts, encode() returns the ids `tokenizers` returns
// (Tokenizer.encode(text, add_special_tokens).ids), encode_with_offsets() also its offsets
// (.offsets, as bytes), and decode() its decode(). Supported:
//   models:         BPE (byte-level: GPT-2, RoBERTa, Llama 3, Qwen, DeepSeek; SentencePiece-style
//                   with byte_fallback and fuse_unk: Llama 2, Mistral), WordPiece (BERT), Unigram;
//   normalizers:    NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, Prepend,
//                   BertNormalizer, Sequence;
//   pre-tokenizers: ByteLevel, Split, Metaspace, Whitespace, WhitespaceSplit, BertPreTokenizer,
//                   Punctuation, Digits, Sequence;
//   added tokens:   matched before the model, with their normalized, lstrip, rstrip and
//                   single_word flags; special ones skipped by decode(skip_special_tokens);
//   post-processors (add_special_tokens): TemplateProcessing (single sequences), BertProcessing,
//                   RobertaProcessing, ByteLevel, Sequence;
//   decoders:       ByteLevel, Metaspace, WordPiece, ByteFallback, Fuse, Strip, Replace,
//   BPEDecoder,
//                   Sequence.
// Characters assigned in recent Unicode versions may classify differently from `tokenizers`
// (each library has its own Unicode tables: PCRE2's, utf8proc's, tokenizers' Rust crates'): a scan
// of every code point found differences only there, in BertNormalizer, Whitespace's \w,
// StripAccents and NFKC; none in the byte-level and SentencePiece-style BPE pipelines. Anything
// else (another component, BPE dropout, a truncation or padding setting, an option value not
// listed) is refused when the file is loaded: never ids that differ from `tokenizers`.
//
// tiktoken BPE files (from_file; cl100k_base.tiktoken, o200k_base.tiktoken and the like, or any
// such file given its pattern): ids equal tiktoken's Encoding(name, pat_str, mergeable_ranks,
// special_tokens).encode(text, allowed_special="all"), and encode_ordinary(text) where there are
// no special tokens: as for a tokenizer.json, special tokens in the text are matched (the longest
// at the leftmost place) and become their ids, the text between them is split by the pattern
// (text no match covers is dropped, as tiktoken drops it) and each match byte-pair encoded by rank
// (a match that is a token whole is that token). add_special_tokens adds nothing (tiktoken has no
// post-processor). decode() is tiktoken's decode (errors="replace"); offsets are bytes of the
// matches, as the byte-level BPE's.
//
// SentencePiece .model files (from_file; Llama 2's tokenizer.model, T5's, any model_type) go
// through the sentencepiece library itself (SentencePieceProcessor, linked where the build found
// it: sentencepiece_supported()), so ids are the library's: encode() is EncodeAsIds (no sampling,
// no extra options), decode() DecodeIds, vocab_size() GetPieceSize, token_to_id() PieceToId (only
// for a piece of the model: nullopt, not unk_id, for any other), id_to_token() IdToPiece.
// add_special_tokens: bos_id() before the ids and eos_id() after, each only where the model
// defines it (>= 0; a model trained with bos_id=-1 gets no BOS; transformers' LlamaTokenizer adds
// the BOS only). decode() skips ids out of range; skip_special_tokens also drops control (<s>,
// </s>) and unknown (<unk>) ids. The ids are those of the library version linked (Debian's 0.1.97);
// where two Unigram segmentations tie, another version may keep the other (the Python package
// 0.2.3 did on one text of 1,194 in tests/python/test_text_tokenizer.py).
//
// Thread safety: a loaded Tokenizer is immutable; encode(), encode_with_offsets(), decode() and the
// lookups are safe from many threads at once without external synchronization. Each thread keeps
// its own bounded caches of the BPE ids of frequent words (thread-local, no locks; one for
// encode(), one with each id's bytes for encode_with_offsets()). A .model's SentencePieceProcessor
// is loaded once and only its const methods are called after; sentencepiece_processor.h makes no
// thread-safety statement, but the library's own Python binding encodes a batch on many threads
// over one processor, as encode_batch() does (src/text/sentencepiece.cc).
//
// Errors: a file that cannot be read (or a directory with neither file) throws IoError; a file
// that is not a tokenizer.json (nor a .model, nor a tiktoken file), or names a component or
// option listed nowhere above, throws InvalidArgument naming the file (its origin) and the
// component; a .model the sentencepiece library does not load (or any .model, in a build without
// sentencepiece) throws InvalidArgument naming the file; a tiktoken file with a line that is not
// "<base64 token> <rank>", or of an unknown name and no pattern, throws InvalidArgument naming
// the file; encode() of text that is not valid UTF-8 throws DecodeError (for a .model too), and
// of a character that a Unigram model without unk_id cannot represent, InvalidArgument naming the
// file (`tokenizers` fails there too: "unk_id is missing"); encode_with_offsets() alike.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace stoker::text {

// A token's place in the text it was encoded from: its bytes [begin, end).
struct TokenSpan {
  uint32_t begin = 0;
  uint32_t end = 0;
  bool operator==(const TokenSpan&) const = default;
};

// What a tiktoken BPE file does not hold, for from_file: tiktoken's pat_str (the regex that
// splits text before BPE) and special tokens (text -> id). Unset: those of the known encoding the
// file is named after (cl100k_base, o200k_base, r50k_base, p50k_base, p50k_edit: "<name>" or
// "<name>.tiktoken"); for a file of another name the pattern is required and no special tokens
// are assumed.
struct TiktokenOptions {
  std::optional<std::string> pattern;
  std::optional<std::map<std::string, int32_t>> special_tokens;
};

// Ids and, per id, its offsets: encode_with_offsets().
struct Encoding {
  std::vector<int32_t> ids;
  std::vector<TokenSpan> offsets;  // one per id
};

class Tokenizer {
 public:
  // Parses tokenizer.json text; `origin` (a path, or a description) names it in errors. Numbers
  // are read exactly: the text of a tokenizer in memory (Hugging Face's to_str()) gives the
  // values it holds.
  static Tokenizer from_json(std::string_view json, const std::string& origin = "tokenizer.json");
  // Reads and parses a tokenizer.json file, its numbers read as Hugging Face tokenizers reads a
  // file's (serde_json, not correctly rounded: a Unigram's scores may then differ by an ulp from
  // the exact values, and so, on ties, may the best path), so that ids equal those of
  // tokenizers.Tokenizer.from_file of the same file.
  // Or loads a SentencePiece model: a file whose name ends in .model, or whose content is not
  // JSON's ('{' after whitespace) but starts as a serialized ModelProto does (byte 0x0A).
  // `path` may be a directory: its tokenizer.json, or, where it has none, its tokenizer.model
  // (as Llama 2 checkpoints ship).
  // Or reads a tiktoken BPE file (a name ending in .tiktoken, or content whose first line is
  // "<base64 token> <rank>"), with `tiktoken`'s pattern and special tokens (which only a tiktoken
  // file takes: InvalidArgument otherwise). A file of an unknown name without a pattern throws
  // InvalidArgument naming what is missing.
  static Tokenizer from_file(const std::string& path, const TiktokenOptions& tiktoken = {});
  // Whether this build reads SentencePiece .model files (it found libsentencepiece).
  static bool sentencepiece_supported();

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // The ids of `text`; with add_special_tokens, as the file's post-processor frames them.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // encode() of each text, on up to `threads` threads (at least 1; never more than the texts);
  // the first failure is rethrown, typed, after every thread has finished.
  std::vector<std::vector<int32_t>> encode_batch(const std::vector<std::string>& texts,
                                                 bool add_special_tokens, int threads) const;
  // encode(), and per id the bytes of `text` it stands for: `tokenizers`' Encoding.offsets
  // (character offsets into the Python str) as byte offsets, for every file encode() accepts.
  // As there: a token of a character the normalizer expanded (or of one of the tokens a
  // character's byte-fallback bytes became) covers the whole character, so several tokens may
  // share a range; a character the normalizer removed is covered by none; a post-processor's
  // special token is [0, 0); ByteLevel's trim_offsets (a ByteLevel or RobertaProcessing
  // post-processor) narrows tokens past their leading and trailing spaces, with and without
  // add_special_tokens. For a .model: SentencePieceText's pieces' begin and end (the library's
  // EncodeAsImmutableProto), bos and eos [0, 0). Texts of 4 GiB or more throw InvalidArgument.
  // Costs more than encode() (the normalized text keeps an alignment per byte), which is
  // unchanged by it.
  Encoding encode_with_offsets(std::string_view text, bool add_special_tokens = false) const;
  // encode_with_offsets() of each text, on threads as encode_batch().
  std::vector<Encoding> encode_batch_with_offsets(const std::vector<std::string>& texts,
                                                  bool add_special_tokens, int threads) const;
  // Byte offsets into `text` (valid UTF-8) made character (code point) offsets in place, as
  // Python indexes a str (encode_with_offsets' offsets fall on character boundaries; a byte
  // inside a character would count as that character). One pass over the text.
  static void to_char_offsets(std::string_view text, std::vector<TokenSpan>& offsets);

  // The text of `ids` (unknown ids are skipped, as `tokenizers` does).
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // Distinct tokens, the model's and the added ones.
  size_t vocab_size() const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;

  class Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker::text
