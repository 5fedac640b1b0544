// Internal: more of the CUDA driver, for modules that need entry points cuda.h does not wrap (the
// GPU JPEG decoder's kernels and device memory). The driver stays loaded once, by cuda.cc: these
// functions hand out its symbols and contexts, so there is one libcuda handle, one fork guard,
// one set of retained primary contexts and one context guard in the process.
#pragma once

namespace stoker::cuda::internal {

// The driver's entry point `name` (e.g. "cuLaunchKernel"), or nullptr when CUDA is not usable in
// this process (no driver, no device, a forked child) or the driver lacks it.
void* driver_symbol(const char* name);

// The primary context of `device` (a CUcontext), retained for the life of the process.
// Throws Error without CUDA, InvalidArgument for a device that does not exist.
void* primary_context(int device);

// The one way Stoker makes a context current: pushes `context` (a CUcontext) on this thread's
// context stack in the constructor, pops it in the destructor. Throws Error without CUDA or when
// the push fails; nothing is then left pushed. Movable: the moved-from guard pops nothing, so a
// caller can take the context, do work that may throw, and only then keep the guard (GPU
// decode's batch: begin() to end()). A guard pops on the thread that pushed: do not move it to
// another thread.
class ContextGuard {
 public:
  explicit ContextGuard(void* context);
  // The primary context of `device` (primary_context(device)), current for the guard's life.
  static ContextGuard for_device(int device) { return ContextGuard(primary_context(device)); }
  ~ContextGuard();
  ContextGuard(ContextGuard&& other) noexcept : pushed_(other.pushed_) { other.pushed_ = false; }
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;
  ContextGuard& operator=(ContextGuard&&) = delete;

 private:
  bool pushed_ = false;
};

}  // namespace stoker::cuda::internal
