// Token files (TokenSource: raw, llm.c-headered and .npy layouts): the layout parser, then every
// window read back and compared with the file's bytes, then the file truncated under the mapping
// and the windows read again.
//
// The input is the file; its last bytes give the token type, seq_len and where to cut. Checked:
// the constructor throws nothing but InvalidArgument or IoError; the layout lies inside the file;
// each window holds the file's tokens at data_offset + index * seq_len (little-endian); after the
// cut, a read of a window the cut left whole gives the same tokens, and a read past the cut
// throws IoError (never SIGBUS).
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_file.h"
#include "image_fuzz.h"  // require()
#include "stoker/errors.h"
#include "stoker/sources/tokens.h"

namespace {

int64_t token_at(const std::vector<uint8_t>& file, uint64_t offset, size_t item) {
  uint64_t v = 0;
  for (size_t b = 0; b < item; ++b) v |= static_cast<uint64_t>(file[offset + b]) << (8 * b);
  return static_cast<int64_t>(v);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using stoker::fuzz::require;
  static stoker::fuzz::FuzzFile file;
  FuzzedDataProvider p(data, size);
  const stoker::DType dtype{stoker::DType::kUInt, static_cast<uint8_t>(p.ConsumeBool() ? 16 : 32)};
  const uint64_t seq_len = p.ConsumeIntegralInRange<uint64_t>(1, 300);
  const uint16_t cut = p.ConsumeIntegral<uint16_t>();
  const std::vector<uint8_t> bytes = p.ConsumeRemainingBytes<uint8_t>();
  const std::string& path = file.write(bytes.data(), bytes.size());

  std::unique_ptr<stoker::TokenSource> src;
  try {
    src = std::make_unique<stoker::TokenSource>(path, dtype, seq_len);
  } catch (const stoker::InvalidArgument&) {
    return 0;
  } catch (const stoker::IoError&) {
    return 0;
  }
  const stoker::TokenFileLayout& layout = src->layout();
  const size_t item = dtype.bytes();
  require(layout.data_offset <= bytes.size() &&
              layout.num_tokens <= (bytes.size() - layout.data_offset) / item,
          "the layout reaches past the end of the file");
  require(src->size() == (layout.num_tokens - 1) / seq_len, "wrong number of windows");

  std::vector<int64_t> input(seq_len), target(seq_len);
  std::byte* slots[2] = {reinterpret_cast<std::byte*>(input.data()),
                         reinterpret_cast<std::byte*>(target.data())};
  const uint64_t windows = std::min<uint64_t>(src->size(), 256);
  auto check = [&](uint64_t w) {
    for (uint64_t t = 0; t < seq_len; ++t) {
      const uint64_t at = layout.data_offset + (w * seq_len + t) * item;
      require(input[t] == token_at(bytes, at, item), "an input token differs from the file");
      require(target[t] == token_at(bytes, at + item, item), "a target token differs");
    }
  };
  for (uint64_t w = 0; w < windows; ++w) {
    src->read({0, 0, w}, slots, nullptr);
    check(w);
  }

  const uint64_t new_size = bytes.size() * cut / 65536;
  file.truncate(new_size);
  for (uint64_t w = 0; w < windows; ++w) {
    try {
      src->read({0, 0, w}, slots, nullptr);
      // A window the cut left whole is still the file's. (One that ends in the last page past the
      // new end reads the zeros the kernel fills that page with: a mapping cannot tell.)
      if (layout.data_offset + (w * seq_len + seq_len + 1) * item <= new_size) check(w);
    } catch (const stoker::IoError& e) {
      require(std::string(e.what()).find("was truncated while being read") != std::string::npos,
              "a truncated token file's error does not say so");
    }
  }
  return 0;
}
