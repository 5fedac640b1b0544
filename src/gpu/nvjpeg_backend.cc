// The CUDA device behind the GPU stage (backend.h): nvJPEG's batched decode and the kernels of
// kernels.h compiled at run time by NVRTC, all through libraries opened with dlopen (no CUDA
// header or library at build time). The driver comes from cuda.cc (one libcuda handle).
//
// Why NVRTC and not nvcc: one build serves the CPU-only machines and CI (no CUDA toolkit) and the
// GPU machines; the kernels are compiled for the device actually present (its exact sm_XY), and
// their source is the same file the host compiles for the CPU reference the tests check, so the
// arithmetic that runs on the GPU is the arithmetic tested here. The cost is a compilation of
// about a second, once per process and device.
//
// Decoders: a handle with NVJPEG_BACKEND_HARDWARE where the GPU has the JPEG engine (A100, H100:
// nvjpegCreateEx returns NVJPEG_STATUS_ARCH_MISMATCH elsewhere), and one with
// NVJPEG_BACKEND_GPU_HYBRID for the files the hardware does not take (nvjpegDecodeBatchedSupported)
// and for GPUs without the engine. Each has two decode states used alternately by successive
// batches; a batch waits (host) for the event of the batch before last before reusing its state
// and its pinned descriptor staging, so at most two batches are in flight here. Within a batch,
// chunks (decode() calls) share the slot's states: each chunk waits (host) for the previous
// chunk's nvJPEG work (an event recorded after it) before reusing them (see decode()).
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "cuda/cuda_driver.h"
#include "backend.h"
#include "dynlib.h"
#include "stoker/cuda/cuda.h"
#include "stoker/errors.h"

namespace stoker::image::gpu {
namespace {

// ---- the CUDA driver (types declared here: no CUDA header) --------------------------------------
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void*;
using CUstream = void*;
using CUevent = void*;
using CUmodule = void*;
using CUfunction = void*;
constexpr int kAttrMajor = 75, kAttrMinor = 76;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_*
constexpr unsigned kEventNoTiming = 0x02;

struct Driver {
  CUresult (*device_get)(CUdevice*, int);
  CUresult (*device_attribute)(int*, int, CUdevice);
  CUresult (*mem_alloc)(CUdeviceptr*, size_t);
  CUresult (*mem_free)(CUdeviceptr);
  CUresult (*memcpy_htod_async)(CUdeviceptr, const void*, size_t, CUstream);
  CUresult (*memcpy_htod)(CUdeviceptr, const void*, size_t);
  CUresult (*stream_synchronize)(CUstream);
  CUresult (*event_create)(CUevent*, unsigned);
  CUresult (*event_record)(CUevent, CUstream);
  CUresult (*event_synchronize)(CUevent);
  CUresult (*event_destroy)(CUevent);
  CUresult (*module_load_data)(CUmodule*, const void*);
  CUresult (*module_get_function)(CUfunction*, CUmodule, const char*);
  CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                     unsigned, CUstream, void**, void**);
  CUresult (*mem_host_alloc)(void**, size_t, unsigned);
  CUresult (*mem_free_host)(void*);
  CUresult (*error_name)(CUresult, const char**);

  void check(CUresult rc, const char* call) const {
    if (rc == 0) return;
    const char* name = nullptr;
    if (error_name == nullptr || error_name(rc, &name) != 0 || name == nullptr) name = "unknown";
    throw Error(std::string("CUDA driver: ") + call + " failed: " + name + " (" +
                std::to_string(rc) + ")");
  }
};

template <typename F>
void resolve(F& fn, const char* name, std::string& missing) {
  fn = reinterpret_cast<F>(cuda::internal::driver_symbol(name));
  if (fn == nullptr) missing += std::string(missing.empty() ? "" : ", ") + name;
}

const Driver& driver() {
  static const Driver d = [] {
    if (!cuda_available())
      throw Error("GPU decode needs CUDA: no CUDA driver or device is available in this process");
    Driver d{};
    std::string missing;
    resolve(d.device_get, "cuDeviceGet", missing);
    resolve(d.device_attribute, "cuDeviceGetAttribute", missing);
    resolve(d.mem_alloc, "cuMemAlloc_v2", missing);
    resolve(d.mem_free, "cuMemFree_v2", missing);
    resolve(d.memcpy_htod_async, "cuMemcpyHtoDAsync_v2", missing);
    resolve(d.memcpy_htod, "cuMemcpyHtoD_v2", missing);
    resolve(d.stream_synchronize, "cuStreamSynchronize", missing);
    resolve(d.event_create, "cuEventCreate", missing);
    resolve(d.event_record, "cuEventRecord", missing);
    resolve(d.event_synchronize, "cuEventSynchronize", missing);
    resolve(d.event_destroy, "cuEventDestroy_v2", missing);
    resolve(d.module_load_data, "cuModuleLoadData", missing);
    resolve(d.module_get_function, "cuModuleGetFunction", missing);
    resolve(d.launch, "cuLaunchKernel", missing);
    resolve(d.mem_host_alloc, "cuMemHostAlloc", missing);
    resolve(d.mem_free_host, "cuMemFreeHost", missing);
    resolve(d.error_name, "cuGetErrorName", missing);
    if (!missing.empty()) throw Error("GPU decode: the CUDA driver lacks " + missing);
    return d;
  }();
  return d;
}

// The device's primary context, current for the scope (cuda.cc's guard).
using Current = cuda::internal::ContextGuard;

// ---- nvJPEG (nvjpeg.h's declarations, the few used)
// ----------------------------------------------
using nvjpegStatus_t = int;
using nvjpegHandle_t = void*;
using nvjpegJpegState_t = void*;
using nvjpegJpegStream_t = void*;
constexpr int kBackendGpuHybrid = 2, kBackendHardware = 3;
constexpr int kOutputRGBI = 5;
struct NvjpegImage {
  unsigned char* channel[4];
  size_t pitch[4];
};
struct DevAllocator {
  int (*dev_malloc)(void**, size_t);
  int (*dev_free)(void*);
};
struct PinnedAllocator {
  int (*pinned_malloc)(void**, size_t, unsigned);
  int (*pinned_free)(void*);
};

struct Nvjpeg {
  void* lib = nullptr;
  std::string path;
  nvjpegStatus_t (*create_ex)(int, DevAllocator*, PinnedAllocator*, unsigned, nvjpegHandle_t*);
  nvjpegStatus_t (*destroy)(nvjpegHandle_t);
  nvjpegStatus_t (*state_create)(nvjpegHandle_t, nvjpegJpegState_t*);
  nvjpegStatus_t (*state_destroy)(nvjpegJpegState_t);
  nvjpegStatus_t (*batched_initialize)(nvjpegHandle_t, nvjpegJpegState_t, int, int, int);
  nvjpegStatus_t (*batched)(nvjpegHandle_t, nvjpegJpegState_t, const unsigned char* const*,
                            const size_t*, NvjpegImage*, CUstream);
  nvjpegStatus_t (*decode)(nvjpegHandle_t, nvjpegJpegState_t, const unsigned char*, size_t, int,
                           NvjpegImage*, CUstream);
  nvjpegStatus_t (*stream_create)(nvjpegHandle_t, nvjpegJpegStream_t*);
  nvjpegStatus_t (*stream_destroy)(nvjpegJpegStream_t);
  nvjpegStatus_t (*parse_header)(nvjpegHandle_t, const unsigned char*, size_t, nvjpegJpegStream_t);
  nvjpegStatus_t (*batched_supported)(nvjpegHandle_t, nvjpegJpegStream_t, int*);
};

// ---- NVRTC
// ----------------------------------------------------------------------------------------
using nvrtcProgram = void*;
struct Nvrtc {
  void* lib = nullptr;
  std::string path;
  int (*create)(nvrtcProgram*, const char*, const char*, int, const char* const*,
                const char* const*);
  int (*compile)(nvrtcProgram, int, const char* const*);
  int (*log_size)(nvrtcProgram, size_t*);
  int (*log)(nvrtcProgram, char*);
  int (*ptx_size)(nvrtcProgram, size_t*);
  int (*ptx)(nvrtcProgram, char*);
  int (*cubin_size)(nvrtcProgram, size_t*);  // optional (CUDA >= 11.1)
  int (*cubin)(nvrtcProgram, char*);         // optional
  int (*num_archs)(int*);                    // optional (CUDA >= 11.2)
  int (*archs)(int*);                        // optional
  int (*destroy)(nvrtcProgram*);
  const char* (*error)(int);
};

template <typename F>
bool sym(void* lib, F& fn, const char* name) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

// Sonames of CUDA 13, 12 and 11 (toolkits and pip wheels) and unversioned development links.
const std::vector<std::string> kNvjpegSonames = {"libnvjpeg.so.13", "libnvjpeg.so.12",
                                                 "libnvjpeg.so.11", "libnvjpeg.so"};
const std::vector<std::string> kNvrtcSonames = {"libnvrtc.so.13", "libnvrtc.so.12",
                                                "libnvrtc.so.11.2", "libnvrtc.so"};

const Nvjpeg& nvjpeg(const std::vector<std::string>& dirs) {
  static std::mutex mu;
  static Nvjpeg lib;
  std::lock_guard lock(mu);
  if (lib.lib != nullptr) return lib;
  std::string tried;
  void* h = internal::open_library({"libnvjpeg"}, kNvjpegSonames, dirs, "nvjpegCreateEx", &tried);
  if (h == nullptr)
    throw Error(
        "GPU decode needs nvJPEG (libnvjpeg, CUDA 11-13), which was not found; install "
        "the CUDA toolkit or the pip package nvidia-nvjpeg (torchvision's CUDA wheels "
        "bundle it too). Tried:" +
        tried);
  Nvjpeg n;
  const bool ok = sym(h, n.create_ex, "nvjpegCreateEx") && sym(h, n.destroy, "nvjpegDestroy") &&
                  sym(h, n.state_create, "nvjpegJpegStateCreate") &&
                  sym(h, n.state_destroy, "nvjpegJpegStateDestroy") &&
                  sym(h, n.batched_initialize, "nvjpegDecodeBatchedInitialize") &&
                  sym(h, n.batched, "nvjpegDecodeBatched") && sym(h, n.decode, "nvjpegDecode") &&
                  sym(h, n.stream_create, "nvjpegJpegStreamCreate") &&
                  sym(h, n.stream_destroy, "nvjpegJpegStreamDestroy") &&
                  sym(h, n.parse_header, "nvjpegJpegStreamParseHeader") &&
                  sym(h, n.batched_supported, "nvjpegDecodeBatchedSupported");
  n.path = internal::library_path(h);
  if (!ok) throw Error("GPU decode: " + n.path + " lacks the nvJPEG batched API (CUDA >= 11)");
  n.lib = h;
  lib = n;
  return lib;
}

const Nvrtc& nvrtc(const std::vector<std::string>& dirs) {
  static std::mutex mu;
  static Nvrtc lib;
  std::lock_guard lock(mu);
  if (lib.lib != nullptr) return lib;
  std::string tried;
  void* h = internal::open_library({"libnvrtc.so", "libnvrtc-"}, kNvrtcSonames, dirs,
                                   "nvrtcCreateProgram", &tried);
  if (h == nullptr)
    throw Error(
        "GPU decode compiles its kernels with NVRTC (libnvrtc), which was not found; "
        "install the CUDA toolkit or the pip package nvidia-cuda-nvrtc (a CUDA build of "
        "torch depends on it). Tried:" +
        tried);
  Nvrtc n;
  const bool ok =
      sym(h, n.create, "nvrtcCreateProgram") && sym(h, n.compile, "nvrtcCompileProgram") &&
      sym(h, n.log_size, "nvrtcGetProgramLogSize") && sym(h, n.log, "nvrtcGetProgramLog") &&
      sym(h, n.ptx_size, "nvrtcGetPTXSize") && sym(h, n.ptx, "nvrtcGetPTX") &&
      sym(h, n.destroy, "nvrtcDestroyProgram") && sym(h, n.error, "nvrtcGetErrorString");
  sym(h, n.cubin_size, "nvrtcGetCUBINSize");
  sym(h, n.cubin, "nvrtcGetCUBIN");
  sym(h, n.num_archs, "nvrtcGetNumSupportedArchs");
  sym(h, n.archs, "nvrtcGetSupportedArchs");
  n.path = internal::library_path(h);
  if (!ok) throw Error("GPU decode: " + n.path + " lacks the NVRTC API");
  // NVRTC dlopens libnvrtc-builtins.so.<major>.<minor> by bare name when it compiles; from a
  // wheel's directory (nvidia/cu13/lib, on no search path) the loader finds it only as the
  // already loaded library of that soname: load it now from NVRTC's own directory. A failure here
  // surfaces as NVRTC's own error at compile time.
  internal::load_companions(n.path, {"libnvrtc-builtins.so"}, nullptr);
  n.lib = h;
  lib = n;
  return lib;
}

// nvJPEG's own buffers, allocated through the driver and counted (the allocator API has no
// context argument: process-wide counters).
std::atomic<uint64_t> nvjpeg_device_bytes{0}, nvjpeg_pinned_bytes{0};
std::mutex sizes_mu;
std::unordered_map<void*, size_t> sizes;  // guarded by sizes_mu

void remember(void* p, size_t n, std::atomic<uint64_t>& counter) {
  std::lock_guard lock(sizes_mu);
  sizes[p] = n;
  counter += n;
}
void forget(void* p, std::atomic<uint64_t>& counter) {
  std::lock_guard lock(sizes_mu);
  auto it = sizes.find(p);
  if (it == sizes.end()) return;
  counter -= it->second;
  sizes.erase(it);
}
int dev_malloc(void** p, size_t n) {
  CUdeviceptr d = 0;
  if (driver().mem_alloc(&d, n) != 0) return 2;  // cudaErrorMemoryAllocation
  *p = reinterpret_cast<void*>(d);
  remember(*p, n, nvjpeg_device_bytes);
  return 0;
}
int dev_free(void* p) {
  if (p == nullptr) return 0;
  forget(p, nvjpeg_device_bytes);
  return driver().mem_free(reinterpret_cast<CUdeviceptr>(p)) == 0 ? 0 : 1;
}
int pinned_malloc(void** p, size_t n, unsigned flags) {
  if (driver().mem_host_alloc(p, n, flags) != 0) return 2;
  remember(*p, n, nvjpeg_pinned_bytes);
  return 0;
}
int pinned_free(void* p) {
  if (p == nullptr) return 0;
  forget(p, nvjpeg_pinned_bytes);
  return driver().mem_free_host(p) == 0 ? 0 : 1;
}
DevAllocator dev_allocator{dev_malloc, dev_free};
PinnedAllocator pinned_allocator{pinned_malloc, pinned_free};

// The kernels, compiled once per process and device.
struct Kernels {
  CUfunction coeffs = nullptr, hpass = nullptr, vpass = nullptr;
};

Kernels compile_kernels(int device, const Nvrtc& rtc) {
  static std::mutex mu;
  static std::map<int, Kernels> cache;
  std::lock_guard lock(mu);
  if (auto it = cache.find(device); it != cache.end()) return it->second;
  const Driver& d = driver();
  CUdevice dev = 0;
  int major = 0, minor = 0;
  d.check(d.device_get(&dev, device), "cuDeviceGet");
  d.check(d.device_attribute(&major, kAttrMajor, dev), "cuDeviceGetAttribute");
  d.check(d.device_attribute(&minor, kAttrMinor, dev), "cuDeviceGetAttribute");
  const int arch = major * 10 + minor;
  // The device's own architecture when NVRTC knows it (a cubin: no JIT), else PTX for the
  // newest one NVRTC knows below it (the driver compiles it).
  int target = arch;
  bool exact = true;
  if (rtc.num_archs != nullptr && rtc.archs != nullptr) {
    int n = 0;
    rtc.num_archs(&n);
    std::vector<int> archs(n > 0 ? n : 0);
    if (n > 0) rtc.archs(archs.data());
    exact = std::find(archs.begin(), archs.end(), arch) != archs.end();
    if (!exact) {
      target = 0;
      for (int a : archs)
        if (a <= arch) target = std::max(target, a);
      if (target == 0) throw Error("NVRTC cannot compile for sm_" + std::to_string(arch));
    }
  }
  const bool cubin = exact && rtc.cubin != nullptr && rtc.cubin_size != nullptr;
  const std::string arch_opt =
      std::string("--gpu-architecture=") + (cubin ? "sm_" : "compute_") + std::to_string(target);
  const char* options[] = {arch_opt.c_str(), "--fmad=false"};
  nvrtcProgram prog = nullptr;
  if (int rc =
          rtc.create(&prog, internal::kKernelSource, "stoker_gpu_decode.cu", 0, nullptr, nullptr))
    throw Error(std::string("NVRTC: nvrtcCreateProgram failed: ") + rtc.error(rc));
  const int rc = rtc.compile(prog, 2, options);
  if (rc != 0) {
    size_t n = 0;
    rtc.log_size(prog, &n);
    std::string log(n, '\0');
    if (n > 0) rtc.log(prog, log.data());
    rtc.destroy(&prog);
    throw Error(std::string("NVRTC: compiling the GPU decode kernels for ") + arch_opt +
                " failed: " + rtc.error(rc) + "\n" + log);
  }
  size_t size = 0;
  std::string image;
  if (cubin) {
    rtc.cubin_size(prog, &size);
    image.resize(size);
    rtc.cubin(prog, image.data());
  } else {
    rtc.ptx_size(prog, &size);
    image.resize(size);
    rtc.ptx(prog, image.data());
  }
  rtc.destroy(&prog);
  const Current current = Current::for_device(device);
  CUmodule module = nullptr;  // kept for the life of the process, as the cache entry
  d.check(d.module_load_data(&module, image.data()), "cuModuleLoadData");
  Kernels k;
  d.check(d.module_get_function(&k.coeffs, module, "stoker_coeffs"), "cuModuleGetFunction");
  d.check(d.module_get_function(&k.hpass, module, "stoker_hpass"), "cuModuleGetFunction");
  d.check(d.module_get_function(&k.vpass, module, "stoker_vpass"), "cuModuleGetFunction");
  cache[device] = k;
  return k;
}

class NvjpegBackend final : public DecodeBackend {
 public:
  NvjpegBackend(int device, const std::vector<std::string>& dirs)
      : device_(device),
        d_(driver()),
        nv_(nvjpeg(dirs)),
        kernels_(compile_kernels(device, nvrtc(dirs))) {
    const Current current = Current::for_device(device_);
    const nvjpegStatus_t hw =
        nv_.create_ex(kBackendHardware, &dev_allocator, &pinned_allocator, 0, &hw_);
    if (hw != 0) hw_ = nullptr;  // 7, ARCH_MISMATCH: no JPEG engine on this GPU
    check(nv_.create_ex(kBackendGpuHybrid, &dev_allocator, &pinned_allocator, 0, &sw_),
          "nvjpegCreateEx(GPU_HYBRID)");
    for (int slot = 0; slot < 2; ++slot) {
      if (hw_ != nullptr) check(nv_.state_create(hw_, &hw_state_[slot]), "nvjpegJpegStateCreate");
      check(nv_.state_create(sw_, &sw_state_[slot]), "nvjpegJpegStateCreate");
      d_.check(d_.event_create(&done_[slot], kEventNoTiming), "cuEventCreate");
    }
    d_.check(d_.event_create(&chunk_done_, kEventNoTiming), "cuEventCreate");
    check(nv_.state_create(sw_, &single_state_), "nvjpegJpegStateCreate");
    if (hw_ != nullptr) check(nv_.stream_create(hw_, &parse_), "nvjpegJpegStreamCreate");
  }

  ~NvjpegBackend() override {
    if (!cuda_available()) return;  // a forked child, or the driver is gone
    try {
      const Current current = Current::for_device(device_);
      if (chunk_recorded_) d_.event_synchronize(chunk_done_);
      if (chunk_done_ != nullptr) d_.event_destroy(chunk_done_);
      for (int slot = 0; slot < 2; ++slot) {
        if (recorded_[slot]) d_.event_synchronize(done_[slot]);
        if (done_[slot] != nullptr) d_.event_destroy(done_[slot]);
        if (hw_state_[slot] != nullptr) nv_.state_destroy(hw_state_[slot]);
        if (sw_state_[slot] != nullptr) nv_.state_destroy(sw_state_[slot]);
        if (staging_[slot] != nullptr) d_.mem_free_host(staging_[slot]);
      }
      if (single_state_ != nullptr) nv_.state_destroy(single_state_);
      if (parse_ != nullptr) nv_.stream_destroy(parse_);
      if (hw_ != nullptr) nv_.destroy(hw_);
      if (sw_ != nullptr) nv_.destroy(sw_);
      if (arena_ != 0) d_.mem_free(arena_);
      if (table_ != 0) d_.mem_free(table_);
    } catch (const std::exception&) {
      // The context is gone (teardown): so is everything it held.
    }
  }

  std::string name() const override { return hw_ != nullptr ? "hardware" : "gpu_hybrid"; }

  const uint8_t* upload_table(const std::vector<std::byte>& table) override {
    const Current current = Current::for_device(device_);
    d_.check(d_.mem_alloc(&table_, table.size()), "cuMemAlloc");
    d_.check(d_.memcpy_htod(table_, table.data(), table.size()), "cuMemcpyHtoD");
    table_bytes_ = table.size();
    return reinterpret_cast<const uint8_t*>(table_);
  }

  // Leaves nothing current when it throws (end() is then not called): the context is kept only
  // once the wait that may fail is done.
  void begin(uintptr_t stream) override {
    Current current = Current::for_device(device_);
    stream_ = reinterpret_cast<CUstream>(stream);
    slot_ ^= 1;
    if (recorded_[slot_]) d_.check(d_.event_synchronize(done_[slot_]), "cuEventSynchronize");
    recorded_[slot_] = false;
    chunk_recorded_ = false;  // the previous batch's chunks used the other slot's states
    current_.emplace(std::move(current));
  }

  uint8_t* arena(size_t bytes) override {
    if (bytes > arena_size_) {
      // Queued work may still use the old buffer: wait for it (growth happens a few times).
      d_.check(d_.stream_synchronize(stream_), "cuStreamSynchronize");
      if (arena_ != 0) d_.check(d_.mem_free(arena_), "cuMemFree");
      arena_ = 0;
      arena_size_ = 0;
      d_.check(d_.mem_alloc(&arena_, bytes), "cuMemAlloc (GPU decode buffer)");
      arena_size_ = bytes;
    }
    return reinterpret_cast<uint8_t*>(arena_);
  }

  std::byte* host_staging(size_t bytes) override {
    if (bytes > staging_size_[slot_]) {
      if (staging_[slot_] != nullptr) d_.mem_free_host(staging_[slot_]);
      staging_[slot_] = nullptr;
      staging_size_[slot_] = 0;
      d_.check(d_.mem_host_alloc(&staging_[slot_], bytes, 0), "cuMemHostAlloc");
      staging_size_[slot_] = bytes;
    }
    return static_cast<std::byte*>(staging_[slot_]);
  }

  void upload(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    d_.check(d_.memcpy_htod_async(reinterpret_cast<CUdeviceptr>(dst), src, bytes, stream_),
             "cuMemcpyHtoDAsync");
  }

  void decode(std::span<const JpegJob> jobs, std::vector<uint8_t>& ok,
              uint64_t* hardware) override {
    // The previous chunk of this batch used the same decode states. nvJPEG's batched call does
    // host work into a state's own buffers (parsed streams, pinned staging for its copies) and
    // queues copies and kernels reading them on the stream; nothing in its API promises that this
    // work is done when the call returns, so a next call on the same state could overwrite a
    // buffer that a queued copy has yet to read. Wait for the previous chunk's decode first
    // (a host wait, only from the second chunk of a batch on; the stream already orders the
    // device side, the arena included).
    if (chunk_recorded_) {
      chunk_recorded_ = false;
      d_.check(d_.event_synchronize(chunk_done_), "cuEventSynchronize");
    }
    std::vector<size_t> to_hw, to_sw;
    for (size_t i = 0; i < jobs.size(); ++i) {
      int unsupported = 1;
      if (hw_ != nullptr &&
          nv_.parse_header(hw_, reinterpret_cast<const unsigned char*>(jobs[i].data), jobs[i].bytes,
                           parse_) == 0 &&
          nv_.batched_supported(hw_, parse_, &unsupported) == 0 && unsupported == 0) {
        to_hw.push_back(i);
      } else {
        to_sw.push_back(i);
      }
    }
    if (!to_hw.empty() && batched(hw_, hw_state_[slot_], jobs, to_hw, ok))
      *hardware += to_hw.size();
    if (!to_sw.empty()) batched(sw_, sw_state_[slot_], jobs, to_sw, ok);
    d_.check(d_.event_record(chunk_done_, stream_), "cuEventRecord");
    chunk_recorded_ = true;
  }

  void render(const internal::k::KParams& params, int32_t max_rows) override {
    constexpr int32_t kMaxGridY = 65535;
    for (int32_t start = 0; start < params.n; start += kMaxGridY) {
      internal::k::KParams p = params;
      p.samples += start;
      p.n = std::min(kMaxGridY, params.n - start);
      const unsigned n = static_cast<unsigned>(p.n);
      void* one[] = {&p};
      void* two[] = {&p, &max_rows};
      if (max_rows > 0) {
        d_.check(d_.launch(kernels_.coeffs, blocks(p.out_w + p.out_h, 128), n, 1, 128, 1, 1, 0,
                           stream_, one, nullptr),
                 "cuLaunchKernel(stoker_coeffs)");
        d_.check(d_.launch(kernels_.hpass, blocks(int64_t(max_rows) * p.out_w, 256), n, 1, 256, 1,
                           1, 0, stream_, two, nullptr),
                 "cuLaunchKernel(stoker_hpass)");
      }
      d_.check(d_.launch(kernels_.vpass, blocks(int64_t(p.out_h) * p.out_w, 256), n, 1, 256, 1, 1,
                         0, stream_, one, nullptr),
               "cuLaunchKernel(stoker_vpass)");
    }
  }

  void end() override {
    if (current_ && d_.event_record(done_[slot_], stream_) == 0) recorded_[slot_] = true;
    current_.reset();
  }

  uint64_t device_bytes() const override {
    return arena_size_ + table_bytes_ + nvjpeg_device_bytes.load();
  }
  uint64_t pinned_bytes() const override {
    return staging_size_[0] + staging_size_[1] + nvjpeg_pinned_bytes.load();
  }

 private:
  static unsigned blocks(int64_t threads, int per_block) {
    return static_cast<unsigned>(std::max<int64_t>(1, (threads + per_block - 1) / per_block));
  }

  void check(nvjpegStatus_t st, const char* call) const {
    if (st != 0)
      throw Error(std::string("nvJPEG (") + nv_.path + "): " + call + " failed with status " +
                  std::to_string(st));
  }

  // One batched call over jobs[idx]; on failure, each file alone through the GPU-hybrid decoder
  // to find the ones that fail. Returns whether the batched call succeeded.
  bool batched(nvjpegHandle_t h, nvjpegJpegState_t state, std::span<const JpegJob> jobs,
               const std::vector<size_t>& idx, std::vector<uint8_t>& ok) {
    std::vector<const unsigned char*> data(idx.size());
    std::vector<size_t> lengths(idx.size());
    std::vector<NvjpegImage> out(idx.size());
    for (size_t i = 0; i < idx.size(); ++i) {
      const JpegJob& j = jobs[idx[i]];
      data[i] = reinterpret_cast<const unsigned char*>(j.data);
      lengths[i] = j.bytes;
      out[i] = NvjpegImage{{j.dst, nullptr, nullptr, nullptr}, {size_t(j.pitch), 0, 0, 0}};
    }
    nvjpegStatus_t st =
        nv_.batched_initialize(h, state, static_cast<int>(idx.size()), 1, kOutputRGBI);
    if (st == 0) st = nv_.batched(h, state, data.data(), lengths.data(), out.data(), stream_);
    if (st == 0) {
      for (size_t i : idx) ok[i] = 1;
      return true;
    }
    d_.check(d_.stream_synchronize(stream_), "cuStreamSynchronize");
    for (size_t i = 0; i < idx.size(); ++i) {
      ok[idx[i]] =
          nv_.decode(sw_, single_state_, data[i], lengths[i], kOutputRGBI, &out[i], stream_) == 0 &&
          d_.stream_synchronize(stream_) == 0;
    }
    return false;
  }

  const int device_;
  const Driver& d_;
  const Nvjpeg& nv_;
  const Kernels kernels_;
  nvjpegHandle_t hw_ = nullptr, sw_ = nullptr;
  nvjpegJpegState_t hw_state_[2] = {nullptr, nullptr}, sw_state_[2] = {nullptr, nullptr};
  nvjpegJpegState_t single_state_ = nullptr;
  nvjpegJpegStream_t parse_ = nullptr;
  CUevent done_[2] = {nullptr, nullptr};
  bool recorded_[2] = {false, false};
  CUevent chunk_done_ = nullptr;  // recorded after each decode() (chunk), waited by the next
  bool chunk_recorded_ = false;
  void* staging_[2] = {nullptr, nullptr};
  size_t staging_size_[2] = {0, 0};
  int slot_ = 0;
  CUstream stream_ = nullptr;
  std::optional<Current> current_;  // the device's context, current during a batch
  CUdeviceptr arena_ = 0, table_ = 0;
  size_t arena_size_ = 0, table_bytes_ = 0;
};

}  // namespace

std::pair<std::string, std::string> find_gpu_decode_libraries(
    const std::vector<std::string>& library_dirs) {
  return {nvjpeg(library_dirs).path, nvrtc(library_dirs).path};
}

std::unique_ptr<DecodeBackend> make_nvjpeg_backend(int device,
                                                   const std::vector<std::string>& library_dirs) {
  if (!cuda_available())
    throw Error(
        "decode=\"cuda\" needs CUDA and nvJPEG: no CUDA driver or GPU is available in "
        "this process");
  if (device < 0 || device >= cuda::device_count())
    throw InvalidArgument("GPU decode: CUDA device " + std::to_string(device) +
                          " does not exist (" + std::to_string(cuda::device_count()) +
                          " device(s))");
  return std::make_unique<NvjpegBackend>(device, library_dirs);
}

}  // namespace stoker::image::gpu
