#include "stoker/batch_pool.h"

#include <algorithm>
#include <string>

#include "stoker/cuda/cuda.h"
#include "stoker/errors.h"

namespace stoker {
namespace {

constexpr size_t kPage = 4096;
size_t page_round(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

}  // namespace

struct BatchPool::Return {
  std::shared_ptr<BatchPool> pool;
  void operator()(std::byte* buffer) const { pool->release(buffer); }
};

std::shared_ptr<BatchPool> BatchPool::create(size_t buffer_bytes, size_t budget_bytes,
                                             MemoryKind kind) {
  if (buffer_bytes == 0) throw InvalidArgument("batch buffers must hold at least one byte");
  const size_t unit = kind == MemoryKind::kPinned ? page_round(buffer_bytes) : buffer_bytes;
  if (unit > budget_bytes)
    throw InvalidArgument("one batch needs " + std::to_string(unit) +
                          " bytes, more than memory_budget (" + std::to_string(budget_bytes) +
                          " bytes): raise memory_budget or lower batch_size");
  return std::shared_ptr<BatchPool>(new BatchPool(buffer_bytes, unit, budget_bytes / unit, kind));
}

std::shared_ptr<BatchPool> BatchPool::create_shared(size_t buffer_bytes, size_t budget_bytes,
                                                    std::shared_ptr<BufferMemory> arena,
                                                    MemoryKind kind) {
  if (!arena || buffer_bytes == 0 ||
      budget_bytes / buffer_bytes * page_round(buffer_bytes) > arena->size())
    throw InvalidArgument("a shared pool needs an arena at least as large as its budget");
  auto pool = create(buffer_bytes, budget_bytes, kind);
  pool->arena_ = std::move(arena);
  return pool;
}

BatchPool::BatchPool(size_t buffer_bytes, size_t unit_bytes, size_t capacity, MemoryKind kind)
    : buffer_bytes_(buffer_bytes), unit_bytes_(unit_bytes), capacity_(capacity), kind_(kind) {}

BatchPool::~BatchPool() {
  // Every Buffer holds a reference to the pool, so all buffers are free or fenced by now. A
  // fenced buffer may still be read by a copy: wait for it before its memory goes.
  for (Fenced& f : fenced_) {
    for (const auto& fence : f.fences) fence->wait();
    free_.push_back(f.buffer);
  }
  fenced_.clear();
  for (std::byte* b : free_) free_memory(b);
}

void BatchPool::free_memory(std::byte* buffer) {
  if (arena_) {  // carved from the arena, which unmaps it
    if (kind_ == MemoryKind::kPinned) cuda::unregister_host(buffer, unit_bytes_);
    return;
  }
  free_host(kind_, buffer, unit_bytes_);
}

Buffer BatchPool::take_locked(std::unique_lock<std::mutex>& lock) {
  std::byte* raw = nullptr;
  if (!free_.empty()) {
    raw = free_.back();
    free_.pop_back();
  } else {
    ++allocated_;  // reserve before unlocking so concurrent callers respect the capacity
    peak_allocated_ = std::max(peak_allocated_, allocated_);
    std::byte* carved = nullptr;
    if (arena_ && !unregistered_.empty()) {
      carved = unregistered_.back();
      unregistered_.pop_back();
    }
    lock.unlock();
    try {
      if (arena_) {
        // The arena holds capacity_ buffers by construction (create_shared checks the budget).
        if (carved == nullptr) carved = arena_->carve(buffer_bytes_);
        if (carved == nullptr) throw std::bad_alloc();
        if (kind_ == MemoryKind::kPinned) cuda::register_host(carved, unit_bytes_);
        raw = carved;
      } else {
        raw = static_cast<std::byte*>(allocate_host(kind_, unit_bytes_));
      }
    } catch (...) {
      lock.lock();
      --allocated_;
      if (carved != nullptr) unregistered_.push_back(carved);  // carved memory is never lost
      throw;
    }
  }
  return Buffer(raw, Return{shared_from_this()});
}

void BatchPool::reclaim_locked() {
  for (size_t i = 0; i < fenced_.size();) {
    std::vector<std::unique_ptr<Fence>>& fences = fenced_[i].fences;
    std::erase_if(fences, [](const std::unique_ptr<Fence>& f) { return f->completed(); });
    if (!fences.empty()) {
      ++i;
      continue;
    }
    free_.push_back(fenced_[i].buffer);
    fenced_[i] = std::move(fenced_.back());
    fenced_.pop_back();
  }
}

Buffer BatchPool::acquire_until(std::stop_token stop, std::optional<Clock::time_point> deadline) {
  std::unique_lock lock(mu_);
  auto poll = std::chrono::duration_cast<Clock::duration>(kFencePollMin);
  for (;;) {
    reclaim_locked();
    if (can_take_locked()) return take_locked(lock);
    if (stop.stop_requested()) return nullptr;
    const auto now = Clock::now();
    if (deadline && now >= *deadline) return nullptr;
    if (fenced_.empty()) {
      // Only a release can help: wait for it (a release of a fenced buffer wakes everyone, who
      // then polls).
      auto woken = [this] { return can_take_locked() || !fenced_.empty(); };
      if (deadline)
        available_.wait_until(lock, stop, *deadline, woken);
      else
        available_.wait(lock, stop, woken);
    } else {
      // A fence completes without telling anyone: look again after `poll`, backing off.
      const auto wake = deadline ? std::min(now + poll, *deadline) : now + poll;
      available_.wait_until(lock, stop, wake, [this] { return can_take_locked(); });
      poll = std::min<Clock::duration>(poll * 2, kFencePollMax);
    }
  }
}

Buffer BatchPool::acquire(std::stop_token stop) { return acquire_until(stop, std::nullopt); }

Buffer BatchPool::acquire_for(std::stop_token stop, std::chrono::milliseconds timeout) {
  return acquire_until(stop, Clock::now() + timeout);
}

void BatchPool::add_fence(const std::byte* buffer, std::unique_ptr<Fence> fence) {
  if (!fence || fence->completed()) return;
  std::lock_guard lock(mu_);
  std::vector<std::unique_ptr<Fence>>& fences = held_fences_[buffer];
  // Keep the list as short as the GPU work still pending (a buffer exported many times).
  std::erase_if(fences, [](const std::unique_ptr<Fence>& f) { return f->completed(); });
  fences.push_back(std::move(fence));
}

std::shared_ptr<BatchPool> BatchPool::owner(const Buffer& buffer) {
  const Return* r = std::get_deleter<Return>(buffer);
  return r != nullptr ? r->pool : nullptr;
}

void BatchPool::release(std::byte* buffer) {
  bool fenced = false;
  {
    std::lock_guard lock(mu_);
    auto it = held_fences_.find(buffer);
    if (it == held_fences_.end()) {
      free_.push_back(buffer);
    } else {
      fenced_.push_back({buffer, std::move(it->second)});
      held_fences_.erase(it);
      fenced = true;
    }
  }
  // A fenced buffer wakes every waiter: each then polls (see acquire_until).
  if (fenced)
    available_.notify_all();
  else
    available_.notify_one();
}

bool BatchPool::exhausted() const {
  std::lock_guard lock(mu_);
  return !can_take_locked() && fenced_.empty();
}

size_t BatchPool::bytes_allocated() const {
  std::lock_guard lock(mu_);
  return allocated_ * buffer_bytes_;
}

size_t BatchPool::peak_bytes_allocated() const {
  std::lock_guard lock(mu_);
  return peak_allocated_ * buffer_bytes_;
}

size_t BatchPool::pinned_bytes() const {
  if (kind_ != MemoryKind::kPinned) return 0;
  std::lock_guard lock(mu_);
  return allocated_ * unit_bytes_;
}

size_t BatchPool::fenced_buffers() const {
  std::lock_guard lock(mu_);
  return std::count_if(fenced_.begin(), fenced_.end(), [](const Fenced& f) {
    return std::any_of(f.fences.begin(), f.fences.end(),
                       [](const std::unique_ptr<Fence>& fence) { return !fence->completed(); });
  });
}

}  // namespace stoker
