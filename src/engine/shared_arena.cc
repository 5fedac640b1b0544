#include "stoker/shared_arena.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "stoker/errors.h"

namespace stoker {
namespace {

constexpr size_t kPage = 4096;

size_t round_up(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

Error system_error(const char* what) {
  return Error(std::string("shared memory: ") + what + ": " + std::strerror(errno));
}

}  // namespace

std::shared_ptr<SharedArena> SharedArena::create(size_t bytes) {
  const size_t size = round_up(bytes == 0 ? kPage : bytes);
  const int fd = memfd_create("stoker-batches", MFD_CLOEXEC);
  if (fd < 0) throw system_error("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const Error e = system_error("ftruncate");
    close(fd);
    throw e;
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (base == MAP_FAILED) {
    const Error e = system_error("mmap");
    close(fd);
    throw e;
  }
  return std::shared_ptr<SharedArena>(new SharedArena(fd, static_cast<std::byte*>(base), size));
}

std::shared_ptr<SharedArena> SharedArena::attach(int fd) {
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const Error e = system_error("fstat");
    close(fd);
    throw e;
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0 || size % kPage != 0) {
    close(fd);
    throw Error("shared memory: attach: not an arena (size " + std::to_string(size) + ")");
  }
  void* base = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
  if (base == MAP_FAILED) {
    const Error e = system_error("mmap");
    close(fd);
    throw e;
  }
  // Nothing is carved here: the creating process's pool owns the layout.
  auto arena =
      std::shared_ptr<SharedArena>(new SharedArena(fd, static_cast<std::byte*>(base), size));
  arena->used_ = size;
  return arena;
}

void SharedArena::drop_pages(size_t offset, size_t bytes) const {
  if (offset >= size_) return;
  bytes = std::min(bytes, size_ - offset);
  const uintptr_t at = reinterpret_cast<uintptr_t>(base_) + offset;
  const uintptr_t start = (at + kPage - 1) / kPage * kPage;
  const uintptr_t end = (at + bytes) / kPage * kPage;
  if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED);
}

SharedArena::~SharedArena() {
  munmap(base_, size_);
  close(fd_);
}

std::byte* SharedArena::carve(size_t bytes) {
  const size_t rounded = round_up(bytes);
  std::lock_guard lock(mu_);
  if (rounded > size_ - used_) return nullptr;
  std::byte* p = base_ + used_;
  used_ += rounded;
  return p;
}

}  // namespace stoker
