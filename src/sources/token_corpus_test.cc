#include "stoker/sources/token_corpus.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/test_temp_dir.h"
#include "stoker/sources/megatron.h"
#include "stoker/errors.h"
#include "stoker/sources/tokens.h"

namespace stoker {
namespace {

constexpr DType kU16{DType::kUInt, 16};
constexpr DType kU32{DType::kUInt, 32};

template <typename T>
std::string bytes_of(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
void append(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}

std::string write(const testing::TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir.path(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// A Megatron dataset as megatron/core/datasets/indexed_dataset.py writes it: documents of
// sequences, each sequence's tokens appended to the .bin; the .idx by _IndexWriter (magic,
// version 1, dtype code, counts, int32 lengths, int64 pointers as running byte offsets, int64
// document indices starting with 0).
struct MegatronWriter {
  uint8_t code = 8;  // uint16
  size_t item = 2;
  std::string bin;
  std::vector<int32_t> lengths;
  std::vector<int64_t> documents{0};

  // A document of the given sequences.
  void add_document(const std::vector<std::vector<int64_t>>& sequences) {
    for (const auto& seq : sequences) {
      for (int64_t t : seq) bin.append(reinterpret_cast<const char*>(&t), item);  // LE
      lengths.push_back(static_cast<int32_t>(seq.size()));
    }
    documents.push_back(static_cast<int64_t>(lengths.size()));
  }

  std::vector<int64_t> pointers() const {
    std::vector<int64_t> p;
    int64_t at = 0;
    for (int32_t l : lengths) p.push_back(at), at += l * static_cast<int64_t>(item);
    return p;
  }

  std::string idx(const std::vector<int64_t>& ptrs) const {
    std::string s(kMegatronIndexMagic, 9);
    append<uint64_t>(s, 1);
    append<uint8_t>(s, code);
    append<uint64_t>(s, lengths.size());
    append<uint64_t>(s, documents.size());
    return s + bytes_of(lengths) + bytes_of(ptrs) + bytes_of(documents);
  }
  std::string idx() const { return idx(pointers()); }

  // Writes prefix.bin and prefix.idx; returns the prefix.
  std::string write_to(const testing::TempDir& dir, const std::string& name) const {
    write(dir, name + ".bin", bin);
    write(dir, name + ".idx", idx());
    return dir.path(name);
  }
};

std::vector<int64_t> document(const TokenCorpus& c, uint64_t d) {
  std::vector<int64_t> out(c.document_length(d));
  c.read(d, 0, out.size(), out.data());
  return out;
}

std::string error_of(const std::vector<std::string>& paths, DType dtype = kU16,
                     std::optional<uint64_t> split_at = std::nullopt) {
  try {
    TokenCorpus c(paths, dtype, split_at);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_HAS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

using Docs = std::vector<std::vector<int64_t>>;

Docs all_documents(const TokenCorpus& c) {
  Docs out;
  for (uint64_t d = 0; d < c.num_documents(); ++d) out.push_back(document(c, d));
  return out;
}

TEST(TokenCorpus, MixedShardsNumberDocumentsAcrossAll) {
  testing::TempDir dir;
  const std::string raw = write(dir, "raw.bin", bytes_of(std::vector<uint16_t>{1, 2, 3}));
  MegatronWriter m;
  m.add_document({{10, 11}, {12}});
  m.add_document({{13, 14, 15}});
  const std::string prefix = m.write_to(dir, "mega");
  std::vector<int32_t> llmc(256, 0);
  llmc[0] = static_cast<int32_t>(kLlmcTokenMagic), llmc[1] = 1, llmc[2] = 2;
  const std::string headered =
      write(dir, "llmc.bin", bytes_of(llmc) + bytes_of(std::vector<uint16_t>{7, 8}));

  TokenCorpus c({raw, prefix, headered, prefix + ".idx", prefix + ".bin"}, kU16);
  EXPECT_EQ(c.num_shards(), 5u);
  EXPECT_EQ(all_documents(c), (Docs{{1, 2, 3},
                                    {10, 11, 12},
                                    {13, 14, 15},
                                    {7, 8},
                                    {10, 11, 12},
                                    {13, 14, 15},
                                    {10, 11, 12},
                                    {13, 14, 15}}));
  EXPECT_EQ(c.num_tokens(), 3u + 6 + 2 + 6 + 6);
  EXPECT_EQ(c.shard_format(0), TokenCorpus::Format::kRaw);
  EXPECT_EQ(c.shard_format(1), TokenCorpus::Format::kMegatron);
  EXPECT_EQ(c.shard_format(2), TokenCorpus::Format::kLlmc);
  EXPECT_EQ(c.shard_path(1), prefix + ".bin");
  EXPECT_EQ(c.path(2), prefix + ".bin");
  EXPECT_EQ(c.path(3), headered);
  EXPECT_EQ(c.shard_of(4), 3u);
  EXPECT_EQ(c.shard_first_document(2), 3u);
  EXPECT_EQ(c.shard_first_document(5), 8u);
  EXPECT_EQ(c.document_start(3), 9u);
  EXPECT_EQ(c.document_start(8), c.num_tokens());

  // A run inside a document.
  int64_t two[2];
  c.read(2, 1, 2, two);
  EXPECT_EQ(two[0], 14);
  EXPECT_EQ(two[1], 15);
}

TEST(TokenCorpus, SplitAtEndsDocumentsAfterTheToken) {
  testing::TempDir dir;
  constexpr uint16_t kEos = 0;
  // Runs longer than a scan block (64), an eos first and last, two in a row.
  std::vector<uint16_t> tokens{kEos, 5, 6, kEos, kEos};
  for (int i = 0; i < 150; ++i) tokens.push_back(static_cast<uint16_t>(100 + i));
  tokens.push_back(kEos);
  tokens.push_back(9);  // a last run without eos
  const std::string a = write(dir, "a.bin", bytes_of(tokens));
  const std::string b = write(dir, "b.bin", bytes_of(std::vector<uint16_t>{3, 4, kEos}));
  TokenCorpus c({a, b}, kU16, kEos);
  Docs expected{{kEos}, {5, 6, kEos}, {kEos}, {}, {9}, {3, 4, kEos}};
  for (int i = 0; i < 150; ++i) expected[3].push_back(100 + i);
  expected[3].push_back(kEos);
  EXPECT_EQ(all_documents(c), expected);

  // Without split_at each flat shard is one document.
  TokenCorpus whole({a, b}, kU16);
  EXPECT_EQ(whole.num_documents(), 2u);
  EXPECT_EQ(whole.document_length(0), tokens.size());
}

TEST(TokenCorpus, SplitAtFindsManyDocumentsInUint32Tokens) {
  // More documents than one scan pass records (16384), in a .npy of uint32 at an odd offset.
  testing::TempDir dir;
  std::vector<uint32_t> tokens;
  std::vector<uint64_t> lengths;
  for (uint32_t d = 0; d < 40000; ++d) {
    const uint32_t len = 1 + d % 7;
    for (uint32_t t = 0; t + 1 < len; ++t) tokens.push_back(70000 + d);
    tokens.push_back(1000000);
    lengths.push_back(len);
  }
  std::string dict = "{'descr': '<u4', 'fortran_order': False, 'shape': (" +
                     std::to_string(tokens.size()) + ",), }   ";
  while ((10 + dict.size() + 1) % 64 != 3) dict += ' ';
  dict += '\n';
  std::string npy = "\x93NUMPY\x01";
  npy += '\0';
  append<uint16_t>(npy, static_cast<uint16_t>(dict.size()));
  const std::string path = write(dir, "t.npy", npy + dict + bytes_of(tokens));
  TokenCorpus c({path}, kU32, 1000000);
  EXPECT_EQ(c.shard_format(0), TokenCorpus::Format::kNpy);
  ASSERT_EQ(c.num_documents(), lengths.size());
  for (uint64_t d = 0; d < lengths.size(); ++d) ASSERT_EQ(c.document_length(d), lengths[d]);
  const auto last = document(c, 39999);
  EXPECT_EQ(last.front(), 70000 + 39999);
  EXPECT_EQ(last.back(), 1000000);
}

TEST(TokenCorpus, DocumentAtAgreesWithBruteForce) {
  testing::TempDir dir;
  // Documents of many lengths (1 to 300 tokens), Megatron's empty documents among them.
  MegatronWriter m;
  std::vector<uint64_t> lengths;
  for (int d = 0; d < 200; ++d) {
    const int len = d % 13 == 0 ? 0 : (d * 37) % 300 + 1;
    m.add_document({std::vector<int64_t>(static_cast<size_t>(len), d)});
  }
  m.add_document({});  // a document of no sequences
  const std::string prefix = m.write_to(dir, "m");
  const std::string one = write(dir, "one.bin", bytes_of(std::vector<uint16_t>{42}));
  TokenCorpus c({one, prefix, one}, kU16);
  ASSERT_EQ(c.num_documents(), 1u + 201 + 1);
  uint64_t d = 0;
  for (uint64_t t = 0; t < c.num_tokens(); ++t) {
    while (c.document_start(d + 1) <= t) ++d;
    ASSERT_EQ(c.document_at(t), d) << "token " << t;
    ASSERT_GT(c.document_length(c.document_at(t)), 0u);
  }
  EXPECT_EQ(c.document_length(1), 0u);  // Megatron's document 0, empty, keeps its number
  EXPECT_EQ(document(c, 2), std::vector<int64_t>(38, 1));
}

TEST(TokenCorpus, MegatronDtypes) {
  testing::TempDir dir;
  struct Case {
    uint8_t code;
    size_t item;
  };
  for (const Case k : {Case{1, 1}, Case{2, 1}, Case{3, 2}, Case{4, 4}, Case{5, 8}, Case{8, 2}}) {
    MegatronWriter m;
    m.code = k.code, m.item = k.item;
    m.add_document({{1, 2}, {100}});
    m.add_document({{127}});
    const std::string prefix = m.write_to(dir, "m" + std::to_string(k.code));
    TokenCorpus c({prefix}, kU32);  // the .idx's dtype wins over the argument
    EXPECT_EQ(all_documents(c), (Docs{{1, 2, 100}, {127}})) << int(k.code);
  }
  for (uint8_t code : {6, 7, 0, 9}) {
    MegatronWriter m;
    m.code = code;
    m.add_document({{1}});
    const std::string prefix = m.write_to(dir, "bad" + std::to_string(code));
    const std::string e = error_of({prefix});
    EXPECT_HAS(e, prefix + ".idx");
    EXPECT_HAS(e, code >= 6 && code <= 7 ? "not token ids" : "unknown dtype code");
  }
}

TEST(TokenCorpus, NegativeIdsOfSignedMegatronTokensFailWhenRead) {
  testing::TempDir dir;
  MegatronWriter m;
  m.code = 4, m.item = 4;
  m.add_document({{1, 2}});
  m.add_document({{3, -4, 5}});
  const std::string prefix = m.write_to(dir, "neg");
  TokenCorpus c({prefix}, kU16);
  EXPECT_EQ(document(c, 0), (std::vector<int64_t>{1, 2}));
  try {
    document(c, 1);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "Megatron data file " + prefix +
                                         ".bin: document 1 (document 1 of the file), token 1: "
                                         "negative token id -4");
  }
}

TEST(TokenCorpus, VocabularyIsCheckedAsTokensAreRead) {
  testing::TempDir dir;
  const std::string a = write(dir, "a.bin", bytes_of(std::vector<uint16_t>{1, 2, 0}));
  const std::string b = write(dir, "b.bin", bytes_of(std::vector<uint16_t>{5, 0, 7, 50, 0}));
  TokenCorpus c({a, b}, kU16, 0, 50);  // constructs: ids are not scanned up front
  EXPECT_EQ(document(c, 1), (std::vector<int64_t>{5, 0}));
  int64_t ok[1];
  c.read(2, 0, 1, ok);  // the bad id is not in the run read
  try {
    document(c, 2);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()), "token file " + b +
                                         ": document 2 (document 1 of the file), token 1: token "
                                         "id 50 is outside the vocabulary (vocab_size 50)");
  }
  EXPECT_HAS(error_of({a}, kU16, 70000), "split_at 70000 is not a uint16 token id");
  try {
    TokenCorpus({a}, kU16, 60, 50);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_HAS(e.what(), "split_at 60 is outside the vocabulary (vocab_size 50)");
  }
}

TEST(TokenCorpus, BadArguments) {
  testing::TempDir dir;
  const std::string a = write(dir, "a.bin", bytes_of(std::vector<uint16_t>{1, 2}));
  EXPECT_HAS(error_of({}), "at least one shard");
  EXPECT_HAS(error_of({a}, kFloat32), "dtype must be \"uint16\" or \"uint32\"");
  EXPECT_THROW(TokenCorpus({dir.path("missing.bin")}, kU16), IoError);
  const std::string empty = write(dir, "empty.bin", "");
  EXPECT_EQ(error_of({a, empty}), "token file " + empty + " holds no tokens");
  EXPECT_HAS(error_of({write(dir, "odd.bin", "abc")}), "not a multiple of 2");
}

TEST(TokenCorpus, MegatronPairMissingAHalf) {
  testing::TempDir dir;
  MegatronWriter m;
  m.add_document({{1}});
  write(dir, "only_bin.bin", m.bin);
  write(dir, "only_idx.idx", m.idx());
  const std::string bin_only = dir.path("only_bin"), idx_only = dir.path("only_idx");
  EXPECT_EQ(error_of({bin_only}), "Megatron dataset " + bin_only +
                                      " has .bin but no .idx: cannot open " + bin_only + ".idx");
  EXPECT_EQ(error_of({idx_only}), "Megatron dataset " + idx_only +
                                      " has .idx but no .bin: cannot open " + idx_only + ".bin");
  try {
    TokenCorpus({idx_only + ".idx"}, kU16);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_HAS(e.what(), "cannot open Megatron data file " + idx_only + ".bin");
  }
  // A .bin alone is a flat token file (nanoGPT's train.bin).
  TokenCorpus flat({bin_only + ".bin"}, kU16);
  EXPECT_EQ(flat.shard_format(0), TokenCorpus::Format::kRaw);
}

// Each broken .idx or .bin, with the message it must give (a part of it) and the file it names.
TEST(TokenCorpus, MalformedMegatronIndexes) {
  testing::TempDir dir;
  MegatronWriter m;
  m.add_document({{1, 2}, {3}});
  m.add_document({{4, 5, 6}});
  m.add_document({{7}});
  const std::string good = m.idx();
  int n = 0;
  auto check = [&](const std::string& idx, const std::string& bin, const std::string& what,
                   bool names_bin = false) {
    const std::string prefix = dir.path("bad" + std::to_string(n++));
    write(dir, prefix.substr(dir.dir().size() + 1) + ".idx", idx);
    write(dir, prefix.substr(dir.dir().size() + 1) + ".bin", bin);
    const std::string e = error_of({prefix});
    EXPECT_HAS(e, (names_bin ? prefix + ".bin" : prefix + ".idx"));
    EXPECT_HAS(e, what);
  };
  auto patched = [&](size_t at, const void* v, size_t size) {
    std::string s = good;
    std::memcpy(s.data() + at, v, size);
    return s;
  };
  const size_t lengths_at = 34, pointers_at = 34 + 4 * 4, documents_at = pointers_at + 8 * 4;

  check(good.substr(0, 20), m.bin, "truncated header (20 bytes");
  check("MMIDIDY" + good.substr(7), m.bin, "not a Megatron index");
  const uint64_t v2 = 2;
  check(patched(9, &v2, 8), m.bin, "unknown version 2");
  check(good.substr(0, good.size() - 8), m.bin, "its counts (4 sequences, 4 document indices)");
  check(good + "x", m.bin, "its counts (4 sequences, 4 document indices) need 114 bytes");
  const uint64_t huge = uint64_t{1} << 62;
  check(patched(18, &huge, 8), m.bin, "need more bytes than the 114 it has");
  check(patched(26, &huge, 8), m.bin, "need more bytes than");
  const int32_t negative = -1;
  check(patched(lengths_at + 4, &negative, 4), m.bin, "sequence 1 has a negative length (-1)");
  const int64_t ptr = 2;  // not after sequence 0 (bytes 0-4)
  check(patched(pointers_at + 8, &ptr, 8), m.bin,
        "sequence 1 starts at byte 2, not right after sequence 0 (byte 4)");
  const int64_t back = 0;  // not monotone
  check(patched(pointers_at + 16, &back, 8), m.bin, "sequence 2 starts at byte 0");
  const int64_t first = 1;
  check(patched(documents_at, &first, 8), m.bin, "document indices start at 1, not 0");
  const int64_t down = 1;  // 0, 2, 1, 4
  check(patched(documents_at + 16, &down, 8), m.bin,
        "document index 2 is 1, below the one before (2)");
  const int64_t past = 5;
  check(patched(documents_at + 24, &past, 8), m.bin, "document index 3 is 5, past the 4 sequences");
  const int64_t short_end = 3;
  check(patched(documents_at + 24, &short_end, 8), m.bin,
        "document indices end at sequence 3, not at the 4 sequences");
  const uint64_t none = 0;
  std::string no_docs = good.substr(0, documents_at);
  std::memcpy(no_docs.data() + 26, &none, 8);
  check(no_docs, m.bin, "no document indices");
  // The .bin disagrees with its .idx: the error names the .bin.
  check(good, m.bin.substr(0, m.bin.size() - 1), "is shorter than its index says: sequence 3 ends",
        true);
  check(good, m.bin + "xy", "is longer than its index says", true);
  const int64_t far = 1000;
  MegatronWriter one;
  one.add_document({{1}});
  check(one.idx({far}), one.bin, "sequence 0 starts at byte 1000, the file has 2 bytes", true);
  // No tokens at all.
  MegatronWriter empty;
  empty.add_document({{}});
  check(empty.idx(), "", "holds no tokens", true);
  MegatronWriter nothing;
  check(nothing.idx(), "", "holds no tokens", true);
}

TEST(TokenCorpus, MultimodalIndexesReadTheirTokens) {
  testing::TempDir dir;
  MegatronWriter m;
  m.add_document({{1, 2}, {3}});
  write(dir, "mm.bin", m.bin);
  write(dir, "mm.idx", m.idx() + std::string(2, '\0'));  // a mode per sequence
  TokenCorpus c({dir.path("mm")}, kU16);
  EXPECT_EQ(all_documents(c), (Docs{{1, 2, 3}}));
}

TEST(TokenCorpus, AShardTruncatedWhileMappedRaisesIoErrorNotSigbus) {
  testing::TempDir dir;
  MegatronWriter m;
  std::vector<int64_t> seq(64 * 1024);  // 128 KiB: many pages
  for (size_t i = 0; i < seq.size(); ++i) seq[i] = static_cast<int64_t>(i % 60000);
  m.add_document({seq});
  const std::string prefix = m.write_to(dir, "shrinks");
  const std::string flat = write(dir, "flat.bin", m.bin);
  TokenCorpus c({prefix, flat}, kU16);
  std::vector<int64_t> out(1024);
  for (uint64_t d : {0, 1}) {
    const std::string path = c.path(d);
    ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
    c.read(d, 0, 1024, out.data());  // still inside the file
    EXPECT_EQ(out[1000], 1000);
    try {
      c.read(d, 60000, 1024, out.data());
      FAIL() << "no error";
    } catch (const IoError& e) {
      EXPECT_HAS(e.what(), path + " was truncated while being read (it had 131072 bytes");
    }
  }
}

TEST(MegatronPaths, PrefixOrEitherFile) {
  testing::TempDir dir;
  write(dir, "x.bin", "");
  write(dir, "x.idx", "");
  write(dir, "y.bin", "");
  const std::string x = dir.path("x");
  for (const std::string& p : {x, x + ".bin", x + ".idx"}) {
    const auto paths = megatron_paths(p);
    ASSERT_TRUE(paths.has_value()) << p;
    EXPECT_EQ(paths->bin, x + ".bin");
    EXPECT_EQ(paths->idx, x + ".idx");
  }
  EXPECT_FALSE(megatron_paths(dir.path("y.bin")).has_value());
  EXPECT_FALSE(megatron_paths(dir.path("nothing")).has_value());
}

}  // namespace
}  // namespace stoker
