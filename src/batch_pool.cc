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

BatchPool::BatchPool(size_t buffer_bytes, size_t capacity, MemoryKind kind)
    : buffer_bytes_(buffer_bytes), capacity_(capacity), kind_(kind) {}

BatchPool::~BatchPool() {
  // Every Buffer holds a reference to the pool, so all buffers are back in free_ by now.
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
      raw = static_cast<std::byte*>(allocate_host(kind_, buffer_bytes_));
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
