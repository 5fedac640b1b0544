// The tar shard index (TarShardFiles: ustar, GNU long names and base-256 sizes, pax headers), then
// every member read back, then the shard truncated as if it were cut mid-epoch and read again.
//
// The input is the shard, and its last two bytes say where to cut it. Checked: the index throws
// nothing but InvalidArgument (a corrupt or truncated tar, a bad sample) or IoError; every
// indexed member reads in full from the intact shard and is bytes of it; after the cut, a read
// either succeeds or throws IoError naming the member.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <string>
#include <vector>

#include "fuzz_file.h"
#include "image_fuzz.h"  // require()
#include "stoker/errors.h"
#include "stoker/sources/image_files.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using stoker::fuzz::require;
  static stoker::fuzz::FuzzFile file;
  FuzzedDataProvider p(data, size);
  const uint16_t cut = p.ConsumeIntegral<uint16_t>();
  const std::vector<uint8_t> shard = p.ConsumeRemainingBytes<uint8_t>();
  const std::string& path = file.write(shard.data(), shard.size());

  std::unique_ptr<stoker::TarShardFiles> files;
  try {
    files = std::make_unique<stoker::TarShardFiles>(std::vector<std::string>{path});
  } catch (const stoker::InvalidArgument&) {
    return 0;
  } catch (const stoker::IoError&) {
    return 0;
  }
  require(files->num_shards() == 1, "one shard given, another count indexed");
  std::vector<std::byte> buffer;
  const uint64_t n = std::min<uint64_t>(files->size(), 4096);
  for (uint64_t i = 0; i < n; ++i) {
    require(files->path(i).rfind(path + ":", 0) == 0, "a member's path does not name its shard");
    files->read(i, buffer);  // the shard is intact: must not throw
    require(buffer.size() <= shard.size(), "a member larger than its shard");
    if (!buffer.empty() && buffer.size() <= 65536) {
      const auto* b = reinterpret_cast<const uint8_t*>(buffer.data());
      require(std::search(shard.begin(), shard.end(), b, b + buffer.size()) != shard.end(),
              "a member's bytes are not bytes of the shard");
    }
  }

  file.truncate(shard.size() * cut / 65536);
  for (uint64_t i = 0; i < n; ++i) {
    try {
      files->read(i, buffer);
    } catch (const stoker::IoError& e) {
      require(std::string(e.what()).find(files->path(i)) != std::string::npos,
              "a truncated member's error does not name it");
    }
  }
  return 0;
}
