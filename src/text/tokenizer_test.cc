#include "stoker/text/tokenizer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include "stoker/errors.h"

namespace stoker::text {
namespace {

using Ids = std::vector<int32_t>;

// Byte-level BPE, GPT-2 style: Ġ is the space byte.
const char* kByteLevel = R"({
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 10, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": true},
  "post_processor": {"type": "TemplateProcessing",
    "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
    "pair": [], "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [10], "tokens": ["<|endoftext|>"]}}},
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": {"h": 0, "i": 1, "\u0120": 2, "y": 3, "o": 4, "u": 5, "hi": 6, "\u0120y": 7,
                      "\u0120you": 8, "ou": 9},
            "merges": [["h", "i"], ["\u0120", "y"], ["o", "u"], ["\u0120y", "ou"]]}
})";

TEST(TokenizerTest, ByteLevelBpeWithASpecialToken) {
  Tokenizer t = Tokenizer::from_json(kByteLevel);
  EXPECT_EQ(t.encode("hi you"), (Ids{6, 8}));
  EXPECT_EQ(t.encode("hi<|endoftext|>hi"), (Ids{6, 10, 6}));
  EXPECT_EQ(t.encode("hi you", true), (Ids{6, 8, 10}));
  EXPECT_EQ(t.decode({6, 8, 10}), "hi you<|endoftext|>");
  EXPECT_EQ(t.decode({6, 8, 10}, true), "hi you");
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 10);
  EXPECT_EQ(t.id_to_token(8), "\xC4\xA0you");
  EXPECT_EQ(t.vocab_size(), 11u);
}

// SentencePiece-style BPE (Llama 2): Metaspace, byte fallback.
std::string sentencepiece_json() {
  std::string vocab = R"("<unk>": 0, "<s>": 1, "</s>": 2)";
  for (int b = 0; b < 256; ++b) {
    char entry[32];
    std::snprintf(entry, sizeof entry, ", \"<0x%02X>\": %d", b, 3 + b);
    vocab += entry;
  }
  vocab += R"(, "\u2581": 259, "a": 260, "b": 261, "\u2581a": 262, "\u2581ab": 263)";
  return std::string(R"({"added_tokens": [
      {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
      {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                    {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "pre_tokenizer": null,
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
        {"Sequence": {"id": "A", "type_id": 0}}], "pair": [],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": true,
              "vocab": {)") + vocab + R"(}, "merges": ["\u2581 a", "\u2581a b"]}})";
}

TEST(TokenizerTest, SentencePieceBpeFallsBackToBytes) {
  Tokenizer t = Tokenizer::from_json(sentencepiece_json());
  EXPECT_EQ(t.encode("ab a\xC3\xA9"), (Ids{263, 262, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(t.encode("ab", true), (Ids{1, 263}));
  EXPECT_EQ(t.decode({1, 263, 262, 3 + 0xC3, 3 + 0xA9}, true), "ab a\xC3\xA9");
}

// Offsets are `tokenizers`' Encoding.offsets, in bytes: the values below are its (characters,
// converted) for the same files.
using Spans = std::vector<TokenSpan>;

TEST(TokenizerOffsetsTest, ByteLevelTokensCoverTheirBytesAndSpecialTokensNone) {
  Tokenizer t = Tokenizer::from_json(kByteLevel);
  Encoding e = t.encode_with_offsets("hi you", true);
  EXPECT_EQ(e.ids, (Ids{6, 8, 10}));
  EXPECT_EQ(e.offsets, (Spans{{0, 2}, {2, 6}, {0, 0}}));
  e = t.encode_with_offsets("hi<|endoftext|>hi");
  EXPECT_EQ(e.ids, (Ids{6, 10, 6}));
  EXPECT_EQ(e.offsets, (Spans{{0, 2}, {2, 15}, {15, 17}}));
  EXPECT_TRUE(t.encode_with_offsets("").ids.empty());
}

TEST(TokenizerOffsetsTest, NormalizersAndByteFallbackKeepTheOriginalCharacter) {
  Tokenizer t = Tokenizer::from_json(sentencepiece_json());
  // Prepend's and Replace's ▁ take the character they stand before or for; the two byte-fallback
  // tokens of é share its bytes; <s> covers nothing.
  Encoding e = t.encode_with_offsets("ab a\xC3\xA9", true);
  EXPECT_EQ(e.ids, (Ids{1, 263, 262, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(e.offsets, (Spans{{0, 0}, {0, 2}, {2, 4}, {4, 6}, {4, 6}}));

  auto with_normalizer = [](const std::string& normalizer) {
    std::string json = sentencepiece_json();
    const std::string from = json.substr(json.find("\"normalizer\""));
    json.replace(json.find("\"normalizer\""), from.find("\"pre_tokenizer\""),
                 "\"normalizer\": " + normalizer + ", ");
    return Tokenizer::from_json(json);
  };
  // NFC composes a + U+0301 into á, aligned to the a alone: the mark is no token's.
  e = with_normalizer(R"({"type": "NFC"})").encode_with_offsets(std::string("a\xCC\x81") + "b");
  EXPECT_EQ(e.ids, (Ids{3 + 0xC3, 3 + 0xA1, 261}));
  EXPECT_EQ(e.offsets, (Spans{{0, 1}, {0, 1}, {3, 4}}));
  // Lowercase makes İ two characters (i and U+0307), both İ's.
  e = with_normalizer(R"({"type": "Lowercase"})")
          .encode_with_offsets(std::string("\xC4\xB0") + "b");
  EXPECT_EQ(e.ids, (Ids{3 + 'i', 3 + 0xCC, 3 + 0x87, 261}));
  EXPECT_EQ(e.offsets, (Spans{{0, 2}, {0, 2}, {0, 2}, {2, 3}}));
}

TEST(TokenizerOffsetsTest, ByteOffsetsBecomeCharacterOffsets) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";  // a é € 😀
  Spans offsets{{0, 1}, {1, 3}, {3, 6}, {6, 10}, {0, 0}, {1, 10}};
  Tokenizer::to_char_offsets(text, offsets);
  EXPECT_EQ(offsets, (Spans{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {0, 0}, {1, 4}}));
}

TEST(TokenizerOffsetsTest, EncodeBatchWithOffsetsEqualsEachEncode) {
  Tokenizer t = Tokenizer::from_json(kByteLevel);
  const std::vector<std::string> texts{"hi you", "you hi", "", "hi<|endoftext|>"};
  const auto batch = t.encode_batch_with_offsets(texts, true, 3);
  ASSERT_EQ(batch.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const Encoding one = t.encode_with_offsets(texts[i], true);
    EXPECT_EQ(batch[i].ids, one.ids);
    EXPECT_EQ(batch[i].offsets, one.offsets);
    EXPECT_EQ(one.ids, t.encode(texts[i], true));
  }
  EXPECT_THROW(t.encode_with_offsets("\xFF"), DecodeError);
}

const char* kWordPiece = R"({
  "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                 "strip_accents": null, "lowercase": true},
  "pre_tokenizer": {"type": "BertPreTokenizer"},
  "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]},
  "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
  "added_tokens": [{"id": 2, "content": "[CLS]", "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": true},
                   {"id": 3, "content": "[SEP]", "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": true}],
  "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100,
            "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "un": 5,
                      "##aff": 6, "##able": 7, "!": 8, "cafe": 9}}
})";

TEST(TokenizerTest, WordPieceWithBertNormalizer) {
  Tokenizer t = Tokenizer::from_json(kWordPiece);
  EXPECT_EQ(t.encode("Hello, UNAFFABLE! Caf\xC3\xA9"), (Ids{4, 1, 5, 6, 7, 8, 9}));
  EXPECT_EQ(t.encode("hello", true), (Ids{2, 4, 3}));
  EXPECT_EQ(t.decode({2, 5, 6, 7, 8, 3}, true), "unaffable!");
}

const char* kUnigram = R"({
  "normalizer": null,
  "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": true},
  "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": true},
  "model": {"type": "Unigram", "unk_id": 0, "byte_fallback": false,
            "vocab": [["<unk>", 0.0], ["\u2581", -2.0], ["\u2581ab", -1.0], ["a", -1.5], ["b", -1.5],
                      ["c", -3.0], ["\u2581a", -1.2]]}
})";

TEST(TokenizerTest, UnigramWithMetaspace) {
  Tokenizer t = Tokenizer::from_json(kUnigram);
  EXPECT_EQ(t.encode("ab abc"), (Ids{2, 2, 5}));
  EXPECT_EQ(t.decode({2, 2, 5}), "ab abc");
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  auto at = s.find(from);
  EXPECT_NE(at, std::string::npos);
  return s.replace(at, from.size(), to);
}

// fuzz_tokenizer: a Unigram without unk_id loads, and a character outside its vocabulary is an
// InvalidArgument naming the file (tokenizers fails too), from encode and encode_with_offsets
// alike.
TEST(TokenizerTest, UnigramWithoutUnkIdRefusesAnUnknownCharacter) {
  Tokenizer t =
      Tokenizer::from_json(replace(kUnigram, "\"unk_id\": 0, ", ""), "no-unk/tokenizer.json");
  EXPECT_EQ(t.encode("ab abc"), (Ids{2, 2, 5}));
  for (const bool offsets : {false, true}) {
    try {
      if (offsets) {
        t.encode_with_offsets("ab z");
      } else {
        t.encode("ab z");
      }
      ADD_FAILURE() << "no error";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("no-unk/tokenizer.json"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find("no unk_id"), std::string::npos);
    }
  }
}

TEST(TokenizerTest, UnsupportedComponentsAreNamed) {
  auto message = [](const std::string& json) -> std::string {
    try {
      Tokenizer::from_json(json, "my/tokenizer.json");
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  };
  std::string m = message(replace(kUnigram, R"({"type": "Metaspace", "replacement")",
                                   R"({"type": "UnicodeScripts", "replacement")"));
  EXPECT_NE(m.find("my/tokenizer.json"), std::string::npos) << m;
  EXPECT_NE(m.find("pre-tokenizer UnicodeScripts"), std::string::npos) << m;
  m = message(replace(kWordPiece, "\"type\": \"WordPiece\", \"prefix\"", "\"type\": \"CTC\", \"prefix\""));
  EXPECT_NE(m.find("decoder CTC"), std::string::npos) << m;
  m = message(replace(kWordPiece, "\"type\": \"BertNormalizer\"", "\"type\": \"Precompiled\""));
  EXPECT_NE(m.find("normalizer Precompiled"), std::string::npos) << m;
  m = message(replace(kByteLevel, "\"dropout\": null", "\"dropout\": 0.1"));
  EXPECT_NE(m.find("dropout"), std::string::npos) << m;
  m = message(replace(kByteLevel, "\"truncation\": null", "\"truncation\": {\"max_length\": 8}"));
  EXPECT_NE(m.find("truncation"), std::string::npos) << m;
  m = message(replace(kWordPiece, "\"type\": \"BertProcessing\"", "\"type\": \"Something\""));
  EXPECT_NE(m.find("post-processor Something"), std::string::npos) << m;
  EXPECT_THROW(Tokenizer::from_json("{not json"), InvalidArgument);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), IoError);
}

TEST(TokenizerTest, AddedTokenIdsAreTheOnesTokenizersAssigns) {
  // A file whose added token's id disagrees with the vocabulary: `tokenizers` numbers it after the
  // model's tokens (and only warns), so this does too.
  std::string json = replace(kByteLevel, R"("id": 10, "content": "<|endoftext|>")",
                             R"("id": 3, "content": "<|endoftext|>")");
  Tokenizer t = Tokenizer::from_json(json);
  EXPECT_EQ(t.token_to_id("<|endoftext|>"), 10);
  EXPECT_EQ(t.encode("hi<|endoftext|>"), (Ids{6, 10}));
}

TEST(TokenizerTest, InvalidUtf8IsADecodeError) {
  Tokenizer t = Tokenizer::from_json(kByteLevel);
  EXPECT_THROW(t.encode("hi\xFF"), DecodeError);
}

TEST(TokenizerTest, ManyThreadsGetTheIdsOneThreadGets) {
  Tokenizer t = Tokenizer::from_json(sentencepiece_json());
  std::vector<std::string> texts;
  for (int i = 0; i < 200; ++i) {
    texts.push_back(std::string(i % 7, 'a') + " b" + std::string(i % 5, 'b') + " \xC3\xA9");
  }
  std::vector<Ids> one;
  for (const auto& text : texts) one.push_back(t.encode(text));
  EXPECT_EQ(t.encode_batch(texts, false, 4), one);
  EXPECT_TRUE(t.encode_batch({}, false, 4).empty());
  std::vector<std::vector<Ids>> seen(4);
  {
    std::vector<std::jthread> threads;
    for (int w = 0; w < 4; ++w) {
      threads.emplace_back([&, w] {
        for (const auto& text : texts) seen[w].push_back(t.encode(text));
      });
    }
  }
  for (const auto& s : seen) EXPECT_EQ(s, one);
  texts[100] = "\xFF";  // the failure reaches the caller, typed
  EXPECT_THROW(t.encode_batch(texts, false, 4), DecodeError);
}

// SentencePiece .model files: a ModelProto written here by hand (protobuf's wire format), loaded
// by the sentencepiece library itself. The Python tests compare trained models with the library.
std::string varint(uint64_t v) {
  std::string out;
  for (; v >= 0x80; v >>= 7) out += static_cast<char>((v & 0x7F) | 0x80);
  out += static_cast<char>(v);
  return out;
}
std::string field(int number, std::string_view bytes) {  // length-delimited
  return varint(static_cast<uint64_t>(number) << 3 | 2) + varint(bytes.size()) + std::string(bytes);
}
std::string field(int number, uint64_t value) {  // a varint
  return varint(static_cast<uint64_t>(number) << 3) + varint(value);
}
std::string piece(std::string_view text, float score, int type) {  // NORMAL 1, UNKNOWN 2, CONTROL 3
  std::string f = varint(2 << 3 | 5);  // score: a fixed32 float, little-endian
  uint32_t bits;
  std::memcpy(&bits, &score, 4);
  for (int i = 0; i < 4; ++i) f += static_cast<char>(bits >> (8 * i) & 0xFF);
  return field(1, field(1, text) + f + field(3, static_cast<uint64_t>(type)));
}
// A Unigram model: <unk> <s> </s> ▁ a b ▁ab; no normalization table ("identity").
std::string unigram_model() {
  return piece("<unk>", 0, 2) + piece("<s>", 0, 3) + piece("</s>", 0, 3) +
         piece("\xE2\x96\x81", -1, 1) + piece("a", -2, 1) + piece("b", -2, 1) +
         piece("\xE2\x96\x81" "ab", -1, 1) + field(2, field(3, uint64_t{1})) +
         field(3, field(1, std::string_view("identity")));
}

// Removes a test's folders under the temp dir when the test ends: make test holds every lane's
// temp dir to being left empty. Each test has folders of its own (ctest runs tests side by side).
struct RemovedAtEnd {
  std::vector<std::string> names;
  ~RemovedAtEnd() {
    for (const auto& n : names) std::filesystem::remove_all(::testing::TempDir() + n);
  }
};

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = ::testing::TempDir() + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(TokenizerTest, SentencePieceModelGoesThroughTheLibrary) {
  if (!Tokenizer::sentencepiece_supported()) GTEST_SKIP() << "built without sentencepiece";
  const RemovedAtEnd cleanup{{"stoker_sp", "stoker_sp_dir"}};
  const std::string path = write_file("stoker_sp/unigram.model", unigram_model());
  Tokenizer t = Tokenizer::from_file(path);
  EXPECT_EQ(t.encode("ab ba"), (Ids{6, 3, 5, 4}));
  EXPECT_EQ(t.encode("ab", true), (Ids{1, 6, 2}));  // the model's bos_id and eos_id
  EXPECT_EQ(t.encode("c"), (Ids{3, 0}));
  EXPECT_EQ(t.decode({1, 6, 3, 5, 4, 2}), "ab ba");
  EXPECT_EQ(t.decode({6, 99, -1}), "ab");  // out of range: skipped
  EXPECT_EQ(t.decode({6, 0}, true), "ab");
  EXPECT_EQ(t.vocab_size(), 7u);
  EXPECT_EQ(t.token_to_id("\xE2\x96\x81" "ab"), 6);
  EXPECT_EQ(t.token_to_id("zz"), std::nullopt);  // the library would say unk_id
  EXPECT_EQ(t.id_to_token(4), "a");
  EXPECT_EQ(t.id_to_token(7), std::nullopt);
  EXPECT_THROW(t.encode("a\xFF"), DecodeError);
  // Read by content too, and as a directory's tokenizer.model.
  EXPECT_EQ(Tokenizer::from_file(write_file("stoker_sp/model.bin", unigram_model())).encode("ab"),
            (Ids{6}));
  write_file("stoker_sp_dir/tokenizer.model", unigram_model());
  EXPECT_EQ(Tokenizer::from_file(::testing::TempDir() + "stoker_sp_dir").encode("ab"), (Ids{6}));
  std::vector<std::string> texts;
  std::vector<Ids> one;
  for (int i = 0; i < 200; ++i) {
    texts.push_back(std::string(i % 7, 'a') + " b" + std::string(i % 5, 'b') + " ab");
    one.push_back(t.encode(texts.back(), true));
  }
  EXPECT_EQ(t.encode_batch(texts, true, 4), one);
}

TEST(TokenizerTest, ABadSentencePieceModelIsNamed) {
  const RemovedAtEnd cleanup{{"stoker_sp_bad", "stoker_sp_empty"}};
  for (const auto& [name, bytes] :
       std::vector<std::pair<std::string, std::string>>{
           {"stoker_sp_bad/bad.model", "this is not a SentencePiece model\n"},
           {"stoker_sp_bad/empty.model", ""},
           {"stoker_sp_bad/bad.bin", "\x0A\x05<unk>\xFF\xFF"}}) {  // a ModelProto's start, then junk
    const std::string path = write_file(name, bytes);
    try {
      Tokenizer::from_file(path);
      ADD_FAILURE() << path << " loaded";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
  std::filesystem::create_directories(::testing::TempDir() + "stoker_sp_empty");
  EXPECT_THROW(Tokenizer::from_file(::testing::TempDir() + "stoker_sp_empty"), IoError);
}

// A tiktoken file: the 256 bytes (rank = byte), then "ab", " a", " ab"; merges by rank.
std::string tiktoken_file() {
  static const char* kBase64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (int b = 0; b < 256; ++b) {
    out += kBase64[b >> 2];
    out += kBase64[(b & 3) << 4];
    out += "== " + std::to_string(b) + "\n";
  }
  return out + "YWI= 256\nIGE= 257\nIGFi 258\n";
}

TEST(TokenizerTest, TiktokenFileMergesByRank) {
  const RemovedAtEnd cleanup{{"stoker_tiktoken"}};
  // Named after r50k_base: its pattern, and <|endoftext|> as 50256.
  Tokenizer t =
      Tokenizer::from_file(write_file("stoker_tiktoken/r50k_base.tiktoken", tiktoken_file()));
  EXPECT_EQ(t.encode("ab<|endoftext|> ab"), (Ids{256, 50256, 258}));
  // "ba" is no token: " ba" stays bytes.
  EXPECT_EQ(t.encode("abab ba"), (Ids{256, 256, ' ', 'b', 'a'}));
  EXPECT_EQ(t.decode({256, 50256, 258}), "ab<|endoftext|> ab");
  EXPECT_EQ(t.decode({256, 50256, 258}, true), "ab ab");
  EXPECT_EQ(t.vocab_size(), 260u);
  EXPECT_EQ(t.encode_with_offsets("ab<|endoftext|> ab").offsets,
            (std::vector<TokenSpan>{{0, 2}, {2, 15}, {15, 18}}));

  // Another name needs its pattern; special tokens as given.
  const std::string other = write_file("stoker_tiktoken/mine.bpe", tiktoken_file());
  EXPECT_THROW(Tokenizer::from_file(other), InvalidArgument);
  Tokenizer mine =
      Tokenizer::from_file(other, TiktokenOptions{R"( ?\p{L}+|\s+)", {{{"<x>", 300}}}});
  EXPECT_EQ(mine.encode("ab<x> ab"), (Ids{256, 300, 258}));
  EXPECT_THROW(Tokenizer::from_file(write_file("stoker_tiktoken/tokenizer.json", kByteLevel),
                                    TiktokenOptions{"\\w+", {}}),
               InvalidArgument);
}

}  // namespace
}  // namespace stoker::text
