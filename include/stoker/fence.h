// A fence: "the GPU work queued before this point has finished", as a pinned batch buffer needs
// before it may be written again.
//
// A pinned buffer handed to torch can be the source of an asynchronous copy that is queued but not
// yet done when the last tensor viewing it dies. Whoever drops a buffer that the GPU may still
// read records a fence for it (BatchPool::add_fence); the pool hands the buffer out again only once
// every fence recorded for it has completed. On a GPU a fence is a CUDA event recorded on a stream
// (include/stoker/cuda/cuda.h); tests use fences whose completion they control.
//
// Thread safety: completed() and wait() may be called from any thread, but never concurrently on
// one fence (the pool calls them under its lock).
#pragma once

namespace stoker {

class Fence {
 public:
  virtual ~Fence() = default;
  // True once the work the fence guards has finished. Must not block: the pool polls it (under
  // its lock) whenever it looks for a free buffer.
  virtual bool completed() = 0;
  // Blocks until completed() would return true. Used only when a pool is destroyed with fences
  // pending (teardown, never the hot path).
  virtual void wait() = 0;
};

}  // namespace stoker
