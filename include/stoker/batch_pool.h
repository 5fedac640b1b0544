// A bounded pool of equally sized batch buffers.
//
// The pool never holds more than `capacity()` buffers, so buffer memory never exceeds the budget it
// was created with. Buffers are allocated lazily, recycled through a free list, and returned
// automatically when the last owner of a Buffer drops it (for example when the tensor exported to
// Python dies): a Buffer keeps its pool alive.
//
// Thread safety: all members are safe to call concurrently.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <stop_token>
#include <vector>

#include "stoker/memory.h"
#include "stoker/shared_arena.h"

namespace stoker {

class BatchPool;

// Owning handle to one buffer; shared by everything that views it.
using Buffer = std::shared_ptr<std::byte>;

class BatchPool : public std::enable_shared_from_this<BatchPool> {
 public:
  // REQUIRES: 0 < buffer_bytes <= budget_bytes (InvalidArgument otherwise).
  static std::shared_ptr<BatchPool> create(size_t buffer_bytes, size_t budget_bytes,
                                           MemoryKind kind);
  // As create(), with buffers carved from `arena` (shared with forked worker processes) instead
  // of the heap. REQUIRES: also (budget_bytes / buffer_bytes) buffers, each
  // rounded up to 4096 bytes, fit in the arena.
  static std::shared_ptr<BatchPool> create_shared(size_t buffer_bytes, size_t budget_bytes,
                                                  std::shared_ptr<SharedArena> arena);
  ~BatchPool();
  BatchPool(const BatchPool&) = delete;
  BatchPool& operator=(const BatchPool&) = delete;

  // Blocks until a buffer is free or can be allocated within the budget. Returns nullptr when
  // `stop` is requested first.
  Buffer acquire(std::stop_token stop);
  // As acquire(), giving up (nullptr) after `timeout`.
  Buffer acquire_for(std::stop_token stop, std::chrono::milliseconds timeout);

  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t capacity() const { return capacity_; }
  MemoryKind kind() const { return kind_; }
  // The arena buffers come from; nullptr for heap buffers.
  const std::shared_ptr<SharedArena>& arena() const { return arena_; }
  // True when every buffer the budget allows exists and is in use.
  bool exhausted() const;
  size_t bytes_allocated() const;       // buffers that exist, free or in use
  size_t peak_bytes_allocated() const;  // the most that ever existed at once

 private:
  BatchPool(size_t buffer_bytes, size_t capacity, MemoryKind kind);
  Buffer take_locked(std::unique_lock<std::mutex>& lock);  // REQUIRES: can_take_locked()
  bool can_take_locked() const { return !free_.empty() || allocated_ < capacity_; }
  void release(std::byte* buffer);

  const size_t buffer_bytes_;
  const size_t capacity_;
  const MemoryKind kind_;
  std::shared_ptr<SharedArena> arena_;  // set once by create_shared, before any buffer exists
  mutable std::mutex mu_;
  std::condition_variable_any available_;
  std::vector<std::byte*> free_;  // guarded by mu_
  size_t allocated_ = 0;          // guarded by mu_
  size_t peak_allocated_ = 0;     // guarded by mu_
};

}  // namespace stoker
