#include "stoker/text/text_corpus.h"

#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/test_temp_dir.h"
#include "stoker/errors.h"
#include "stoker/text/tokenizer.h"

namespace stoker::text {
namespace {

using Ids = std::vector<int64_t>;

// Byte-level BPE, GPT-2 style, with an end-of-text token.
const char* kTokenizer = R"({
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 10, "content": "<|endoftext|>", "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                    "use_regex": true},
  "post_processor": null,
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "vocab": {"h": 0, "i": 1, "\u0120": 2, "y": 3, "o": 4, "u": 5, "hi": 6, "\u0120y": 7,
                      "\u0120you": 8, "ou": 9},
            "merges": [["h", "i"], ["\u0120", "y"], ["o", "u"], ["\u0120y", "ou"]]}
})";

class TextCorpusTest : public ::testing::Test {
 protected:
  Tokenizer tokenizer = Tokenizer::from_json(kTokenizer);
  stoker::testing::TempDir dir;

  std::string write(const std::string& name, const std::string& content) {
    const std::string path = dir.dir() + "/" + name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  RowFormat text_format() const {
    RowFormat f;
    f.eos = 10;
    return f;
  }

  std::shared_ptr<TextCorpus> build(const std::vector<std::string>& paths, RowFormat f = {},
                                    int threads = 2, bool skip = false,
                                    const std::string& store = "") {
    TextCorpusBuilder b(tokenizer, std::move(f), store, skip, threads);
    for (const auto& p : paths) b.add_jsonl(p, std::filesystem::path(p).filename());
    return b.finish();
  }

  static Ids document(const TextCorpus& c, uint64_t d) {
    Ids out(c.document_length(d));
    c.read(d, 0, out.size(), out.data());
    return out;
  }
};

TEST_F(TextCorpusTest, EachRowIsADocumentInFileOrderNamedByItsLine) {
  const auto a = write("a.jsonl", "{\"text\": \"hi you\"}\n\n{\"text\": \"you\", \"id\": 3}\r\n");
  const auto b = write("b.jsonl", "{\"text\": \"hihi\"}");  // no final newline
  const auto c = build({a, b}, text_format());
  ASSERT_EQ(c->num_documents(), 3u);
  EXPECT_EQ(document(*c, 0), (Ids{6, 8, 10}));
  EXPECT_EQ(document(*c, 1), (Ids{3, 9, 10}));
  EXPECT_EQ(document(*c, 2), (Ids{6, 6, 10}));
  EXPECT_EQ(c->num_tokens(), 9u);
  EXPECT_EQ(c->path(0), "a.jsonl:1");
  EXPECT_EQ(c->path(1), "a.jsonl:3");  // the empty line 2 is not a row
  EXPECT_EQ(c->path(2), "b.jsonl:1");
  EXPECT_EQ(c->stats().rows, 3u);
  EXPECT_FALSE(c->has_untrained_tokens());
  EXPECT_EQ(c->last_token(1), 10);
}

TEST_F(TextCorpusTest, GzipAndZstdFilesReadAsThePlainOne) {
  std::string plain;
  for (int i = 0; i < 3000; ++i) plain += i % 2 ? "{\"text\": \"hi\"}\n" : "{\"text\": \"you hi\"}\n";
  const auto p = write("p.jsonl", plain);
  const std::string gz_path = dir.dir() + "/p.jsonl.gz";
  gzFile gz = gzopen(gz_path.c_str(), "wb");
  // two members: a concatenated gzip file is read through
  gzwrite(gz, plain.data(), static_cast<unsigned>(plain.size() / 2));
  gzclose(gz);
  gz = gzopen(gz_path.c_str(), "ab");
  gzwrite(gz, plain.data() + plain.size() / 2,
          static_cast<unsigned>(plain.size() - plain.size() / 2));
  gzclose(gz);
  std::string zst(ZSTD_compressBound(plain.size()), '\0');
  zst.resize(ZSTD_compress(zst.data(), zst.size(), plain.data(), plain.size(), 3));
  const auto z = write("p.jsonl.zst", zst);
  const auto want = build({p}, text_format());
  for (const auto& path : {gz_path, z}) {
    const auto got = build({path}, text_format());
    ASSERT_EQ(got->num_documents(), want->num_documents()) << path;
    for (uint64_t d = 0; d < want->num_documents(); ++d)
      ASSERT_EQ(document(*got, d), document(*want, d)) << path << " " << d;
  }
  // Cut short: an error naming the file, never a partial corpus.
  write("cut.jsonl.zst", zst.substr(0, zst.size() / 2));
  EXPECT_THROW(build({dir.dir() + "/cut.jsonl.zst"}, text_format()), DecodeError);
  write("bad.jsonl.gz", "\x1f\x8b\x08\x00garbage that is not deflate");
  try {
    build({dir.dir() + "/bad.jsonl.gz"}, text_format());
    FAIL() << "no error";
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl.gz"), std::string::npos) << e.what();
  }
}

TEST_F(TextCorpusTest, TheSameDocumentsWhateverTheThreads) {
  std::string lines;
  for (int i = 0; i < 20000; ++i)
    lines += "{\"text\": \"" + std::string(i % 7, 'h') + " you" + std::string(i % 3, 'i') + "\"}\n";
  const auto p = write("many.jsonl", lines);
  const auto one = build({p}, text_format(), 1);
  const auto four = build({p}, text_format(), 4);
  ASSERT_EQ(one->num_documents(), 20000u);
  ASSERT_EQ(four->num_tokens(), one->num_tokens());
  for (uint64_t d = 0; d < one->num_documents(); d += 97)
    ASSERT_EQ(document(*four, d), document(*one, d));
  EXPECT_EQ(four->path(19999), "many.jsonl:20000");
}

TEST_F(TextCorpusTest, ABadRowFailsNamingItsFileAndLineOrIsSkippedAndCounted) {
  std::string lines;
  for (int i = 1; i <= 12000; ++i) {
    if (i == 9001)
      lines += "{\"text\": \"hi\"\n";  // not JSON
    else if (i == 9500)
      lines += "{\"title\": \"hi\"}\n";  // no field
    else if (i == 11000)
      lines += "{\"text\": 5}\n";  // not a string
    else if (i == 11500)
      lines += "[1, 2]\n";  // not an object
    else if (i == 11900)
      lines += "{\"text\": \"h\xff\"}\n";  // not UTF-8
    else
      lines += "{\"text\": \"hi you\"}\n";
  }
  const auto p = write("rows.jsonl", lines);
  for (int threads : {1, 3}) {
    try {
      build({p}, text_format(), threads);
      FAIL() << "no error";
    } catch (const SampleError& e) {
      EXPECT_EQ(e.path(), "rows.jsonl:9001");
      EXPECT_EQ(e.index(), 9000u);
      EXPECT_NE(std::string(e.what()).find("not a JSON line"), std::string::npos) << e.what();
    }
  }
  const auto c = build({p}, text_format(), 2, /*skip=*/true);
  EXPECT_EQ(c->num_documents(), 12000u - 5);
  EXPECT_EQ(c->stats().skipped, 5u);
  EXPECT_EQ(c->stats().rows, 12000u);
  const auto& why = c->stats().skipped_reasons;
  ASSERT_EQ(why.size(), 5u);
  EXPECT_NE(why[0].find("rows.jsonl:9001: not a JSON line"), std::string::npos) << why[0];
  EXPECT_NE(why[1].find("rows.jsonl:9500: no field \"text\" (fields: title)"), std::string::npos)
      << why[1];
  EXPECT_NE(why[2].find("rows.jsonl:11000: the field \"text\" is a number, not a string"),
            std::string::npos)
      << why[2];
  EXPECT_NE(why[3].find("rows.jsonl:11500: the line is not a JSON object"), std::string::npos)
      << why[3];
  EXPECT_NE(why[4].find("rows.jsonl:11900"), std::string::npos) << why[4];
  EXPECT_EQ(c->path(9000), "rows.jsonl:9002");  // the documents after a skipped row keep their lines
}

TEST_F(TextCorpusTest, AStoreOpensAgainAsTheCorpusItWas) {
  const auto p = write("a.jsonl", "{\"text\": \"hi you\"}\n{\"text\": \"you\"}\n");
  RowFormat f = text_format();
  f.max_length = 2;
  const std::string store = dir.dir() + "/store";
  const auto built = build({p}, f, 2, false, store);
  EXPECT_EQ(built->stats().truncated, 2u);
  const auto opened = TextCorpus::open(store);
  ASSERT_EQ(opened->num_documents(), 2u);
  EXPECT_EQ(document(*opened, 0), (Ids{6, 8}));
  EXPECT_EQ(document(*opened, 1), (Ids{3, 9}));
  EXPECT_EQ(opened->path(1), "a.jsonl:2");
  EXPECT_EQ(opened->stats().truncated, 2u);
  std::filesystem::resize_file(store + "/tokens.u32", 4);
  EXPECT_THROW(TextCorpus::open(store), IoError);
  EXPECT_THROW(TextCorpus::open(dir.dir() + "/none"), IoError);
}

TEST_F(TextCorpusTest, AMissingFileIsAnIoErrorNamingIt) {
  try {
    build({dir.dir() + "/missing.jsonl"}, text_format());
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.jsonl"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace stoker::text
