// Stoker from C++, without Python: iterate shuffled (input, target) token windows from a file.
//
// Writes a small uint16 token file, loads it with two worker threads, checks that every window is
// delivered once and that each target is its input shifted by one token, and prints a summary.
#include <stdlib.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "stoker/engine.h"
#include "stoker/sources/tokens.h"

int main() {
  // A directory of our own (two runs at once must not share a file), removed at the end.
  std::string dir = (std::filesystem::temp_directory_path() / "stoker-example-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return 1;
  const auto path = std::filesystem::path(dir) / "tokens.bin";
  {
    std::ofstream f(path, std::ios::binary);
    for (uint32_t i = 0; i < 64 * 1000 + 1; ++i) {
      const uint16_t token = static_cast<uint16_t>(i % 50000);
      f.write(reinterpret_cast<const char*>(&token), sizeof token);
    }
  }
  auto source = std::make_shared<stoker::TokenSource>(path, stoker::DType{stoker::DType::kUInt, 16},
                                                      /*seq_len=*/64);
  stoker::EngineOptions options;
  options.batch_size = 32;
  options.shuffle = true;
  options.seed = 1234;
  options.num_workers = 2;
  stoker::Engine loader(source, options);

  std::set<int64_t> firsts;
  uint64_t batches = 0;
  auto it = loader.iterate(/*epoch=*/0);
  while (auto batch = it->next()) {
    const auto* input = reinterpret_cast<const int64_t*>(batch->fields[0].data);
    const auto* target = reinterpret_cast<const int64_t*>(batch->fields[1].data);
    for (uint64_t s = 0; s < batch->length; ++s) {
      firsts.insert(input[s * 64]);
      for (int t = 0; t < 63; ++t) {
        if (target[s * 64 + t] != input[s * 64 + t + 1]) {
          std::fprintf(stderr, "target is not input shifted by one\n");
          return 1;
        }
      }
    }
    ++batches;
  }
  std::filesystem::remove_all(dir);
  const auto stats = loader.stats();
  std::printf("%llu batches, %llu windows (%zu distinct), %.3f s reading\n",
              static_cast<unsigned long long>(batches),
              static_cast<unsigned long long>(stats.samples), firsts.size(), stats.read_seconds);
  return batches == loader.num_batches() && firsts.size() == 1000 ? 0 : 1;
}
