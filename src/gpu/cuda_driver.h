// Internal: more of the CUDA driver, for modules that need entry points cuda.h does not wrap (the
// GPU JPEG decoder's kernels and device memory). The driver stays loaded once, by cuda.cc: these
// functions hand out its symbols and contexts, so there is one libcuda handle, one fork guard and
// one set of retained primary contexts in the process.
#pragma once

namespace stoker::cuda::internal {

// The driver's entry point `name` (e.g. "cuLaunchKernel"), or nullptr when CUDA is not usable in
// this process (no driver, no device, a forked child) or the driver lacks it.
void* driver_symbol(const char* name);

// The primary context of `device` (a CUcontext), retained for the life of the process.
// Throws Error without CUDA, InvalidArgument for a device that does not exist.
void* primary_context(int device);

}  // namespace stoker::cuda::internal
