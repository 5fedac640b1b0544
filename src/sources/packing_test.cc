#include "stoker/sources/packing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "engine/test_temp_dir.h"
#include "stoker/testing/test_documents.h"
#include "stoker/errors.h"
#include "stoker/sources/document_source.h"
#include "stoker/sources/tokens.h"

namespace stoker {
namespace {

using testing::VectorDocuments;
using Docs = std::vector<std::vector<int64_t>>;

// Token of document d at position p: unique over the corpus, so a sample says where each of its
// tokens comes from.
constexpr int64_t kStride = 1000000;
int64_t token(uint64_t d, uint64_t p) { return static_cast<int64_t>(d) * kStride + p; }
uint64_t doc_of(int64_t t) { return static_cast<uint64_t>(t / kStride); }
uint64_t pos_of(int64_t t) { return static_cast<uint64_t>(t % kStride); }
constexpr int64_t kEos = -7;  // the padding token in these tests: no document's token

Docs corpus_of(const std::vector<uint64_t>& lengths) {
  Docs docs(lengths.size());
  for (uint64_t d = 0; d < lengths.size(); ++d)
    for (uint64_t p = 0; p < lengths[d]; ++p) docs[d].push_back(token(d, p));
  return docs;
}

// Random lengths: empty documents, length-1 documents, short ones, ones near L and ones several
// times L.
std::vector<uint64_t> random_lengths(uint64_t n, uint64_t L, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint64_t> lengths(n);
  for (auto& len : lengths) {
    switch (rng() % 6) {
      case 0:
        len = rng() % 2;  // 0 or 1
        break;
      case 1:
      case 2:
        len = 1 + rng() % (L / 2 + 1);
        break;
      case 3:
        len = L - 1 + rng() % 3;  // L - 1, L, L + 1
        break;
      case 4:
        len = 1 + rng() % L;
        break;
      default:
        len = 1 + rng() % (3 * L);
    }
  }
  return lengths;
}

std::shared_ptr<VectorDocuments> documents(const Docs& docs) {
  return std::make_shared<VectorDocuments>(docs);
}

// One sample as read into fresh buffers, each field's bytes.
std::vector<std::vector<std::byte>> read_bytes(const Source& src, uint64_t seed, uint64_t epoch,
                                               uint64_t index) {
  std::vector<std::vector<std::byte>> out;
  std::vector<std::byte*> slots;
  for (const auto& f : src.fields()) out.emplace_back(f.sample_bytes(), std::byte{0x5a});
  for (auto& o : out) slots.push_back(o.data());
  src.read({seed, epoch, index}, slots, nullptr);
  return out;
}

template <typename T>
std::vector<T> as(const std::vector<std::byte>& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

struct Sample {
  std::vector<int64_t> input, labels, positions;
  std::vector<int32_t> cu_seqlens;
  int32_t max_seqlen = 0;
  std::vector<uint8_t> loss_mask;
};

Sample read_sample(const PackedTokenSource& src, uint64_t seed, uint64_t epoch, uint64_t index) {
  const auto b = read_bytes(src, seed, epoch, index);
  Sample s{as<int64_t>(b[0]), as<int64_t>(b[1]),    as<int64_t>(b[2]),
           as<int32_t>(b[3]), as<int32_t>(b[4])[0], {}};
  if (b.size() > 5) s.loss_mask = as<uint8_t>(b[5]);
  return s;
}

PackOptions options(Pack mode, uint64_t L, bool shuffle = false) {
  PackOptions o;
  o.mode = mode;
  o.seq_len = L;
  o.eos = kEos;
  o.shuffle_documents = shuffle;
  o.loss_mask = true;
  return o;
}

// Checks every invariant of a kDocument/kBestFit sample over corpus `docs`; returns its number of
// segments (padding included) and adds its tokens to `seen` (document, position) -> count.
uint64_t check_sample(const Sample& s, const Docs& docs, const PackedTokenSource& src,
                      std::map<std::pair<uint64_t, uint64_t>, int>& seen) {
  const uint64_t L = src.seq_len();
  EXPECT_EQ(s.input.size(), L);
  EXPECT_EQ(s.cu_seqlens.size(), src.max_segments() + 1);
  EXPECT_EQ(s.cu_seqlens.front(), 0);
  EXPECT_EQ(s.cu_seqlens.back(), static_cast<int32_t>(L));
  uint64_t segments = 0;
  int32_t longest = 0;
  int64_t prev_last = -1;  // the last token of the previous segment
  for (size_t k = 1; k < s.cu_seqlens.size(); ++k) {
    const int32_t a = s.cu_seqlens[k - 1], b = s.cu_seqlens[k];
    EXPECT_LE(a, b) << "cu_seqlens is not monotone at " << k;
    if (a >= b) continue;
    ++segments;
    longest = std::max(longest, b - a);
    if (s.input[a] == kEos) {  // padding: the last segment
      EXPECT_EQ(b, static_cast<int32_t>(L));
      for (int32_t j = a; j < b; ++j) {
        EXPECT_EQ(s.input[j], kEos);
        EXPECT_EQ(s.labels[j], -100);
        EXPECT_EQ(s.positions[j], 0);
        EXPECT_EQ(s.loss_mask[j], 0);
      }
      continue;
    }
    const uint64_t d = doc_of(s.input[a]), p0 = pos_of(s.input[a]);
    const uint64_t len = docs[d].size();
    // A new segment is never the previous one continued.
    EXPECT_FALSE(prev_last >= 0 && s.input[a] == prev_last + 1 && p0 > 0)
        << "a document split into two segments of one sample";
    if (src.mode() == Pack::kDocument) {
      EXPECT_TRUE(p0 == 0 || a == 0) << "only the first segment continues a document";
    } else {
      EXPECT_EQ(p0 % L, 0u) << "best_fit pieces start at a multiple of L";
      const uint64_t piece = std::min(L, len - p0);
      EXPECT_EQ(static_cast<uint64_t>(b - a), piece) << "best_fit piece of document " << d;
    }
    for (int32_t j = a; j < b; ++j) {
      const uint64_t p = p0 + static_cast<uint64_t>(j - a);
      EXPECT_EQ(s.input[j], token(d, p));
      EXPECT_EQ(s.positions[j], j - a);
      const int64_t label = p + 1 < len ? token(d, p + 1) : -100;
      EXPECT_EQ(s.labels[j], label);
      EXPECT_EQ(s.loss_mask[j], label != -100 ? 1 : 0);
      ++seen[{d, p}];
    }
    prev_last = s.input[b - 1];
  }
  EXPECT_EQ(s.max_seqlen, longest);
  return segments;
}

// Reads a whole epoch, checks every sample and that every token of every document came exactly
// once; returns the epoch's samples. `exact`: max_segments() is the most any sample has (not
// only a bound).
std::vector<Sample> check_epoch(const PackedTokenSource& src, const Docs& docs, uint64_t seed,
                                uint64_t epoch, bool exact) {
  std::map<std::pair<uint64_t, uint64_t>, int> seen;
  std::vector<Sample> samples;
  uint64_t padding = 0, most_segments = 0;
  for (uint64_t i = 0; i < src.size(); ++i) {
    samples.push_back(read_sample(src, seed, epoch, i));
    most_segments = std::max(most_segments, check_sample(samples.back(), docs, src, seen));
    padding += static_cast<uint64_t>(
        std::count(samples.back().input.begin(), samples.back().input.end(), kEos));
  }
  uint64_t total = 0;
  for (uint64_t d = 0; d < docs.size(); ++d) {
    total += docs[d].size();
    for (uint64_t p = 0; p < docs[d].size(); ++p) {
      const auto it = seen.find({d, p});
      EXPECT_TRUE(it != seen.end() && it->second == 1)
          << "document " << d << " token " << p << " delivered "
          << (it == seen.end() ? 0 : it->second) << " times";
    }
  }
  EXPECT_EQ(seen.size(), total);
  EXPECT_EQ(padding, src.padded_tokens());
  EXPECT_EQ(src.size() * src.seq_len(), total + src.padded_tokens());
  if (exact) {
    EXPECT_EQ(most_segments, src.max_segments());
  }
  EXPECT_LE(most_segments, src.max_segments());
  return samples;
}

bool same(const Sample& a, const Sample& b) {
  return a.input == b.input && a.labels == b.labels && a.positions == b.positions &&
         a.cu_seqlens == b.cu_seqlens && a.max_seqlen == b.max_seqlen && a.loss_mask == b.loss_mask;
}

std::string error_of(const std::shared_ptr<const DocumentSet>& docs, const PackOptions& o) {
  try {
    PackedTokenSource src(docs, o);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------------------------------------
// kConcat

TEST(PackConcat, OneDocumentIsTokenSource) {
  testing::TempDir dir;
  const std::string path = dir.path("tokens.bin");
  std::vector<uint32_t> tokens(1000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 7919 % 50257);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), tokens.size() * 4);
  auto docs = documents({std::vector<int64_t>(tokens.begin(), tokens.end())});
  for (uint64_t L : {1u, 7u, 64u, 999u}) {
    const TokenSource file(path, DType{DType::kUInt, 32}, L);
    PackOptions o;
    o.seq_len = L;
    const PackedTokenSource packed(docs, o);
    ASSERT_EQ(packed.size(), file.size()) << "L=" << L;
    ASSERT_EQ(packed.fields().size(), 2u);
    for (size_t f = 0; f < 2; ++f) {
      EXPECT_EQ(packed.fields()[f].name, file.fields()[f].name);
      EXPECT_EQ(packed.fields()[f].dtype, file.fields()[f].dtype);
      EXPECT_EQ(packed.fields()[f].shape, file.fields()[f].shape);
    }
    for (uint64_t i = 0; i < packed.size(); ++i)
      ASSERT_EQ(read_bytes(packed, 3, 1, i), read_bytes(file, 3, 1, i)) << "L=" << L << " i=" << i;
    EXPECT_EQ(packed.padded_tokens(), 0u);
    EXPECT_EQ(packed.path(0), "doc-0");
  }
}

// The stream of documents with eos between consecutive ones (after a document but the last that
// is not empty and does not end with eos already), as the windows must show it.
std::vector<int64_t> stream_of(const Docs& docs, std::optional<int64_t> eos) {
  std::vector<int64_t> s;
  for (size_t d = 0; d < docs.size(); ++d) {
    s.insert(s.end(), docs[d].begin(), docs[d].end());
    if (eos && d + 1 < docs.size() && !docs[d].empty() && docs[d].back() != *eos) s.push_back(*eos);
  }
  return s;
}

void expect_windows(const Docs& docs, std::optional<int64_t> eos, uint64_t L) {
  const std::vector<int64_t> stream = stream_of(docs, eos);
  PackOptions o;
  o.seq_len = L;
  o.eos = eos;
  const PackedTokenSource src(documents(docs), o);
  ASSERT_EQ(src.size(), (stream.size() - 1) / L);
  for (uint64_t i = 0; i < src.size(); ++i) {
    const auto b = read_bytes(src, 0, 0, i);
    const auto first = stream.begin() + static_cast<ptrdiff_t>(i * L);
    ASSERT_EQ(as<int64_t>(b[0]), std::vector<int64_t>(first, first + static_cast<ptrdiff_t>(L)))
        << "window " << i << " L=" << L;
    ASSERT_EQ(as<int64_t>(b[1]),
              std::vector<int64_t>(first + 1, first + 1 + static_cast<ptrdiff_t>(L)))
        << "window " << i << " L=" << L;
  }
}

TEST(PackConcat, EosBetweenDocumentsExactly) {
  // Every document of the stream ends with eos: none after an empty one or one that ends with
  // eos already, none after the last: [1 2 3] eos [4] eos [] [7 99] [5 6].
  const Docs docs{{1, 2, 3}, {4}, {}, {7, 99}, {5, 6}};
  EXPECT_EQ(stream_of(docs, 99), (std::vector<int64_t>{1, 2, 3, 99, 4, 99, 7, 99, 5, 6}));
  for (uint64_t L : {1u, 2u, 3u, 8u}) expect_windows(docs, 99, L);
  for (uint64_t L : {1u, 2u, 5u}) expect_windows(docs, std::nullopt, L);
  PackOptions o;
  o.seq_len = 4;
  o.eos = 99;
  const PackedTokenSource src(documents(docs), o);
  ASSERT_EQ(src.size(), 2u);
  EXPECT_EQ(as<int64_t>(read_bytes(src, 0, 0, 1)[0]), (std::vector<int64_t>{4, 99, 7, 99}));
  EXPECT_EQ(as<int64_t>(read_bytes(src, 0, 0, 1)[1]), (std::vector<int64_t>{99, 7, 99, 5}));
  EXPECT_EQ(src.path(1), "doc-1");
}

TEST(PackConcat, RandomCorporaFindEveryWindow) {
  // Runs of tiny documents beside long ones: the position -> document table's buckets hold many
  // starts or none.
  for (uint32_t seed = 0; seed < 6; ++seed) {
    std::vector<uint64_t> lengths = random_lengths(300, 16, seed);
    for (size_t i = 0; i < 40; ++i) lengths[100 + i] = 1;
    lengths[200] = 5000;
    lengths.back() = 300;  // the last document spans buckets too
    const Docs docs = corpus_of(lengths);
    expect_windows(docs, kEos, 16);
    expect_windows(docs, std::nullopt, 13);
    expect_windows(docs, std::nullopt, 1);
  }
}

// ---------------------------------------------------------------------------------------------
// kDocument

TEST(PackDocument, WindowsExactly) {
  // [a0 a1 a2 | b0] [c0 c1 c2 c3] [c4 pad pad pad]
  const Docs docs = corpus_of({3, 1, 5});
  const PackedTokenSource src(documents(docs), options(Pack::kDocument, 4));
  ASSERT_EQ(src.size(), 3u);
  EXPECT_EQ(src.max_segments(), 2u);
  EXPECT_EQ(src.padded_tokens(), 3u);
  EXPECT_DOUBLE_EQ(src.padding_fraction(), 3.0 / 12);
  EXPECT_EQ(src.num_pieces(), 3u);
  const auto& f = src.fields();
  ASSERT_EQ(f.size(), 6u);
  EXPECT_EQ(f[0].name, "input_ids");
  EXPECT_EQ(f[1].name, "labels");
  EXPECT_EQ(f[2].name, "position_ids");
  EXPECT_EQ(f[3].name, "cu_seqlens");
  EXPECT_EQ(f[3].dtype, (DType{DType::kInt, 32}));
  EXPECT_EQ(f[3].shape, (std::vector<int64_t>{3}));
  EXPECT_EQ(f[4].name, "max_seqlen");
  EXPECT_EQ(f[4].dtype, (DType{DType::kInt, 32}));
  EXPECT_TRUE(f[4].shape.empty());
  EXPECT_EQ(f[5].name, "loss_mask");
  EXPECT_EQ(f[5].dtype, kUInt8);

  Sample s = read_sample(src, 0, 0, 0);
  EXPECT_EQ(s.input, (std::vector<int64_t>{token(0, 0), token(0, 1), token(0, 2), token(1, 0)}));
  EXPECT_EQ(s.labels, (std::vector<int64_t>{token(0, 1), token(0, 2), -100, -100}));
  EXPECT_EQ(s.positions, (std::vector<int64_t>{0, 1, 2, 0}));
  EXPECT_EQ(s.cu_seqlens, (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(s.max_seqlen, 3);
  EXPECT_EQ(s.loss_mask, (std::vector<uint8_t>{1, 1, 0, 0}));
  s = read_sample(src, 0, 0, 1);
  EXPECT_EQ(s.input, (std::vector<int64_t>{token(2, 0), token(2, 1), token(2, 2), token(2, 3)}));
  // The last label is the document's next token, in the next window.
  EXPECT_EQ(s.labels, (std::vector<int64_t>{token(2, 1), token(2, 2), token(2, 3), token(2, 4)}));
  EXPECT_EQ(s.cu_seqlens, (std::vector<int32_t>{0, 4, 4}));
  EXPECT_EQ(s.max_seqlen, 4);
  s = read_sample(src, 0, 0, 2);
  EXPECT_EQ(s.input, (std::vector<int64_t>{token(2, 4), kEos, kEos, kEos}));
  EXPECT_EQ(s.labels, (std::vector<int64_t>{-100, -100, -100, -100}));
  EXPECT_EQ(s.positions, (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(s.cu_seqlens, (std::vector<int32_t>{0, 1, 4}));
  EXPECT_EQ(s.max_seqlen, 3);
  EXPECT_EQ(s.loss_mask, (std::vector<uint8_t>{0, 0, 0, 0}));

  // Without eos the padding is 0; without loss_mask there is no fifth field; a larger
  // max_segments repeats L.
  PackOptions o = options(Pack::kDocument, 4);
  o.eos.reset();
  o.loss_mask = false;
  o.max_segments = 4;
  const PackedTokenSource plain(documents(docs), o);
  ASSERT_EQ(plain.fields().size(), 5u);
  const auto b = read_bytes(plain, 0, 0, 2);
  EXPECT_EQ(as<int64_t>(b[0]), (std::vector<int64_t>{token(2, 4), 0, 0, 0}));
  EXPECT_EQ(as<int32_t>(b[3]), (std::vector<int32_t>{0, 1, 4, 4, 4}));
}

TEST(PackDocument, UnshuffledIsTheConcatenation) {
  const Docs docs = corpus_of(random_lengths(200, 32, 7));
  const PackedTokenSource src(documents(docs), options(Pack::kDocument, 32));
  std::vector<int64_t> all;
  for (uint64_t i = 0; i < src.size(); ++i) {
    const Sample s = read_sample(src, 5, 9, i);
    all.insert(all.end(), s.input.begin(), s.input.end());
  }
  std::vector<int64_t> expected = stream_of(docs, std::nullopt);
  expected.resize(src.size() * 32, kEos);
  EXPECT_EQ(all, expected);
  EXPECT_EQ(src.path(0), "doc-0");
}

TEST(PackDocument, ExactlyOnceAndInvariants) {
  for (uint32_t seed = 0; seed < 8; ++seed) {
    const uint64_t L = seed % 2 == 0 ? 16 : 7;
    const Docs docs = corpus_of(random_lengths(150, L, seed));
    for (bool shuffle : {false, true}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + (shuffle ? " shuffled" : ""));
      const PackedTokenSource src(documents(docs), options(Pack::kDocument, L, shuffle));
      const auto e0 = check_epoch(src, docs, 11, 0, !shuffle);
      const auto e1 = check_epoch(src, docs, 11, 1, !shuffle);
      ASSERT_EQ(e0.size(), e1.size());
      bool differ = false;
      for (size_t i = 0; i < e0.size(); ++i) differ |= !same(e0[i], e1[i]);
      EXPECT_EQ(differ, shuffle);
      // The same key, the same bytes, from another source too.
      const PackedTokenSource again(documents(docs), options(Pack::kDocument, L, shuffle));
      for (uint64_t i = 0; i < src.size(); i += 3)
        EXPECT_EQ(read_bytes(src, 11, 1, i), read_bytes(again, 11, 1, i));
    }
  }
}

TEST(PackDocument, ShuffledBoundHoldsForTinyDocuments) {
  // Many length-1 documents: every window of a shuffled epoch may be all of them.
  std::vector<uint64_t> lengths(60, 1);
  lengths[10] = 40;
  lengths[20] = 3;
  const Docs docs = corpus_of(lengths);
  const PackedTokenSource src(documents(docs), options(Pack::kDocument, 8, true));
  EXPECT_EQ(src.max_segments(), 8u);
  for (uint64_t epoch = 0; epoch < 4; ++epoch) check_epoch(src, docs, 2, epoch, false);
}

// ---------------------------------------------------------------------------------------------
// kBestFit

TEST(PackBestFit, BinsExactly) {
  // Lengths 3, 1, 2, 2, 9 with L = 4: document 4 is two chunks of 4 and a remainder of 1.
  // Decreasing: 3 -> bin A (1 left); 2 -> bin B (2 left); 2 -> B (full); 1 (doc 1) -> A (full);
  // 1 (doc 4's tail) -> bin C (3 left). Chunk bins come first.
  const Docs docs = corpus_of({3, 1, 2, 2, 9});
  const PackedTokenSource src(documents(docs), options(Pack::kBestFit, 4));
  ASSERT_EQ(src.size(), 5u);
  EXPECT_EQ(src.padded_tokens(), 3u);
  EXPECT_EQ(src.num_pieces(), 7u);
  EXPECT_EQ(src.max_segments(), 2u);
  Sample s = read_sample(src, 0, 0, 0);
  EXPECT_EQ(s.input, (std::vector<int64_t>{token(4, 0), token(4, 1), token(4, 2), token(4, 3)}));
  EXPECT_EQ(s.labels, (std::vector<int64_t>{token(4, 1), token(4, 2), token(4, 3), token(4, 4)}));
  EXPECT_EQ(s.cu_seqlens, (std::vector<int32_t>{0, 4, 4}));
  s = read_sample(src, 0, 0, 1);
  EXPECT_EQ(s.labels.back(), token(4, 8));
  s = read_sample(src, 0, 0, 2);
  EXPECT_EQ(s.input, (std::vector<int64_t>{token(0, 0), token(0, 1), token(0, 2), token(1, 0)}));
  EXPECT_EQ(s.labels, (std::vector<int64_t>{token(0, 1), token(0, 2), -100, -100}));
  EXPECT_EQ(s.positions, (std::vector<int64_t>{0, 1, 2, 0}));
  EXPECT_EQ(s.cu_seqlens, (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(s.max_seqlen, 3);
  s = read_sample(src, 0, 0, 3);
  EXPECT_EQ(s.input, (std::vector<int64_t>{token(2, 0), token(2, 1), token(3, 0), token(3, 1)}));
  EXPECT_EQ(s.cu_seqlens, (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(s.max_seqlen, 2);
  s = read_sample(src, 0, 0, 4);
  EXPECT_EQ(s.input, (std::vector<int64_t>{token(4, 8), kEos, kEos, kEos}));
  EXPECT_EQ(s.labels, (std::vector<int64_t>{-100, -100, -100, -100}));
  EXPECT_EQ(s.cu_seqlens, (std::vector<int32_t>{0, 1, 4}));
  EXPECT_EQ(s.max_seqlen, 3);
  EXPECT_EQ(src.path(0), "doc-4");
  EXPECT_EQ(src.path(3), "doc-2");
}

// Padding of first-fit in corpus order over the same pieces (chunks of L, remainders).
uint64_t first_fit_padding(const std::vector<uint64_t>& lengths, uint64_t L) {
  std::vector<uint64_t> left;  // per bin
  uint64_t chunks = 0, tokens = 0;
  for (uint64_t n : lengths) {
    tokens += n;
    chunks += n / L;
    const uint64_t r = n % L;
    if (r == 0) continue;
    auto it = std::find_if(left.begin(), left.end(), [&](uint64_t c) { return c >= r; });
    if (it == left.end())
      left.push_back(L - r);
    else
      *it -= r;
  }
  return (chunks + left.size()) * L - tokens;
}

// Bins of best-fit decreasing, by brute force (which of equal bins takes a piece does not change
// the count: bins with equal room are interchangeable).
uint64_t best_fit_bins(const std::vector<uint64_t>& lengths, uint64_t L) {
  std::vector<uint64_t> pieces, left;
  uint64_t chunks = 0;
  for (uint64_t n : lengths) {
    chunks += n / L;
    if (n % L != 0) pieces.push_back(n % L);
  }
  std::sort(pieces.rbegin(), pieces.rend());
  for (uint64_t r : pieces) {
    auto best = left.end();
    for (auto it = left.begin(); it != left.end(); ++it)
      if (*it >= r && (best == left.end() || *it < *best)) best = it;
    if (best == left.end())
      left.push_back(L - r);
    else
      *best -= r;
  }
  return chunks + left.size();
}

TEST(PackBestFit, ExactlyOnceAndInvariants) {
  for (uint32_t seed = 0; seed < 8; ++seed) {
    const uint64_t L = seed % 2 == 0 ? 32 : 9;
    const std::vector<uint64_t> lengths = random_lengths(200, L, seed + 100);
    const Docs docs = corpus_of(lengths);
    for (bool shuffle : {false, true}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + (shuffle ? " shuffled" : ""));
      const PackedTokenSource src(documents(docs), options(Pack::kBestFit, L, shuffle));
      EXPECT_EQ(src.size(), best_fit_bins(lengths, L));
      EXPECT_LE(src.padded_tokens(), first_fit_padding(lengths, L));
      // Pieces never cross; padding and size are the epoch's structure, the same each epoch
      // (check_epoch counts the padding of each epoch against padded_tokens()).
      const auto e0 = check_epoch(src, docs, 4, 0, true);
      const auto e1 = check_epoch(src, docs, 4, 1, true);
      ASSERT_EQ(e0.size(), e1.size());
      bool differ = false;
      for (size_t i = 0; i < e0.size(); ++i) {
        differ |= !same(e0[i], e1[i]);
        // The bins' structure is fixed: the same segment lengths in every epoch.
        EXPECT_EQ(e0[i].cu_seqlens, e1[i].cu_seqlens);
      }
      EXPECT_EQ(differ, shuffle);
      const PackedTokenSource again(documents(docs), options(Pack::kBestFit, L, shuffle));
      for (uint64_t i = 0; i < src.size(); i += 3)
        EXPECT_EQ(read_bytes(src, 4, 1, i), read_bytes(again, 4, 1, i));
    }
  }
}

TEST(PackBestFit, LongSequences) {
  // L beyond 64 * 64: the search for the tightest bin climbs three levels of its bitset.
  for (uint64_t L : {100u, 4500u}) {
    std::vector<uint64_t> lengths = random_lengths(80, L, static_cast<uint32_t>(L));
    for (uint64_t k = 1; k < 40; ++k) lengths.push_back(k * 97 % L + 1);
    const Docs docs = corpus_of(lengths);
    const PackedTokenSource src(documents(docs), options(Pack::kBestFit, L, true));
    EXPECT_EQ(src.size(), best_fit_bins(lengths, L));
    EXPECT_LE(src.padded_tokens(), first_fit_padding(lengths, L));
    check_epoch(src, docs, 1, 3, true);
  }
}

TEST(PackBestFit, PacksTightly) {
  // Lengths that pair up exactly (k and L - k): best-fit decreasing pads nothing.
  std::vector<uint64_t> lengths;
  std::mt19937_64 rng(3);
  for (int i = 0; i < 300; ++i) {
    const uint64_t k = 1 + rng() % 63;
    lengths.push_back(k);
    lengths.push_back(64 - k);
  }
  std::shuffle(lengths.begin(), lengths.end(), rng);
  const PackedTokenSource src(documents(corpus_of(lengths)), options(Pack::kBestFit, 64, true));
  EXPECT_EQ(src.size(), 300u);
  EXPECT_EQ(src.padded_tokens(), 0u);
  EXPECT_EQ(src.padding_fraction(), 0.0);
  EXPECT_GT(first_fit_padding(lengths, 64), 0u);
}

// ---------------------------------------------------------------------------------------------
// All modes

// A conversation's prompt tokens (flag 0) are not trained on: a label whose token is one is
// label_ignore, in every packing and in DocumentSource; concat packing refuses such a corpus.
TEST(PackTrained, LabelsOfUntrainedTokensAreIgnored) {
  const Docs docs = {{10, 11, 12, 13, 14}, {20, 21, 22}, {30, 31, 32, 33, 34, 35, 36}};
  const std::vector<std::vector<uint8_t>> trained = {
      {0, 0, 1, 1, 1}, {1, 0, 1}, {0, 1, 1, 0, 0, 1, 1}};
  const auto set = std::make_shared<VectorDocuments>(docs, std::set<uint64_t>{}, trained);
  // The labels each document's tokens get: next token where it is trained on.
  std::map<int64_t, int64_t> label_of;
  for (size_t d = 0; d < docs.size(); ++d)
    for (size_t t = 0; t < docs[d].size(); ++t)
      label_of[docs[d][t]] = t + 1 < docs[d].size() && trained[d][t + 1] ? docs[d][t + 1] : -100;
  for (const Pack mode : {Pack::kDocument, Pack::kBestFit}) {
    PackedTokenSource src(set, options(mode, 8));
    uint64_t seen = 0;
    for (uint64_t i = 0; i < src.size(); ++i) {
      const Sample s = read_sample(src, 0, 0, i);
      for (size_t t = 0; t < s.input.size(); ++t) {
        const auto it = label_of.find(s.input[t]);
        if (it == label_of.end()) continue;  // padding (kEos)
        ++seen;
        const bool cut = t + 1 < s.input.size() && s.positions[t + 1] == 0;
        if (t + 1 == s.input.size() || cut) continue;  // a piece's end: checked by position
        EXPECT_EQ(s.labels[t], it->second) << "token " << s.input[t];
        EXPECT_EQ(s.loss_mask[t], it->second != -100 ? 1 : 0) << "token " << s.input[t];
      }
    }
    EXPECT_EQ(seen, 15u);
  }
  PackOptions concat = options(Pack::kConcat, 4);
  concat.loss_mask = false;
  EXPECT_THROW(PackedTokenSource(set, concat), InvalidArgument);
  DocumentSource rows(set);
  for (uint64_t d = 0; d < docs.size(); ++d) {
    std::vector<int64_t> ids(docs[d].size()), labels(docs[d].size());
    std::byte* slots[2] = {reinterpret_cast<std::byte*>(ids.data()),
                           reinterpret_cast<std::byte*>(labels.data())};
    rows.read({0, 0, d}, slots, nullptr);
    for (size_t t = 0; t < ids.size(); ++t) EXPECT_EQ(labels[t], label_of[ids[t]]);
  }
}

TEST(PackErrors, SayWhatIsNeeded) {
  auto docs = documents(corpus_of({3, 4}));
  PackOptions o;
  o.seq_len = 0;
  EXPECT_NE(error_of(docs, o).find("seq_len must be a positive integer"), std::string::npos);
  o.seq_len = 7;
  EXPECT_NE(error_of(docs, o).find("seq_len 7 needs at least 8"), std::string::npos);
  o.eos = 0;  // 3 + 1 + 4 = 8 stream tokens: one window
  EXPECT_EQ(error_of(docs, o), "");
  o.seq_len = 8;
  EXPECT_NE(error_of(docs, o).find("has 8 tokens"), std::string::npos);
  o.seq_len = 2;
  o.shuffle_documents = true;
  EXPECT_NE(error_of(docs, o).find("shuffle_documents must be false"), std::string::npos);
  for (Pack mode : {Pack::kConcat, Pack::kDocument, Pack::kBestFit}) {
    EXPECT_NE(error_of(documents({}), options(mode, 4)).find("no tokens"), std::string::npos);
    EXPECT_NE(error_of(documents({{}, {}}), options(mode, 4)).find("no tokens"), std::string::npos);
  }
  EXPECT_THROW(PackedTokenSource(nullptr, options(Pack::kDocument, 4)), InvalidArgument);
  PackOptions big = options(Pack::kDocument, uint64_t{1} << 31);
  EXPECT_NE(error_of(docs, big).find("int32"), std::string::npos);
}

TEST(PackErrors, MaxSegmentsTooSmall) {
  const auto docs = documents(corpus_of({1, 1, 1, 1, 1, 1, 20}));
  for (Pack mode : {Pack::kDocument, Pack::kBestFit}) {
    for (bool shuffle : {false, true}) {
      PackOptions o = options(mode, 8, shuffle);
      const uint64_t needed = PackedTokenSource(docs, o).max_segments();
      o.max_segments = needed;
      EXPECT_EQ(PackedTokenSource(docs, o).max_segments(), needed);
      o.max_segments = needed - 1;
      EXPECT_NE(error_of(docs, o).find("pass max_segments >= " + std::to_string(needed)),
                std::string::npos);
    }
  }
  // Unshuffled document windows: [1 1 1 1 1 1 x x] holds 7. Best-fit: the 4-token tail of the
  // 20, then four 1s fill its bin (5 pieces); the last two 1s share a bin with padding (3).
  EXPECT_EQ(PackedTokenSource(docs, options(Pack::kDocument, 8)).max_segments(), 7u);
  EXPECT_EQ(PackedTokenSource(docs, options(Pack::kBestFit, 8)).max_segments(), 5u);
  // Shuffled: eight length-1 documents can't be in one window, six can plus two cut pieces.
  EXPECT_EQ(PackedTokenSource(docs, options(Pack::kDocument, 8, true)).max_segments(), 8u);
}

TEST(PackErrors, DocumentErrorsPropagate) {
  const auto docs = std::make_shared<VectorDocuments>(corpus_of({5, 5, 5}), std::set<uint64_t>{1});
  PackOptions concat;
  concat.seq_len = 4;
  EXPECT_THROW(read_bytes(PackedTokenSource(docs, concat), 0, 0, 1), IoError);
  EXPECT_NO_THROW(read_bytes(PackedTokenSource(docs, concat), 0, 0, 0));
  EXPECT_THROW(read_bytes(PackedTokenSource(docs, options(Pack::kDocument, 4)), 0, 0, 1), IoError);
  EXPECT_THROW(read_bytes(PackedTokenSource(docs, options(Pack::kBestFit, 4)), 0, 0, 1), IoError);
}

TEST(PackThreads, AnyThreadsAnyOrderSameBytes) {
  const Docs docs = corpus_of(random_lengths(400, 24, 42));
  for (Pack mode : {Pack::kConcat, Pack::kDocument, Pack::kBestFit}) {
    PackOptions o = options(mode, 24, mode != Pack::kConcat);
    if (mode == Pack::kConcat) o.loss_mask = false;
    const PackedTokenSource src(documents(docs), o);
    // Five epochs at once, more than the epoch cache keeps: entries are evicted and rebuilt
    // while other threads read them.
    constexpr uint64_t kEpochs = 5;
    std::vector<std::pair<uint64_t, uint64_t>> work;
    for (uint64_t e = 0; e < kEpochs; ++e)
      for (uint64_t i = 0; i < src.size(); ++i) work.emplace_back(e, i);
    std::vector<std::vector<std::vector<std::byte>>> serial(work.size()), parallel(work.size());
    for (size_t w = 0; w < work.size(); ++w)
      serial[w] = read_bytes(src, 8, work[w].first, work[w].second);
    std::vector<size_t> order(work.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(1));
    std::vector<std::thread> threads;
    for (size_t t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (size_t k = t; k < order.size(); k += 4) {
          const size_t w = order[k];
          parallel[w] = read_bytes(src, 8, work[w].first, work[w].second);
        }
      });
    for (auto& t : threads) t.join();
    for (size_t w = 0; w < work.size(); ++w)
      ASSERT_EQ(serial[w], parallel[w])
          << "epoch " << work[w].first << " sample " << work[w].second;
  }
}

}  // namespace
}  // namespace stoker
