// A bounded pool of equally sized batch buffers.
//
// The pool never holds more than `capacity()` buffers, so buffer memory never exceeds the budget it
// was created with (pinned buffers are counted in whole pages, so pinned bytes never exceed it
// either). Buffers are allocated lazily, recycled through a free list, and returned automatically
// when the last owner of a Buffer drops it (for example when the tensor exported to Python dies):
// a Buffer keeps its pool alive.
//
// Fences (fence.h): a buffer the GPU may still read when its last owner drops it (the source of a
// copy that is queued but not done) gets a fence first (add_fence). A released buffer with fences
// is "fenced": acquire() hands it out only once every fence of it has completed. A waiter polls
// fences at growing intervals, kFencePollMin doubling up to kFencePollMax, never spinning; a
// released buffer wakes waiters at once as before. Fenced buffers still count in the budget.
// Destroying the pool waits for pending fences before it frees their memory. Without fences
// (no GPU) nothing of this costs anything.
//
// Thread safety: all members are safe to call concurrently.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <unordered_map>
#include <vector>

#include "stoker/fence.h"
#include "stoker/memory.h"

namespace stoker {

class BatchPool;

// Memory a pool may carve its buffers from instead of the heap: one region, handed out front to
// back and never taken back (the pool recycles what it carved). The engine's own is memory shared
// with forked worker processes (Python datasets); a user may give any region that outlives the
// pool's buffers. Thread safety: carve() may be called from several threads at once.
class BufferMemory {
 public:
  virtual ~BufferMemory() = default;
  // Bytes of the whole region.
  virtual size_t size() const = 0;
  // `bytes` (rounded up to 4096) of the unused tail, page aligned; nullptr when it does not fit.
  virtual std::byte* carve(size_t bytes) = 0;
};

// Owning handle to one buffer; shared by everything that views it.
using Buffer = std::shared_ptr<std::byte>;

class BatchPool : public std::enable_shared_from_this<BatchPool> {
 public:
  // REQUIRES: 0 < buffer_bytes <= budget_bytes (InvalidArgument otherwise; for pinned memory,
  // buffer_bytes rounded up to 4096).
  static std::shared_ptr<BatchPool> create(size_t buffer_bytes, size_t budget_bytes,
                                           MemoryKind kind);
  // As create(), with buffers carved from `memory` (e.g. shared with forked worker processes)
  // instead of the heap; the pool keeps `memory` alive. With kPinned, each buffer is page-locked
  // (cuda::register_host) when it is first carved, and unlocked when the pool dies. REQUIRES:
  // also (budget_bytes / buffer_bytes) buffers, each rounded up to 4096 bytes, fit in `memory`
  // (InvalidArgument otherwise).
  static std::shared_ptr<BatchPool> create_shared(size_t buffer_bytes, size_t budget_bytes,
                                                  std::shared_ptr<BufferMemory> memory,
                                                  MemoryKind kind = MemoryKind::kPageable);
  ~BatchPool();
  BatchPool(const BatchPool&) = delete;
  BatchPool& operator=(const BatchPool&) = delete;

  // Blocks until a buffer is free (and its fences completed) or can be allocated within the
  // budget. Returns nullptr when `stop` is requested first.
  Buffer acquire(std::stop_token stop);
  // As acquire(), giving up (nullptr) after `timeout`.
  Buffer acquire_for(std::stop_token stop, std::chrono::milliseconds timeout);

  // Adds a fence to `buffer`: once released, the buffer is handed out again only after the fence
  // has completed (and every other fence added to it). A fence already completed is dropped.
  // REQUIRES: `buffer` is the start of a buffer of this pool that some Buffer still holds.
  void add_fence(const std::byte* buffer, std::unique_ptr<Fence> fence);
  // The pool `buffer` came from (nullptr for a Buffer of another origin).
  static std::shared_ptr<BatchPool> owner(const Buffer& buffer);

  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t capacity() const { return capacity_; }
  MemoryKind kind() const { return kind_; }
  // True when every buffer the budget allows exists and is held (none free, none fenced): only
  // their holders can free one.
  bool exhausted() const;
  size_t bytes_allocated() const;       // buffers that exist, free, fenced or in use
  size_t peak_bytes_allocated() const;  // the most that ever existed at once
  size_t pinned_bytes() const;          // page-locked bytes of this pool (whole pages)
  size_t fenced_buffers() const;        // released buffers whose fences have not all completed

  static constexpr std::chrono::microseconds kFencePollMin{50};
  static constexpr std::chrono::microseconds kFencePollMax{1000};

 private:
  using Clock = std::chrono::steady_clock;
  struct Return;  // a Buffer's deleter: gives the buffer back to its pool
  struct Fenced {
    std::byte* buffer;
    std::vector<std::unique_ptr<Fence>> fences;
  };

  BatchPool(size_t buffer_bytes, size_t unit_bytes, size_t capacity, MemoryKind kind);
  Buffer acquire_until(std::stop_token stop, std::optional<Clock::time_point> deadline);
  Buffer take_locked(std::unique_lock<std::mutex>& lock);  // REQUIRES: can_take_locked()
  bool can_take_locked() const { return !free_.empty() || allocated_ < capacity_; }
  void reclaim_locked();  // fenced buffers whose fences completed -> free_
  void release(std::byte* buffer);
  void free_memory(std::byte* buffer);

  const size_t buffer_bytes_;
  const size_t unit_bytes_;  // memory one buffer takes: buffer_bytes_, page-rounded when pinned
  const size_t capacity_;
  const MemoryKind kind_;
  std::shared_ptr<BufferMemory> arena_;  // set once by create_shared, before any buffer exists
  mutable std::mutex mu_;
  std::condition_variable_any available_;
  std::vector<std::byte*> free_;  // guarded by mu_
  std::vector<Fenced> fenced_;    // guarded by mu_; released, waiting for their fences
  // guarded by mu_; fences of buffers still held, moved to fenced_ on release
  std::unordered_map<const std::byte*, std::vector<std::unique_ptr<Fence>>> held_fences_;
  std::vector<std::byte*> unregistered_;  // guarded by mu_; carved, registration failed: reused
  size_t allocated_ = 0;                  // guarded by mu_
  size_t peak_allocated_ = 0;             // guarded by mu_
};

}  // namespace stoker
