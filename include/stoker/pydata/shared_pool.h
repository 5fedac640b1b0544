// Batch buffers in shared memory for Python-dataset workers (the Python-dataset wing's API, for
// Stoker's own bindings).
//
// A SharedPool is a BatchPool carved from one SharedArena (a memfd): the consumer acquires a
// buffer for each batch it hands to a worker process, the worker writes the batch's leaves at the
// buffer's offset in its own mapping of the arena, and the consumer exports the leaves as tensors
// viewing the buffer, without a copy. The buffer returns to the pool when the last owner here dies
// (the Lease and every array viewing it): the pool bounds how much memory batches use.
//
// RSS: when the last owner dies, this process drops its mapping of the buffer's pages (the data
// stays in the memfd, which the pool reuses), so a buffer counts in the consumer's RSS only while
// a batch in it is alive. Workers drop their pages after writing (SharedArena::drop_pages).
//
// Pinned: a pinned pool registers each buffer's pages with CUDA (cuMemHostRegister) when it is
// first carved, so a batch in it is copied to a GPU by DMA, without a staging copy. Its pages stay
// mapped (registered pages must stay resident), and a buffer whose last tensor dies returns to
// the pool only once the GPU work that may still read it has completed (fences, batch_pool.h).
//
// Thread safety: all members are safe to call concurrently.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>

#include "stoker/batch_pool.h"
#include "stoker/shared_arena.h"

namespace stoker::python {

// Each array leaf of a batch starts at a multiple of this many bytes in its buffer (a cache line:
// workers writing neighbouring leaves never share one). python/stoker/pydata/batch_structure.py
// reads it from _native.pydata.LEAF_ALIGNMENT.
inline constexpr size_t kLeafAlignment = 64;

// One buffer of a SharedPool, held by the consumer while a worker fills it.
struct Lease {
  Buffer buffer;      // the buffer; its deleter drops this process's pages, then recycles it
  size_t offset = 0;  // its byte offset in the arena (what a worker is told)
};

class SharedPool {
 public:
  // Buffers of `buffer_bytes`, as many as fit in `budget_bytes` (at least one); page-locked when
  // `pinned` (REQUIRES: a CUDA driver and device, else Error on the first acquire()).
  // REQUIRES: 0 < buffer_bytes <= budget_bytes (InvalidArgument otherwise).
  SharedPool(size_t buffer_bytes, size_t budget_bytes, bool pinned = false);

  // A free buffer, or nullptr after `timeout` (0: do not wait).
  std::shared_ptr<Lease> acquire(std::chrono::milliseconds timeout);

  const std::shared_ptr<SharedArena>& arena() const { return arena_; }
  const BatchPool& pool() const { return *pool_; }
  const std::shared_ptr<BatchPool>& shared_pool() const { return pool_; }
  bool pinned() const { return pool_->kind() == MemoryKind::kPinned; }

 private:
  std::shared_ptr<SharedArena> arena_;
  std::shared_ptr<BatchPool> pool_;
};

}  // namespace stoker::python
