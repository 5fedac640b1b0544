#include "stoker/batch_pool.h"

#include <string>

#include "stoker/errors.h"

namespace stoker {

std::shared_ptr<BatchPool> BatchPool::create(size_t buffer_bytes, size_t budget_bytes,
                                             MemoryKind kind) {
  if (buffer_bytes == 0) throw InvalidArgument("batch buffers must hold at least one byte");
  if (buffer_bytes > budget_bytes)
    throw InvalidArgument("one batch needs " + std::to_string(buffer_bytes) +
                          " bytes, more than memory_budget (" + std::to_string(budget_bytes) +
                          " bytes): raise memory_budget or lower batch_size");
  return std::shared_ptr<BatchPool>(new BatchPool(buffer_bytes, budget_bytes / buffer_bytes, kind));
}

std::shared_ptr<BatchPool> BatchPool::create_shared(size_t buffer_bytes, size_t budget_bytes,
                                                    std::shared_ptr<SharedArena> arena) {
  const size_t page_rounded = (buffer_bytes + 4095) / 4096 * 4096;  // what carve() hands out
  if (!arena || buffer_bytes == 0 || budget_bytes / buffer_bytes * page_rounded > arena->size())
    throw InvalidArgument("a shared pool needs an arena at least as large as its budget");
  auto pool = create(buffer_bytes, budget_bytes, MemoryKind::kPageable);
  pool->arena_ = std::move(arena);
  return pool;
}

BatchPool::BatchPool(size_t buffer_bytes, size_t capacity, MemoryKind kind)
    : buffer_bytes_(buffer_bytes), capacity_(capacity), kind_(kind) {}

BatchPool::~BatchPool() {
  // Every Buffer holds a reference to the pool, so all buffers are back in free_ by now.
  if (arena_) return;  // carved from the arena, which unmaps it
  for (std::byte* b : free_) free_host(kind_, b);
}

Buffer BatchPool::take_locked(std::unique_lock<std::mutex>& lock) {
  std::byte* raw = nullptr;
  if (!free_.empty()) {
    raw = free_.back();
    free_.pop_back();
  } else {
    ++allocated_;  // reserve before unlocking so concurrent callers respect the capacity
    peak_allocated_ = std::max(peak_allocated_, allocated_);
    lock.unlock();
    try {
      // The arena holds capacity_ buffers by construction (create_shared checks the budget).
      raw = arena_ ? arena_->carve(buffer_bytes_)
                   : static_cast<std::byte*>(allocate_host(kind_, buffer_bytes_));
      if (raw == nullptr) throw std::bad_alloc();
    } catch (...) {
      lock.lock();
      --allocated_;
      throw;
    }
  }
  return Buffer(raw, [pool = shared_from_this()](std::byte* b) { pool->release(b); });
}

Buffer BatchPool::acquire(std::stop_token stop) {
  std::unique_lock lock(mu_);
  if (!available_.wait(lock, stop, [this] { return can_take_locked(); })) return nullptr;
  return take_locked(lock);
}

Buffer BatchPool::acquire_for(std::stop_token stop, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!available_.wait_for(lock, stop, timeout, [this] { return can_take_locked(); }))
    return nullptr;
  return take_locked(lock);
}

void BatchPool::release(std::byte* buffer) {
  {
    std::lock_guard lock(mu_);
    free_.push_back(buffer);
  }
  available_.notify_one();
}

bool BatchPool::exhausted() const {
  std::lock_guard lock(mu_);
  return !can_take_locked();
}

size_t BatchPool::bytes_allocated() const {
  std::lock_guard lock(mu_);
  return allocated_ * buffer_bytes_;
}

size_t BatchPool::peak_bytes_allocated() const {
  std::lock_guard lock(mu_);
  return peak_allocated_ * buffer_bytes_;
}

}  // namespace stoker
