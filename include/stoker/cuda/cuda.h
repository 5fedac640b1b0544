// The CUDA driver, loaded at run time: the few entry points Stoker needs, and nothing else.
//
// libcuda.so.1 is opened with dlopen on first use, so Stoker builds and runs without CUDA (no CUDA
// header, no link dependency); every function here degrades to "no CUDA" when the library, a
// device or the driver's initialization is missing. Stoker uses the driver for:
// - page-locked host memory: allocated (alloc_pinned) for native batch buffers, or registered
//   (register_host) for batch buffers carved from shared memory (Python-dataset workers);
// - fences for buffer recycling: a CUDA event recorded on a stream (record_fence), queried with
//   cuEventQuery (never a device-wide synchronize on the hot path); only CUDA_SUCCESS completes
//   one: "not ready" and a refusal by a stream capture in progress (errors 900-908) leave it
//   pending, any other error (a dead context) completes it;
// - device figures for diagnosis (device_memory, pci_bus_id).
// Contexts are the devices' primary contexts, the ones the CUDA runtime (and so PyTorch) uses:
// memory Stoker pins and events it records belong to the same contexts as torch's tensors and
// streams. A primary context is retained the first time Stoker needs that device, and kept for
// the life of the process.
//
// Fork: CUDA may not be used in a child forked after the parent initialized it. In such a child
// (pthread_atfork), available() is false, no driver call is made, fences report completion at
// once and freeing or unregistering pinned memory is a no-op (the parent owns it).
//
// Graph capture: the driver calls here (event record and query, pinned allocation and
// registration) run in the relaxed stream-capture mode on the calling thread
// (cuThreadExchangeStreamCaptureMode; the thread's mode is restored after), so that a user's
// torch.cuda.graph capture on another thread neither refuses them nor is invalidated by them.
//
// Thread safety: every function is safe to call from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/fence.h"

namespace stoker {

// True when a CUDA driver loads and reports at least one device, in a process that may use it.
bool cuda_available();

namespace cuda {

// Devices the driver reports (0 without CUDA).
int device_count();

// The device whose primary context pins host memory (pinned memory is portable: usable by every
// device's copies). Default: the lowest device whose primary context is already active (e.g.
// initialized by torch), else LOCAL_RANK when torchrun set it, else 0. A loader with
// device="cuda:N" sets N before it allocates, so no other device's context is created.
// REQUIRES: 0 <= device < device_count().
void set_host_device(int device);

// Page-locked memory (cuMemHostAlloc, portable): exactly `bytes` bytes, no rounding beyond the
// driver's page. Throws std::bad_alloc when the driver refuses, Error without CUDA.
void* alloc_pinned(size_t bytes);
// REQUIRES: `ptr` came from alloc_pinned(bytes).
void free_pinned(void* ptr, size_t bytes);

// Page-locks the existing mapping [ptr, ptr + bytes) (cuMemHostRegister, portable), and keeps it
// inherited by fork() (MADV_DOFORK): a MAP_SHARED mapping has no copy-on-write, so processes
// forked later keep writing the same pages. REQUIRES: ptr and bytes are multiples of 4096.
// Throws Error when the driver refuses (the message says why), or without CUDA.
void register_host(void* ptr, size_t bytes);
// REQUIRES: [ptr, ptr + bytes) was registered by register_host.
void unregister_host(void* ptr, size_t bytes);

// Bytes this process holds page-locked through the two calls above.
uint64_t pinned_bytes();

// Devices whose primary context is active in this process (torch or Stoker created it).
std::vector<int> active_devices();

// A fence on the work queued so far on `stream` of `device`: a CUDA event (timing disabled)
// recorded there now. `stream` is a CUstream / cudaStream_t handle (0: the legacy default stream),
// as torch's `Stream.cuda_stream` gives it. Throws Error when the driver refuses.
std::unique_ptr<Fence> record_fence(int device, uintptr_t stream);

// Waits for all work on `device` (cuCtxSynchronize). Blocking: for fallbacks and teardown only.
void synchronize(int device);

struct DeviceMemory {
  uint64_t free = 0, total = 0;
};
// Free and total memory of `device` (its primary context is retained: call it for devices in use).
DeviceMemory device_memory(int device);

// "0000:3b:00.0": how NVML (which numbers devices its own way) finds the same device. Empty when
// unknown.
std::string pci_bus_id(int device);

}  // namespace cuda
}  // namespace stoker
