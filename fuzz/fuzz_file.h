// For the fuzz targets of file parsers: the input as a file with a path (a memfd, reused from
// input to input), so the code under test opens, stats, preads and maps it as it would a real one.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace stoker::fuzz {

class FuzzFile {
 public:
  FuzzFile() : fd_(::memfd_create("stoker-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~FuzzFile() { ::close(fd_); }

  // Replaces the file's contents.
  const std::string& write(const uint8_t* data, size_t size) {
    truncate(0);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) {
        std::perror("pwrite");
        std::abort();
      }
      done += static_cast<size_t>(n);
    }
    return path_;
  }
  // Cuts the file to `size` bytes, as a file truncated while an epoch runs.
  void truncate(size_t size) {
    if (::ftruncate(fd_, static_cast<off_t>(size)) != 0) {
      std::perror("ftruncate");
      std::abort();
    }
  }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

}  // namespace stoker::fuzz
