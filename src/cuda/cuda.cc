#include "stoker/cuda/cuda.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <thread>
#include <type_traits>

#include "cuda/cuda_driver.h"
#include "stoker/errors.h"

namespace stoker {
namespace {

// The driver API's types, declared here so that no CUDA header is needed.
using CUresult = int;
using CUdevice = int;
using CUcontext = void*;
using CUevent = void*;
using CUstream = void*;
constexpr CUresult kSuccess = 0;
constexpr CUresult kNotReady = 600;        // CUDA_ERROR_NOT_READY
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900) ... CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD (908):
// the call conflicted with a stream capture in progress (a user's torch.cuda.graph), and says
// nothing about the event.
constexpr CUresult kCaptureErrorFirst = 900, kCaptureErrorLast = 908;
constexpr int kCaptureModeRelaxed = 2;     // CU_STREAM_CAPTURE_MODE_RELAXED
constexpr unsigned kPortable = 0x01;       // CU_MEMHOSTALLOC_PORTABLE, CU_MEMHOSTREGISTER_PORTABLE
constexpr unsigned kEventNoTiming = 0x02;  // CU_EVENT_DISABLE_TIMING: the cheapest event

// Fork: set in a child forked from a process that had loaded the driver (it may have initialized
// it, and CUDA must then not be used in the child).
std::atomic<bool> forked_child{false};
bool driver_in_parent = false;  // written by the forking thread just before fork()

// Whether libcuda is loaded (by Stoker, torch or anyone): dl_iterate_phdr, not dlopen/dlclose,
// which could unload a library, and so take glibc's atfork lock, which fork holds here.
int find_driver(dl_phdr_info* info, size_t, void*) {
  return info->dlpi_name != nullptr && std::strstr(info->dlpi_name, "/libcuda.so") != nullptr;
}
void before_fork() { driver_in_parent = dl_iterate_phdr(find_driver, nullptr) != 0; }
void in_forked_child() {
  if (driver_in_parent) forked_child.store(true, std::memory_order_relaxed);
}
const int fork_handlers = pthread_atfork(before_fork, nullptr, in_forked_child);

struct Driver {
  CUresult (*init)(unsigned) = nullptr;
  CUresult (*device_get_count)(int*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*primary_ctx_retain)(CUcontext*, CUdevice) = nullptr;
  CUresult (*primary_ctx_get_state)(CUdevice, unsigned*, int*) = nullptr;
  CUresult (*ctx_push)(CUcontext) = nullptr;
  CUresult (*ctx_pop)(CUcontext*) = nullptr;
  CUresult (*ctx_synchronize)() = nullptr;
  CUresult (*mem_host_alloc)(void**, size_t, unsigned) = nullptr;
  CUresult (*mem_free_host)(void*) = nullptr;
  CUresult (*mem_host_register)(void*, size_t, unsigned) = nullptr;
  CUresult (*mem_host_unregister)(void*) = nullptr;
  CUresult (*event_create)(CUevent*, unsigned) = nullptr;
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*event_query)(CUevent) = nullptr;
  CUresult (*event_synchronize)(CUevent) = nullptr;
  CUresult (*event_destroy)(CUevent) = nullptr;
  CUresult (*mem_get_info)(size_t*, size_t*) = nullptr;
  CUresult (*device_get_pci_bus_id)(char*, int, CUdevice) = nullptr;
  CUresult (*get_error_name)(CUresult, const char**) = nullptr;
  // Optional (CUDA >= 10.1): without it there is no capture mode to relax.
  CUresult (*thread_exchange_capture_mode)(int*) = nullptr;

  void* lib = nullptr;            // libcuda, never closed
  std::vector<CUdevice> devices;  // by ordinal; set once in the constructor
  bool loaded = false;            // every entry point resolved, cuInit succeeded, >= 1 device

  std::mutex mu;
  std::vector<CUcontext> contexts;     // guarded by mu; retained primary contexts (or nullptr)
  std::map<void*, int> pinned_device;  // guarded by mu; pinned range -> device that pinned it
  std::atomic<int> host_device{-1};    // set_host_device(); -1 = choose (see cuda.h)
  std::atomic<uint64_t> pinned{0};

  Driver() {
    if (forked_child.load()) return;
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    auto sym = [this](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      return fn != nullptr;
    };
    const bool resolved =
        sym(init, "cuInit") && sym(device_get_count, "cuDeviceGetCount") &&
        sym(device_get, "cuDeviceGet") && sym(primary_ctx_retain, "cuDevicePrimaryCtxRetain") &&
        sym(primary_ctx_get_state, "cuDevicePrimaryCtxGetState") &&
        sym(ctx_push, "cuCtxPushCurrent_v2") && sym(ctx_pop, "cuCtxPopCurrent_v2") &&
        sym(ctx_synchronize, "cuCtxSynchronize") && sym(mem_host_alloc, "cuMemHostAlloc") &&
        sym(mem_free_host, "cuMemFreeHost") && sym(mem_host_register, "cuMemHostRegister_v2") &&
        sym(mem_host_unregister, "cuMemHostUnregister") && sym(event_create, "cuEventCreate") &&
        sym(event_record, "cuEventRecord") && sym(event_query, "cuEventQuery") &&
        sym(event_synchronize, "cuEventSynchronize") && sym(event_destroy, "cuEventDestroy_v2") &&
        sym(mem_get_info, "cuMemGetInfo_v2") && sym(device_get_pci_bus_id, "cuDeviceGetPCIBusId") &&
        sym(get_error_name, "cuGetErrorName");
    sym(thread_exchange_capture_mode, "cuThreadExchangeStreamCaptureMode");
    int count = 0;
    if (!resolved || init(0) != kSuccess || device_get_count(&count) != kSuccess || count <= 0)
      return;  // the library stays loaded: unloading a driver is never worth the risk
    for (int i = 0; i < count; ++i) {
      CUdevice d = 0;
      if (device_get(&d, i) != kSuccess) return;
      devices.push_back(d);
    }
    contexts.assign(devices.size(), nullptr);
    loaded = true;
  }

  bool usable() const { return loaded && !forked_child.load(std::memory_order_relaxed); }

  Error error(const char* call, CUresult rc) const {
    const char* name = nullptr;
    if (get_error_name == nullptr || get_error_name(rc, &name) != kSuccess || name == nullptr)
      name = "unknown error";
    return Error(std::string("CUDA driver: ") + call + " failed: " + name + " (" +
                 std::to_string(rc) + ")");
  }

  void require(int device) const {
    if (!usable()) throw Error("CUDA is not available in this process");
    if (device < 0 || device >= static_cast<int>(devices.size()))
      throw InvalidArgument("CUDA device " + std::to_string(device) + " does not exist (" +
                            std::to_string(devices.size()) + " device(s))");
  }

  // The primary context of `device`, retained on first use.
  CUcontext context(int device) {
    require(device);
    std::lock_guard lock(mu);
    CUcontext& c = contexts[device];
    if (c == nullptr) {
      const CUresult rc = primary_ctx_retain(&c, devices[device]);
      if (rc != kSuccess) {
        c = nullptr;
        throw error("cuDevicePrimaryCtxRetain", rc);
      }
    }
    return c;
  }

  bool active(int device) const {
    unsigned flags = 0;
    int is_active = 0;
    return primary_ctx_get_state(devices[device], &flags, &is_active) == kSuccess && is_active;
  }

  int choose_host_device() const {
    const int chosen = host_device.load();
    if (chosen >= 0) return chosen;
    for (int d = 0; d < static_cast<int>(devices.size()); ++d)
      if (active(d)) return d;
    if (const char* rank = std::getenv("LOCAL_RANK")) {
      const int r = std::atoi(rank);
      if (r >= 0 && r < static_cast<int>(devices.size())) return r;
    }
    return 0;
  }
};

Driver& driver() {
  static Driver d;  // thread-safe initialization; never destroyed before buffers are freed
  return d;
}

using cuda::internal::ContextGuard;

bool capture_error(CUresult rc) { return rc >= kCaptureErrorFirst && rc <= kCaptureErrorLast; }

// Stoker's driver calls run on its own threads (workers, the copy stage, a dying tensor's
// thread) and touch no capturing stream. While a user captures a CUDA graph (torch.cuda.graph
// captures in the global mode), the driver would refuse such "potentially unsafe" calls on every
// thread and invalidate the capture; relaxed mode on this thread, for the scope, allows them.
// The thread's previous mode is restored at the end.
class RelaxedCapture {
 public:
  RelaxedCapture() : exchange_(driver().thread_exchange_capture_mode) {
    if (exchange_ != nullptr && exchange_(&mode_) != kSuccess) exchange_ = nullptr;
  }
  ~RelaxedCapture() {
    if (exchange_ != nullptr) exchange_(&mode_);
  }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  CUresult (*exchange_)(int*);
  int mode_ = kCaptureModeRelaxed;  // the mode to set; then the one to restore
};

class EventFence final : public Fence {
 public:
  EventFence(CUcontext context, CUevent event) : context_(context), event_(event) {}
  ~EventFence() override {
    Driver& d = driver();
    if (!d.usable()) return;  // a forked child: the event is the parent's
    try {
      RelaxedCapture relaxed;
      ContextGuard current(context_);
      d.event_destroy(event_);
    } catch (const Error&) {
      // The context is gone (driver teardown): so is the event.
    }
  }
  bool completed() override {
    Driver& d = driver();
    if (!d.usable()) return true;
    RelaxedCapture relaxed;
    const CUresult rc = d.event_query(event_);
    // Done; or pending: not ready, or a capture in progress refused the query (ask again later:
    // the copy may still be reading the buffer). Any other error means the context is dead (a
    // sticky error, driver teardown) and will run nothing more: nothing can read the buffer.
    return rc == kSuccess || (rc != kNotReady && !capture_error(rc));
  }
  void wait() override {
    Driver& d = driver();
    if (!d.usable()) return;
    RelaxedCapture relaxed;
    // A capture in progress may refuse the wait too: wait for it to end (teardown only).
    while (capture_error(d.event_synchronize(event_)))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }

 private:
  CUcontext context_;
  CUevent event_;
};

}  // namespace

bool cuda_available() { return driver().usable(); }

namespace cuda {

int device_count() {
  Driver& d = driver();
  return d.usable() ? static_cast<int>(d.devices.size()) : 0;
}

void set_host_device(int device) {
  driver().require(device);
  driver().host_device.store(device);
}

void* alloc_pinned(size_t bytes) {
  Driver& d = driver();
  if (!d.usable()) throw Error("pinned memory needs a CUDA driver and device");
  const int device = d.choose_host_device();
  void* ptr = nullptr;
  {
    RelaxedCapture relaxed;
    ContextGuard current(d.context(device));
    if (d.mem_host_alloc(&ptr, bytes, kPortable) != kSuccess) throw std::bad_alloc();
  }
  {
    std::lock_guard lock(d.mu);
    d.pinned_device[ptr] = device;
  }
  d.pinned += bytes;
  return ptr;
}

void free_pinned(void* ptr, size_t bytes) {
  Driver& d = driver();
  if (ptr == nullptr || !d.usable()) return;
  int device;
  {
    std::lock_guard lock(d.mu);
    auto it = d.pinned_device.find(ptr);
    if (it == d.pinned_device.end()) return;
    device = it->second;
    d.pinned_device.erase(it);
  }
  RelaxedCapture relaxed;
  ContextGuard current(d.context(device));
  d.mem_free_host(ptr);
  d.pinned -= bytes;
}

void register_host(void* ptr, size_t bytes) {
  Driver& d = driver();
  if (!d.usable()) throw Error("registering pinned memory needs a CUDA driver and device");
  const int device = d.choose_host_device();
  {
    RelaxedCapture relaxed;
    ContextGuard current(d.context(device));
    const CUresult rc = d.mem_host_register(ptr, bytes, kPortable);
    if (rc != kSuccess) throw d.error("cuMemHostRegister", rc);
  }
  madvise(ptr, bytes, MADV_DOFORK);  // whatever the driver advised: forked workers write here
  {
    std::lock_guard lock(d.mu);
    d.pinned_device[ptr] = device;
  }
  d.pinned += bytes;
}

void unregister_host(void* ptr, size_t bytes) {
  Driver& d = driver();
  if (ptr == nullptr || !d.usable()) return;
  int device;
  {
    std::lock_guard lock(d.mu);
    auto it = d.pinned_device.find(ptr);
    if (it == d.pinned_device.end()) return;
    device = it->second;
    d.pinned_device.erase(it);
  }
  RelaxedCapture relaxed;
  ContextGuard current(d.context(device));
  d.mem_host_unregister(ptr);
  d.pinned -= bytes;
}

uint64_t pinned_bytes() { return driver().pinned.load(); }

std::vector<int> active_devices() {
  Driver& d = driver();
  std::vector<int> out;
  if (!d.usable()) return out;
  for (int i = 0; i < static_cast<int>(d.devices.size()); ++i)
    if (d.active(i)) out.push_back(i);
  return out;
}

std::unique_ptr<Fence> record_fence(int device, uintptr_t stream) {
  Driver& d = driver();
  CUcontext context = d.context(device);
  RelaxedCapture relaxed;
  ContextGuard current(context);
  CUevent event = nullptr;
  CUresult rc = d.event_create(&event, kEventNoTiming);
  if (rc != kSuccess) throw d.error("cuEventCreate", rc);
  rc = d.event_record(event, reinterpret_cast<CUstream>(stream));
  if (rc != kSuccess) {
    d.event_destroy(event);
    throw d.error("cuEventRecord", rc);
  }
  return std::make_unique<EventFence>(context, event);
}

void synchronize(int device) {
  Driver& d = driver();
  ContextGuard current(d.context(device));
  const CUresult rc = d.ctx_synchronize();
  if (rc != kSuccess) throw d.error("cuCtxSynchronize", rc);
}

DeviceMemory device_memory(int device) {
  Driver& d = driver();
  ContextGuard current(d.context(device));
  size_t free = 0, total = 0;
  const CUresult rc = d.mem_get_info(&free, &total);
  if (rc != kSuccess) throw d.error("cuMemGetInfo", rc);
  return {free, total};
}

std::string pci_bus_id(int device) {
  Driver& d = driver();
  if (!d.usable() || device < 0 || device >= static_cast<int>(d.devices.size())) return "";
  char id[64] = {};
  if (d.device_get_pci_bus_id(id, sizeof id, d.devices[device]) != kSuccess) return "";
  return id;
}

namespace internal {

void* driver_symbol(const char* name) {
  Driver& d = driver();
  return d.usable() ? dlsym(d.lib, name) : nullptr;
}

void* primary_context(int device) { return driver().context(device); }

ContextGuard::ContextGuard(void* context) {
  Driver& d = driver();
  if (!d.usable()) throw Error("CUDA is not available in this process");
  const CUresult rc = d.ctx_push(static_cast<CUcontext>(context));
  if (rc != kSuccess) throw d.error("cuCtxPushCurrent", rc);
  pushed_ = true;
}

ContextGuard::~ContextGuard() {
  if (!pushed_) return;
  CUcontext popped = nullptr;
  driver().ctx_pop(&popped);
}

}  // namespace internal
}  // namespace cuda
}  // namespace stoker
