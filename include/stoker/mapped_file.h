// A whole file mapped read-only, and reads from it that survive the file being truncated.
//
// A read from a file mapping past the file's current end raises SIGBUS, which kills the process:
// a token file or a .npy file cut short while an epoch runs (a copy still being written, a full
// disk, another job rewriting it) would take a training run down with no word of which file.
// MappedFile::copy() runs the copy under a SIGBUS guard instead: a SIGBUS raised by the guarded
// copy on the calling thread unwinds to the guard, which throws IoError naming the file. SIGBUS
// anywhere else goes to the handler that was installed before ours (Python's faulthandler, a
// sanitizer's) or, if there was none, kills the process as it would have.
//
// Thread safety: immutable after construction; copy() may run on many threads at once.
// Ownership: the mapping lives as long as the MappedFile; the descriptor is closed at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace stoker {

class MappedFile {
 public:
  // Maps the whole of `path`. `what` names the file in messages ("token file", ".npy file").
  // Throws IoError when it cannot be opened, stat-ed or mapped. An empty file maps to no bytes.
  MappedFile(std::string path, const std::string& what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  // The file's bytes as they were mapped; reading them directly is not guarded.
  std::span<const std::byte> bytes() const { return {data_, size_}; }

  // Calls fn(arg), which reads from bytes(). A SIGBUS it raises on this thread (the file shrank
  // under the mapping) becomes IoError("<what> <path> was truncated while being read ...").
  // REQUIRES: fn holds no objects with destructors across the reads (it is unwound by
  // siglongjmp) and takes no locks.
  void copy(void (*fn)(void*), void* arg) const;

 private:
  std::string path_;
  std::string what_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace stoker
