#include "stoker/shared_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
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
