// Shared memory for batches produced by worker processes (Python datasets).
//
// A SharedArena is one anonymous memfd (memfd_create: no name in /dev/shm, nothing left behind
// even if every process is SIGKILLed) mapped MAP_SHARED. Processes forked after the arena exists
// inherit the mapping and see each other's writes at the same offsets; a process started another
// way (spawn, forkserver) is handed the memfd (fd()) and maps it with attach(). Address space is
// reserved up front; physical pages are allocated only when first touched, so reserving the whole
// memory budget costs nothing until batches are written.
//
// Batch buffers are carved from the arena by a BatchPool (BatchPool::create_shared), which bounds
// and recycles them exactly as it does heap buffers.
//
// Thread safety: all members are safe to call concurrently.
#pragma once

#include <cstddef>
#include <memory>
#include <mutex>

#include "stoker/batch_pool.h"

namespace stoker {

class SharedArena final : public BufferMemory {
 public:
  // Reserves `bytes` (rounded up to 4096). Throws Error when the kernel refuses.
  static std::shared_ptr<SharedArena> create(size_t bytes);
  // Maps the arena whose memfd another process created (its fd(), passed to this process); takes
  // ownership of `fd`, which is closed with the arena. The size is the file's. Throws Error when
  // `fd` is not a mappable file.
  static std::shared_ptr<SharedArena> attach(int fd);
  ~SharedArena();
  SharedArena(const SharedArena&) = delete;
  SharedArena& operator=(const SharedArena&) = delete;

  std::byte* base() const { return base_; }
  size_t size() const override { return size_; }
  int fd() const { return fd_; }

  // Hands out `bytes` (rounded up to 4096) of the unused tail; nullptr when it does not fit.
  // Carved memory is never returned to the arena (the pool that carved it recycles it).
  std::byte* carve(size_t bytes) override;
  // Byte offset of `p` from base(). REQUIRES: p points into the arena.
  size_t offset_of(const std::byte* p) const { return static_cast<size_t>(p - base_); }

  // Drops this process's mapping of the whole pages inside bytes [offset, offset + bytes) of the
  // arena (MADV_DONTNEED: the data stays in the memfd for the other processes and for later reads
  // here): a page then counts in this process's RSS only while it is written or read again.
  // Ranges past the end are clipped.
  void drop_pages(size_t offset, size_t bytes) const;

 private:
  SharedArena(int fd, std::byte* base, size_t size) : fd_(fd), base_(base), size_(size) {}

  const int fd_;
  std::byte* const base_;
  const size_t size_;
  std::mutex mu_;
  size_t used_ = 0;  // guarded by mu_
};

}  // namespace stoker
