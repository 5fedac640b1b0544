// TokenSource: fixed-length windows over a flat binary file of token ids, the usual layout of LLM
// pre-training data (nanoGPT's train.bin).
//
// Sample i is (input, target) = (tokens[i*L : i*L + L], tokens[i*L + 1 : i*L + L + 1]) as int64,
// with L = seq_len; there are (num_tokens - 1) / L samples. The file is memory-mapped read-only and
// shared by every thread; nothing is copied until a window is written into its batch slot.
//
// Thread safety: immutable; read() is safe from any number of threads.
#pragma once

#include <string>

#include "stoker/source.h"

namespace stoker {

class TokenSource final : public Source {
 public:
  // REQUIRES: token_dtype is uint16 or uint32; seq_len >= 1; the file exists, its size is a
  // multiple of the token size and it holds at least seq_len + 1 tokens. Throws InvalidArgument or
  // IoError naming the file otherwise.
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

  uint64_t num_tokens() const { return num_tokens_; }

 private:
  std::string path_;
  DType token_dtype_;
  uint64_t seq_len_;
  const std::byte* map_ = nullptr;
  size_t map_bytes_ = 0;
  uint64_t num_tokens_ = 0;
  uint64_t size_ = 0;
  std::vector<FieldSpec> fields_;
};

}  // namespace stoker
