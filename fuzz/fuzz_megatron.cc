// Megatron-LM indexed datasets (TokenCorpus over a .bin + .idx pair): the .idx parser and its
// checks against the .bin, then every document read and compared with the files' bytes, then the
// .bin cut under its mapping and read again; and the same .bin bytes as a flat token file split
// at a token id.
//
// The input is [.idx][.bin][tail]; the tail (FuzzedDataProvider, from the end) gives the .idx's
// length, flags (bit 0: a vocabulary check, bit 1: the flat split; bits 2-7: the split id) and
// where to cut. Checked: the constructor throws nothing but InvalidArgument or IoError; a corpus
// it builds has the .idx's documents, each of its sequences inside the .bin, and each read gives
// the .bin's tokens (little-endian, of the .idx's dtype) at the .idx's pointers; with a
// vocabulary, a read fails (InvalidArgument) exactly when the run holds an id outside it; after
// the cut, a read succeeds with the same tokens or throws IoError (never SIGBUS); a flat shard's
// documents concatenate to its tokens, each ending with the split id but the last, and hold it
// nowhere else.
#include <fuzzer/FuzzedDataProvider.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "image_fuzz.h"  // require()
#include "stoker/errors.h"
#include "stoker/sources/token_corpus.h"

namespace {

using stoker::fuzz::require;

// A directory of this process's own for the pair (the corpus finds a .idx by its name), removed
// at exit.
class WorkDir {
 public:
  WorkDir() {
    dir_ = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    dir_ += "/stoker-fuzz-megatron-XXXXXX";
    if (::mkdtemp(dir_.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
  }
  ~WorkDir() {
    for (const char* name : {"/m.bin", "/m.idx", "/flat"}) ::unlink((dir_ + name).c_str());
    ::rmdir(dir_.c_str());
  }
  const std::string& path() const { return dir_; }

 private:
  std::string dir_;
};

const std::string& work_dir() {
  static const WorkDir dir;
  return dir.path();
}

void write_file(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  require(f != nullptr, "cannot write a fuzz file");
  if (size > 0) require(std::fwrite(data, 1, size, f) == size, "cannot write a fuzz file");
  std::fclose(f);
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Token i of the .bin at byte `at`, as the dtype code says.
int64_t token_at(const std::vector<uint8_t>& bin, uint64_t at, uint8_t code) {
  switch (code) {
    case 1:
      return load<uint8_t>(&bin[at]);
    case 2:
      return load<int8_t>(&bin[at]);
    case 3:
      return load<int16_t>(&bin[at]);
    case 4:
      return load<int32_t>(&bin[at]);
    case 5:
      return load<int64_t>(&bin[at]);
    default:
      return load<uint16_t>(&bin[at]);
  }
}

size_t item_of(uint8_t code) {
  return code == 1 || code == 2 ? 1 : code == 4 ? 4 : code == 5 ? 8 : 2;
}

struct Document {
  std::vector<int64_t> tokens;
  uint64_t end_byte = 0;  // past its last sequence in the .bin
};

// The .idx's documents, read back from its bytes by the layout alone (the reference).
std::vector<Document> reference_documents(const std::vector<uint8_t>& idx,
                                          const std::vector<uint8_t>& bin) {
  const uint8_t code = idx[17];
  const uint64_t sequences = load<uint64_t>(&idx[18]);
  const uint64_t indices = load<uint64_t>(&idx[26]);
  const uint64_t lengths_at = 34, pointers_at = 34 + 4 * sequences,
                 documents_at = pointers_at + 8 * sequences;
  require(documents_at + 8 * indices <= idx.size(), "a valid .idx is shorter than its counts");
  const size_t item = item_of(code);
  std::vector<Document> docs;
  for (uint64_t d = 0; d + 1 < indices; ++d) {
    const int64_t first = load<int64_t>(&idx[documents_at + 8 * d]);
    const int64_t end = load<int64_t>(&idx[documents_at + 8 * d + 8]);
    require(0 <= first && first <= end && static_cast<uint64_t>(end) <= sequences,
            "a valid .idx has document indices out of order");
    Document& doc = docs.emplace_back();
    for (int64_t s = first; s < end; ++s) {
      const int64_t length = load<int32_t>(&idx[lengths_at + 4 * s]);
      const int64_t pointer = load<int64_t>(&idx[pointers_at + 8 * s]);
      require(
          length >= 0 && pointer >= 0 &&
              static_cast<uint64_t>(pointer) + static_cast<uint64_t>(length) * item <= bin.size(),
          "a valid .idx has a sequence outside the .bin");
      doc.end_byte = static_cast<uint64_t>(pointer) + static_cast<uint64_t>(length) * item;
      for (int64_t t = 0; t < length; ++t)
        doc.tokens.push_back(
            token_at(bin, static_cast<uint64_t>(pointer + t * static_cast<int64_t>(item)), code));
    }
  }
  return docs;
}

void check_megatron(const std::vector<uint8_t>& idx, const std::vector<uint8_t>& bin,
                    uint64_t vocab, uint16_t cut) {
  const std::string prefix = work_dir() + "/m";
  write_file(prefix + ".idx", idx.data(), idx.size());
  write_file(prefix + ".bin", bin.data(), bin.size());
  std::unique_ptr<stoker::TokenCorpus> corpus;
  try {
    corpus = std::make_unique<stoker::TokenCorpus>(std::vector<std::string>{prefix},
                                                   stoker::DType{stoker::DType::kUInt, 16},
                                                   std::nullopt, vocab);
  } catch (const stoker::InvalidArgument&) {
    return;
  } catch (const stoker::IoError&) {
    return;
  }
  const auto docs = reference_documents(idx, bin);
  require(corpus->num_documents() == docs.size(), "another number of documents than the .idx's");
  std::vector<int64_t> out;
  uint64_t start = 0;
  for (uint64_t d = 0; d < docs.size(); ++d) {
    const std::vector<int64_t>& tokens = docs[d].tokens;
    require(corpus->document_length(d) == tokens.size(), "a document's length differs");
    require(corpus->document_start(d) == start, "a document's start differs");
    start += tokens.size();
    out.assign(tokens.size(), -1);
    const bool outside = std::any_of(tokens.begin(), tokens.end(), [&](int64_t id) {
      return id < 0 || (vocab != 0 && static_cast<uint64_t>(id) >= vocab);
    });
    try {
      corpus->read(d, 0, out.size(), out.data());
      require(!outside, "a read of an id outside the vocabulary (or negative) succeeded");
      require(out == tokens, "a document's tokens differ from the .bin's");
    } catch (const stoker::InvalidArgument&) {
      require(outside, "a read of ids inside the vocabulary failed");
    }
  }
  require(corpus->num_tokens() == start, "num_tokens differs from the documents' sum");
  for (uint64_t t = 0; t < corpus->num_tokens(); t += 1 + t / 8) {
    const uint64_t d = corpus->document_at(t);
    require(corpus->document_start(d) <= t && t < corpus->document_start(d + 1),
            "document_at gives a document that does not hold the position");
  }

  // The .bin cut under its mapping: a read gives the same tokens or IoError.
  const uint64_t new_size = bin.size() * cut / 65536;
  require(::truncate((prefix + ".bin").c_str(), static_cast<off_t>(new_size)) == 0, "truncate");
  for (uint64_t d = 0; d < docs.size(); ++d) {
    out.assign(docs[d].tokens.size(), -1);
    try {
      corpus->read(d, 0, out.size(), out.data());
    } catch (const stoker::IoError& e) {
      require(std::string(e.what()).find("was truncated while being read") != std::string::npos,
              "a truncated .bin's error does not say so");
      continue;
    } catch (const stoker::InvalidArgument&) {
      continue;  // an id outside the vocabulary, or a zero from the last page past the cut
    }
    // A page past the new end that the kernel keeps reads as zeros: compare only what the cut
    // left whole.
    if (docs[d].end_byte <= new_size)
      require(out == docs[d].tokens, "a read after the cut differs");
  }
}

void check_flat_split(const std::vector<uint8_t>& bin, uint16_t id) {
  const std::string path = work_dir() + "/flat";
  write_file(path, bin.data(), bin.size());
  std::unique_ptr<stoker::TokenCorpus> corpus;
  try {  // the bytes may also read as an llm.c or .npy header: fuzz_tokens fuzzes those layouts
    corpus = std::make_unique<stoker::TokenCorpus>(std::vector<std::string>{path},
                                                   stoker::DType{stoker::DType::kUInt, 16}, id);
  } catch (const stoker::InvalidArgument&) {
    return;
  }
  std::vector<int64_t> all, doc;
  for (uint64_t d = 0; d < corpus->num_documents(); ++d) {
    doc.assign(corpus->document_length(d), -1);
    require(!doc.empty(), "a flat shard has an empty document");
    corpus->read(d, 0, doc.size(), doc.data());
    const bool last = d + 1 == corpus->num_documents();
    require(std::find(doc.begin(), doc.end() - 1, id) == doc.end() - 1,
            "the split id inside a document");
    require(last || doc.back() == id, "a document but the last does not end with the split id");
    all.insert(all.end(), doc.begin(), doc.end());
  }
  require(all.size() == corpus->num_tokens(), "the documents do not hold every token");
  if (corpus->shard_format(0) != stoker::TokenCorpus::Format::kRaw) return;
  require(all.size() == bin.size() / 2, "a raw file's documents do not hold every token");
  for (size_t t = 0; t < all.size(); ++t)
    require(all[t] == load<uint16_t>(&bin[2 * t]), "the documents differ from the file");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider p(data, size);
  const uint16_t idx_size = p.ConsumeIntegral<uint16_t>();
  const uint8_t flags = p.ConsumeIntegral<uint8_t>();
  const uint16_t cut = p.ConsumeIntegral<uint16_t>();
  const std::vector<uint8_t> rest = p.ConsumeRemainingBytes<uint8_t>();
  const size_t split = std::min<size_t>(idx_size, rest.size());
  const std::vector<uint8_t> idx(rest.begin(), rest.begin() + static_cast<ptrdiff_t>(split));
  const std::vector<uint8_t> bin(rest.begin() + static_cast<ptrdiff_t>(split), rest.end());
  const uint16_t id = flags >> 2;
  if (flags & 2) check_flat_split(bin, id);
  check_megatron(idx, bin, (flags & 1) ? 32 + id : 0, cut);
  return 0;
}
