#include "stoker/memory.h"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>
#include <new>

#include "stoker/errors.h"

namespace stoker {
namespace {

// The few CUDA driver entry points Stoker needs, resolved from libcuda.so.1 at run time.
struct CudaDriver {
  using CUresult = int;
  using CUdevice = int;
  using CUcontext = void*;
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*device_get_count)(int*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*ctx_push)(CUcontext) = nullptr;
  CUresult (*ctx_pop)(CUcontext*) = nullptr;
  CUresult (*mem_host_alloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*mem_free_host)(void*) = nullptr;
  CUcontext context = nullptr;  // the primary context of device 0, retained for the process
  bool usable = false;

  CudaDriver() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    auto sym = [lib](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      return fn != nullptr;
    };
    if (!(sym(init, "cuInit") && sym(device_get_count, "cuDeviceGetCount") &&
          sym(device_get, "cuDeviceGet") && sym(primary_ctx_retain, "cuDevicePrimaryCtxRetain") &&
          sym(ctx_push, "cuCtxPushCurrent_v2") && sym(ctx_pop, "cuCtxPopCurrent_v2") &&
          sym(mem_host_alloc, "cuMemHostAlloc") && sym(mem_free_host, "cuMemFreeHost")))
      return;
    int count = 0;
    CUdevice device = 0;
    if (init(0) != 0 || device_get_count(&count) != 0 || count == 0) return;
    if (device_get(&device, 0) != 0 || primary_ctx_retain(&context, device) != 0) return;
    usable = true;
  }

  void* alloc(size_t bytes) {
    constexpr unsigned kPortable = 0x01;  // CU_MEMHOSTALLOC_PORTABLE: pinned for every context
    void* ptr = nullptr;
    CUcontext popped = nullptr;
    if (ctx_push(context) != 0) throw std::bad_alloc();
    const CUresult rc = mem_host_alloc(&ptr, bytes, kPortable);
    ctx_pop(&popped);
    if (rc != 0) throw std::bad_alloc();
    return ptr;
  }
};

CudaDriver& driver() {
  static CudaDriver d;  // thread-safe initialization; never destroyed before buffers are freed
  return d;
}

}  // namespace

bool cuda_available() { return driver().usable; }

void* allocate_host(MemoryKind kind, size_t bytes) {
  if (kind == MemoryKind::kPinned) {
    if (!cuda_available()) throw Error("pinned memory needs a CUDA driver and device");
    return driver().alloc(bytes);
  }
  constexpr size_t kAlign = 4096;
  void* ptr = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  if (ptr == nullptr) throw std::bad_alloc();
  return ptr;
}

void free_host(MemoryKind kind, void* ptr) {
  if (ptr == nullptr) return;
  if (kind == MemoryKind::kPinned)
    driver().mem_free_host(ptr);
  else
    std::free(ptr);
}

size_t physical_memory_bytes() {
  return static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

}  // namespace stoker
