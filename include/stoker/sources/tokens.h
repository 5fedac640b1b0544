// TokenSource: fixed-length windows over a file of token ids, the usual layout of LLM
// pre-training data.
//
// Sample i is (input, target) = (tokens[i*L : i*L + L], tokens[i*L + 1 : i*L + L + 1]) as int64,
// with L = seq_len; there are (num_tokens - 1) / L samples. Three file layouts are read:
// - raw: the tokens and nothing else (nanoGPT's train.bin);
// - llm.c: a 1024-byte header of 256 little-endian int32 (magic 20240520, version 1 for uint16
//   or 2 for uint32 tokens, the token count), then the tokens (llm.c's and modded-nanogpt's
//   shards);
// - .npy: a one-dimensional uint16 or uint32 array (np.save of the token ids).
// The layout is told by the file's first bytes. The file is memory-mapped read-only and shared by
// every thread; nothing is copied until a window is written into its batch slot.
//
// Thread safety: immutable; read() is safe from any number of threads.
// Errors: a file cut short while being read raises IoError naming it (MappedFile's guard) rather
// than the SIGBUS that reading past the end of a mapping raises.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "stoker/source.h"

namespace stoker {

class MappedFile;

// llm.c's token file header: 256 int32, magic first.
inline constexpr uint32_t kLlmcTokenMagic = 20240520;
inline constexpr uint64_t kLlmcHeaderBytes = 1024;

struct TokenFileLayout {
  enum class Format { kRaw, kLlmc, kNpy };
  Format format = Format::kRaw;
  uint64_t data_offset = 0;  // bytes before the first token
  uint64_t num_tokens = 0;
};

// The layout of a token file of `file_size` bytes whose first bytes are `head` (at least
// kLlmcHeaderBytes, the .npy header, or the whole file if shorter). Throws InvalidArgument naming
// `path` when token_dtype is not uint16 or uint32, the file's size does not fit its layout (a
// raw file whose size is not a multiple of the token size, a file shorter or longer than its
// header says), or its header is malformed or names another token type.
TokenFileLayout parse_token_file(std::span<const std::byte> head, uint64_t file_size,
                                 DType token_dtype, const std::string& path);

class TokenSource final : public Source {
 public:
  // REQUIRES: token_dtype is uint16 or uint32; seq_len >= 1; the file exists, fits its layout
  // (parse_token_file) and holds at least seq_len + 1 tokens. Throws InvalidArgument or IoError
  // naming the file otherwise.
  TokenSource(std::string path, DType token_dtype, uint64_t seq_len);
  ~TokenSource() override;
  TokenSource(const TokenSource&) = delete;
  TokenSource& operator=(const TokenSource&) = delete;

  uint64_t size() const override { return size_; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  void prefetch(uint64_t index) const override;
  std::string path(uint64_t) const override { return path_; }

  uint64_t num_tokens() const { return layout_.num_tokens; }
  const TokenFileLayout& layout() const { return layout_; }

 private:
  std::string path_;
  DType token_dtype_;
  uint64_t seq_len_;
  std::unique_ptr<MappedFile> file_;
  const std::byte* tokens_ = nullptr;  // the first token, inside the mapping
  TokenFileLayout layout_;
  uint64_t size_ = 0;
  std::vector<FieldSpec> fields_;
};

}  // namespace stoker
