#include "text/model.h"

#include <gtest/gtest.h>

#include "stoker/errors.h"
#include "text/unicode.h"

namespace stoker::text {
namespace {

Vocab vocab_of(std::vector<std::string> tokens) {
  Vocab v;
  for (size_t i = 0; i < tokens.size(); ++i) v.emplace(tokens[i], static_cast<int32_t>(i));
  return v;
}

TEST(BpeTest, MergesByRankLowestFirstThenLeftmost) {
  // a=0 b=1 c=2 ab=3 bc=4 abc=5; "b c" ranks before "a b", so "abc" is a + bc, then no merge
  // "a bc" exists: stays [a, bc].
  Bpe bpe(vocab_of({"a", "b", "c", "ab", "bc", "abc"}), {{"b", "c"}, {"a", "b"}}, {}, "t");
  std::vector<int32_t> ids{0, 1, 2};
  bpe.merge(ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 4}));
  // Equal pairs: the leftmost merges first ("aaa" -> aa + a).
  Bpe rep(vocab_of({"a", "aa"}), {{"a", "a"}}, {}, "t");
  std::vector<int32_t> three{0, 0, 0};
  rep.merge(three);
  EXPECT_EQ(three, (std::vector<int32_t>{1, 0}));
}

TEST(BpeTest, NewPairsFormedByAMergeAreMergedToo) {
  Bpe bpe(vocab_of({"h", "e", "l", "o", "he", "ll", "hell", "hello"}),
          {{"h", "e"}, {"l", "l"}, {"he", "ll"}, {"hell", "o"}}, {}, "t");
  std::vector<int32_t> out;
  bpe.encode("hello", out);
  EXPECT_EQ(out, (std::vector<int32_t>{7}));
  out.clear();
  bpe.encode("hello", out);  // the thread's cache answers the second time, identically
  EXPECT_EQ(out, (std::vector<int32_t>{7}));
  out.clear();
  bpe.encode("lleh", out);
  EXPECT_EQ(out, (std::vector<int32_t>{5, 1, 0}));
}

TEST(BpeTest, SpansAreEachIdsBytesOfTheWord) {
  Bpe bpe(vocab_of({"h", "e", "l", "o", "he", "ll", "hell", "hello", "\xC3\xA9"}),
          {{"h", "e"}, {"l", "l"}, {"he", "ll"}}, {}, "t");
  for (int pass = 0; pass < 2; ++pass) {  // computed, then from the thread's cache
    std::vector<int32_t> ids;
    std::vector<TokenSpan> spans;
    bpe.encode("hello\xC3\xA9", ids, &spans);
    EXPECT_EQ(ids, (std::vector<int32_t>{6, 3, 8}));
    EXPECT_EQ(spans, (std::vector<TokenSpan>{{0, 4}, {4, 5}, {5, 7}}));
  }
}

TEST(BpeTest, RanksMergeAnyPairThatMakesAToken) {
  // tiktoken: "abc" (rank 5) from a + bc or ab + c alike; "bc" (3) before "ab" (4).
  Vocab v = vocab_of({"a", "b", "c", "bc", "ab", "abc"});
  auto bpe = Bpe::from_ranks(std::move(v), {}, "t");
  std::vector<int32_t> ids{0, 1, 2};
  bpe->merge(ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{5}));
  std::vector<int32_t> ab{0, 1};
  bpe->merge(ab);
  EXPECT_EQ(ab, (std::vector<int32_t>{4}));
}

TEST(BpeTest, ByteFallbackAndFusedUnknowns) {
  std::vector<std::string> tokens{"<unk>", "a"};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    tokens.push_back(name);
  }
  BpeOptions o;
  o.unk_token = "<unk>";
  o.byte_fallback = true;
  Bpe bpe(vocab_of(tokens), {}, o, "t");
  std::vector<int32_t> out;
  bpe.encode("a\xC3\xA9", out);  // é: its two bytes
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2 + 0xC3, 2 + 0xA9}));

  BpeOptions fuse;
  fuse.unk_token = "<unk>";
  fuse.fuse_unk = true;
  Bpe fused(vocab_of({"<unk>", "a"}), {}, fuse, "t");
  out.clear();
  fused.encode("xya", out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1}));
  fuse.fuse_unk = false;
  Bpe unfused(vocab_of({"<unk>", "a"}), {}, fuse, "t");
  out.clear();
  unfused.encode("xya", out);
  EXPECT_EQ(out, (std::vector<int32_t>{0, 0, 1}));
}

TEST(BpeTest, ALongWordCutWhereNoMergeCrossesGivesTheWholeWordsIds) {
  // A word over the cache's 128 bytes is cut between two tokens no token holds side by side
  // ("c" then "\u2581"); ignore_merges turns the cutting off, so that model is the reference.
  std::vector<std::string> tokens{"<unk>", "a", "b", "c", "ab", "bc", "abc", "\u2581", "\u2581a"};
  for (int b = 0; b < 256; ++b) {
    if (b == 0xBC) continue;  // \u00FC (C3 BC) falls back to no byte: unknown, and fused
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    tokens.push_back(name);
  }
  const std::vector<std::pair<std::string, std::string>> merges{
      {"b", "c"}, {"a", "b"}, {"ab", "c"}, {"\u2581", "a"}};
  BpeOptions o;
  o.unk_token = "<unk>";
  o.byte_fallback = true;
  o.fuse_unk = true;
  o.whole_texts = true;
  Bpe cut(vocab_of(tokens), merges, o, "t");
  o.ignore_merges = true;
  Bpe whole(vocab_of(tokens), merges, o, "t");
  const char* parts[] = {"a", "b", "c", "\u2581", "\u00E9", "\u00FC", "z", "ab", "\u2581a", "bc"};
  uint32_t seed = 7;
  std::string word;
  while (word.size() < 600) {
    seed = seed * 1103515245u + 12345u;
    word += parts[(seed >> 16) % 10];
  }
  for (int pass = 0; pass < 2; ++pass) {  // computed, then from the thread's cache
    std::vector<int32_t> ids, want;
    std::vector<TokenSpan> spans, want_spans;
    cut.encode(word, ids, &spans);
    whole.encode(word, want, &want_spans);
    EXPECT_EQ(ids, want);
    EXPECT_EQ(spans, want_spans);
    ids.clear();
    cut.encode(word, ids);
    EXPECT_EQ(ids, want);
  }
}

TEST(BpeTest, AMergeOutsideTheVocabularyIsRefused) {
  EXPECT_THROW(Bpe(vocab_of({"a", "b"}), {{"a", "b"}}, {}, "t"), InvalidArgument);
}

TEST(WordPieceTest, LongestPrefixThenContinuations) {
  WordPiece wp(vocab_of({"[UNK]", "un", "##aff", "##able", "unx"}), "[UNK]", "##", 100, "t");
  std::vector<int32_t> out;
  wp.encode("unaffable", out);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2, 3}));
  out.clear();
  wp.encode("unaffy", out);  // no split of "y": the whole word is unknown
  EXPECT_EQ(out, (std::vector<int32_t>{0}));
}

TEST(UnigramTest, ViterbiPicksTheBestScoringSplit) {
  Unigram u({{"<unk>", 0}, {"a", -1}, {"b", -1}, {"ab", -1.5}, {"abc", -5}, {"c", -2}}, 0, false,
            "t");
  std::vector<int32_t> out;
  u.encode("abc", out);  // ab + c = -3.5 beats abc = -5 and a + b + c = -4
  EXPECT_EQ(out, (std::vector<int32_t>{3, 5}));
  out.clear();
  u.encode("xxa", out);  // unknowns fuse into one
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1}));
  out.clear();
  u.encode("xxa", out);  // the thread's cache answers the second time, identically
  EXPECT_EQ(out, (std::vector<int32_t>{0, 1}));
}

TEST(UnigramTest, TrieFindsEveryPieceAtAPositionAndTheFirstOfTwins) {
  PieceTrie trie({{"ab", 0}, {"a", 0}, {"abc", 0}, {"b", 0}, {"a", 0}});
  std::vector<int32_t> found;
  uint32_t node = PieceTrie::root();
  for (char c : std::string("abcd")) {
    const int64_t next = trie.child(node, static_cast<unsigned char>(c));
    if (next == PieceTrie::kNone) break;
    node = static_cast<uint32_t>(next);
    found.push_back(trie.piece(node));
  }
  EXPECT_EQ(found, (std::vector<int32_t>{1, 0, 2}));  // "a" is piece 1 (not its twin 4)
  EXPECT_EQ(trie.child(PieceTrie::root(), 'c'), PieceTrie::kNone);
}

TEST(ByteLevelTest, MapsEveryByteReversibly) {
  EXPECT_EQ(byte_to_unicode(' '), "\xC4\xA0");  // Ġ
  EXPECT_EQ(byte_to_unicode('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(byte_to_unicode('a'), "a");
  for (int b = 0; b < 256; ++b) {
    const std::string& s = byte_to_unicode(static_cast<uint8_t>(b));
    size_t i = 0;
    EXPECT_EQ(unicode_to_byte(next_code_point(s, i)), b);
  }
}

TEST(UnicodeTest, LossyReplacesMaximalInvalidSubparts) {
  EXPECT_EQ(utf8_lossy("a\xC3"), "a\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98" "b"), "\xEF\xBF\xBD" "b");
  EXPECT_EQ(utf8_lossy("\xFF\xFE"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_FALSE(valid_utf8("\xED\xA0\x80"));  // a surrogate
  EXPECT_EQ(lowercase("\xC3\x89T\xC4\xB0"), "\xC3\xA9ti\xCC\x87");
}

TEST(UnicodeTest, NormalizesTheNonAsciiPartsWithTheAsciiCharacterBefore) {
  EXPECT_EQ(normalize("plain ASCII\n", NormalForm::kNfkc), "plain ASCII\n");
  // e + U+0301 composes across the part's start; U+FB01 (fi) is a compatibility character.
  EXPECT_EQ(normalize("abe\xCC\x81x \xEF\xAC\x81!", NormalForm::kNfkc), "ab\xC3\xA9x fi!");
  EXPECT_EQ(normalize("\xC3\xA9" "e\xCC\x81", NormalForm::kNfd), "e\xCC\x81" "e\xCC\x81");
  EXPECT_EQ(normalize("A\xCC\x8A", NormalForm::kNfc), "\xC3\x85");
}

}  // namespace
}  // namespace stoker::text
