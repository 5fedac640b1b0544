// JSONL corpora (TextCorpusBuilder::add_jsonl): lines of raw text or of conversations, plain or
// compressed, tokenized into a TextCorpus, with the bad rows skipped and without.
//
// The input is [flags][file]. Flags: bits 0-1 the file's name (0, 3: .jsonl, 1: .jsonl.gz,
// 2: .jsonl.zst; the builder picks the decompressor by the name), bit 2 conversations ("messages"
// rendered by a chat template with a {% generation %} block, assistant-only loss) instead of
// text ("text", an end-of-text token after each), bit 3 max_length 8, bit 4 two encoder threads.
// The file is the memfd of FuzzFile, named through a symlink in a directory of this process's
// own (removed at exit); the store is unnamed temporary files.
//
// Checked: building throws nothing but SampleError, InvalidArgument, DecodeError or IoError, and
// with skip_bad_rows nothing but DecodeError or IoError (a corrupt .gz/.zst, a read error); a
// corpus built has stats().documents documents, every token an id of the tokenizer, num_tokens()
// the sum of the documents' lengths, each document at most max_length tokens, named
// "<file>:<line>"; read() and read_trained() of every document (ASan checks their bounds); a
// corpus built without skipping equals the one built with it and skipped nothing.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_file.h"
#include "image_fuzz.h"  // require()
#include "stoker/errors.h"
#include "stoker/text/chat_template.h"
#include "stoker/text/text_corpus.h"
#include "stoker/text/tokenizer.h"
#include "text_fuzz.h"

namespace {

using stoker::fuzz::require;
using namespace stoker::text;

const char* const kNames[] = {"fuzz.jsonl", "fuzz.jsonl.gz", "fuzz.jsonl.zst"};

// A directory of this process's own holding one symlink per name to the FuzzFile, removed at
// exit.
class NamedFile {
 public:
  NamedFile() {
    const char* tmp = std::getenv("TMPDIR");
    dir_ = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (tmp ? tmp : "/tmp");
    dir_ += "/stoker-fuzz-jsonl-XXXXXX";
    if (::mkdtemp(dir_.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    for (const char* name : kNames)
      require(::symlink(file_.path().c_str(), (dir_ + "/" + name).c_str()) == 0,
              "cannot make a symlink to the fuzz file");
  }
  ~NamedFile() {
    for (const char* name : kNames) ::unlink((dir_ + "/" + name).c_str());
    ::rmdir(dir_.c_str());
  }
  // The file with `data` as its contents, by the name `name`.
  std::string write(const uint8_t* data, size_t size, const char* name) {
    file_.write(data, size);
    return dir_ + "/" + name;
  }

 private:
  stoker::fuzz::FuzzFile file_;
  std::string dir_;
};

NamedFile& named_file() {
  static NamedFile file;
  return file;
}

struct Fixture {
  Tokenizer tokenizer = Tokenizer::from_json(stoker::fuzz::byte_level_tokenizer_json());
  std::shared_ptr<const ChatTemplate> chat_template = std::make_shared<const ChatTemplate>(
      ChatTemplate::parse(stoker::fuzz::generation_chat_template()));
};

const Fixture& fixture() {
  static const Fixture f;
  return f;
}

// Every document of `c` read, with its checks; its tokens, concatenated.
std::vector<int64_t> check_corpus(const TextCorpus& c, const RowFormat& format,
                                  const std::string& name) {
  require(c.num_documents() == c.stats().documents, "num_documents() differs from stats()");
  std::vector<int64_t> all, tokens;
  std::vector<uint8_t> trained;
  uint64_t total = 0, trained_total = 0;
  for (uint64_t d = 0; d < c.num_documents(); ++d) {
    const uint64_t n = c.document_length(d);
    total += n;
    require(format.max_length == 0 || n <= format.max_length, "a document exceeds max_length");
    tokens.assign(n, -1);
    trained.assign(n, 2);
    c.read(d, 0, n, tokens.data());
    c.read_trained(d, 0, n, trained.data());
    for (uint64_t i = 0; i < n; ++i) {
      require(tokens[i] >= 0 && tokens[i] < stoker::fuzz::kTextVocabSize,
              "a token outside the vocabulary");
      require(trained[i] <= 1, "a trained flag that is neither 0 nor 1");
      trained_total += trained[i];
    }
    if (n > 0) require(c.last_token(d) == tokens[n - 1], "last_token() differs from read()");
    if (n > 1) {  // a read inside the document gives the same tokens
      int64_t middle = -1;
      c.read(d, n / 2, 1, &middle);
      require(middle == tokens[n / 2], "a read at an offset differs");
    }
    require(c.path(d).rfind(name + ":", 0) == 0, "a document's path does not name its file");
    all.insert(all.end(), tokens.begin(), tokens.end());
  }
  require(total == c.num_tokens(), "num_tokens() is not the sum of the documents' lengths");
  require(total == c.stats().tokens, "stats().tokens is not the sum of the documents' lengths");
  require(trained_total == c.stats().trained_tokens, "stats().trained_tokens miscounts");
  require(c.stats().rows == c.stats().documents + c.stats().skipped, "stats().rows miscounts");
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const char* name = kNames[(flags & 3) == 3 ? 0 : flags & 3];
  const std::string path = named_file().write(data + 1, size - 1, name);

  RowFormat format;
  if (flags & 4) {
    format.field = "messages";
    format.messages = true;
    format.chat_template = fixture().chat_template;
    format.template_variables = R"({"bos_token": "<|endoftext|>"})";
    format.assistant_only = true;
  } else {
    format.eos = stoker::fuzz::kEndOfText;
  }
  if (flags & 8) format.max_length = 8;
  const int threads = flags & 16 ? 2 : 1;

  std::optional<std::vector<int64_t>> skipped_tokens;
  uint64_t skipped_documents = 0;
  try {
    TextCorpusBuilder builder(fixture().tokenizer, format, "", /*skip_bad_rows=*/true, threads);
    builder.add_jsonl(path, name);
    const auto corpus = builder.finish();
    skipped_tokens = check_corpus(*corpus, format, name);
    skipped_documents = corpus->num_documents();
  } catch (const stoker::DecodeError&) {
  } catch (const stoker::IoError&) {
  }

  try {
    TextCorpusBuilder builder(fixture().tokenizer, format, "", /*skip_bad_rows=*/false, threads);
    builder.add_jsonl(path, name);
    const auto corpus = builder.finish();
    const auto tokens = check_corpus(*corpus, format, name);
    require(corpus->stats().skipped == 0, "a corpus built without skipping skipped rows");
    require(skipped_tokens.has_value(), "a file read without skipping failed with skipping");
    require(corpus->num_documents() == skipped_documents && tokens == *skipped_tokens,
            "a corpus without bad rows differs with skip_bad_rows");
  } catch (const stoker::SampleError&) {
  } catch (const stoker::InvalidArgument&) {
  } catch (const stoker::DecodeError&) {
  } catch (const stoker::IoError&) {
  }
  return 0;
}
