// Megatron-LM indexed datasets (a .bin of tokens and its .idx), read and checked: TokenCorpus's
// reader, and the remote token corpus's (the bindings read a fetched .idx with it).
//
// Thread safety: free functions of their arguments, safe from any thread. Errors: as each
// function says (InvalidArgument for a malformed index, IoError for a missing or cut file).
//
// The .idx layout (megatron/core/datasets/indexed_dataset.py: _IndexWriter writes it, _IndexReader
// reads it), little-endian and unpadded, so its arrays are unaligned:
//
//   char[9]        "MMIDIDX\0\0"
//   uint64         version: 1
//   uint8          dtype code of the .bin's tokens: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64,
//                  6 float64, 7 float32, 8 uint16
//   uint64         S: sequences
//   uint64         D + 1: document indices
//   int32[S]       sequence lengths, in tokens
//   int64[S]       sequence pointers: byte offsets of the sequences in the .bin
//   int64[D + 1]   document indices: document d is sequences [idx[d], idx[d + 1]); idx[0] = 0 and
//                  idx[D] = S
//   int8[S]        sequence modes, in multimodal datasets only (not needed to read tokens: ignored)
//
// Megatron's builder writes each sequence right after the one before (pointer[i + 1] = pointer[i]
// + length[i] * itemsize, pointer[0] = 0; merging datasets keeps that), and so do its tools. We
// require it: the .bin is then a flat array of tokens, and a document one run of it, so a corpus
// needs nothing of the .idx once it is read (no per-sequence state, nothing read from the .idx's
// mapping after construction).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "stoker/dtype.h"

namespace stoker {

class MappedFile;

inline constexpr char kMegatronIndexMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
inline constexpr uint64_t kMegatronIndexHeaderBytes = 34;

struct MegatronPaths {
  std::string bin;
  std::string idx;
};

// The two files of the Megatron dataset `path` names, or nullopt when it names a flat token file.
// `path` names a Megatron dataset when it ends in ".idx", when it ends in ".bin" and the ".idx"
// beside it exists, or when it is a prefix (no file of that name) with a ".bin" or ".idx" beside
// it. A lone ".bin" is a flat token file (nanoGPT's train.bin). Throws IoError naming the missing
// half of a prefix that has only one.
std::optional<MegatronPaths> megatron_paths(const std::string& path);

// The token type of a Megatron dtype code. Throws InvalidArgument naming `idx_path` for a code
// that is not one, or names a floating-point type (no token ids).
DType megatron_token_dtype(uint8_t code, const std::string& idx_path);

struct MegatronIndex {
  DType token_dtype;                    // from the dtype code
  uint64_t data_offset = 0;             // the first sequence's byte offset in the .bin
  uint64_t num_tokens = 0;              // of every sequence
  std::vector<uint64_t> document_ends;  // per document: tokens of it and every document before
};

// Reads and checks `idx` against its .bin of `bin_size` bytes: O(sequences + documents), reading
// the .idx in chunks under its SIGBUS guard. Afterwards every document lies inside the .bin:
// document d is the tokens [document_ends[d - 1], document_ends[d]) (from 0 for d = 0) of the
// array at data_offset. Empty documents are kept, so that document numbers are Megatron's.
// Throws InvalidArgument naming the .idx for a malformed index (size, magic, version, dtype code,
// counts, a negative length, pointers not end to end, document indices not rising from 0 to S)
// and naming the .bin when it is shorter or longer than its index says; IoError when the .idx
// is cut while it is read.
MegatronIndex read_megatron_index(const MappedFile& idx, uint64_t bin_size,
                                  const std::string& bin_path);

}  // namespace stoker
