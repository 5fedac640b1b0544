// ByteStream: a file's bytes read in order, decompressed where its name says (.gz: gzip, every
// member of a multi-member file; .zst: zstd, every frame), for the JSONL reader.
//
// Thread safety: one thread at a time. Errors: IoError naming the file when it cannot be opened
// or read, DecodeError naming it for corrupt or truncated compressed data.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace stoker::text {

class ByteStream {
 public:
  virtual ~ByteStream() = default;
  // Up to `capacity` next bytes into `out`; 0 only at the end.
  virtual size_t read(char* out, size_t capacity) = 0;
  // Opens `path`, naming it `origin` in errors.
  static std::unique_ptr<ByteStream> open(const std::string& path, const std::string& origin);
};

}  // namespace stoker::text
