// A fake CUDA driver for cuda.cc's tests without a GPU (built as a module whose soname is
// libcuda.so.1: a test loads it by path before cuda.cc's dlopen("libcuda.so.1"), which then finds
// this copy). One device; host memory is malloc'd; events are counters. What a test controls or
// reads goes through the fake_cuda_* functions.
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace {

using CUresult = int;
constexpr int kModeGlobal = 0;

std::atomic<int> query_result{0};          // what cuEventQuery answers
std::atomic<int> synchronize_failures{0};  // cuEventSynchronize answers 906 this many times first
std::atomic<int> queries{0};
// Each driver call below records the calling thread's capture mode as it ran (-1: not called).
std::atomic<int> mode_at_query{-1}, mode_at_record{-1}, mode_at_alloc{-1}, mode_at_register{-1};
thread_local int capture_mode = kModeGlobal;  // cuThreadExchangeStreamCaptureMode's state

}  // namespace

#define FAKE extern "C" __attribute__((visibility("default")))

FAKE void fake_cuda_set_query_result(int rc) { query_result = rc; }
FAKE void fake_cuda_set_synchronize_failures(int n) { synchronize_failures = n; }
FAKE int fake_cuda_synchronize_failures() { return synchronize_failures; }
FAKE int fake_cuda_queries() { return queries; }
FAKE int fake_cuda_mode_at(const char* call) {
  if (std::strcmp(call, "query") == 0) return mode_at_query;
  if (std::strcmp(call, "record") == 0) return mode_at_record;
  if (std::strcmp(call, "alloc") == 0) return mode_at_alloc;
  if (std::strcmp(call, "register") == 0) return mode_at_register;
  return -2;
}

FAKE CUresult cuThreadExchangeStreamCaptureMode(int* mode) {
  const int previous = capture_mode;
  capture_mode = *mode;
  *mode = previous;
  return 0;
}

FAKE CUresult cuInit(unsigned) { return 0; }
FAKE CUresult cuDeviceGetCount(int* n) {
  *n = 1;
  return 0;
}
FAKE CUresult cuDeviceGet(int* d, int ordinal) {
  *d = ordinal;
  return 0;
}
FAKE CUresult cuDevicePrimaryCtxRetain(void** ctx, int) {
  static int context;
  *ctx = &context;
  return 0;
}
FAKE CUresult cuDevicePrimaryCtxGetState(int, unsigned* flags, int* active) {
  *flags = 0;
  *active = 1;
  return 0;
}
FAKE CUresult cuCtxPushCurrent_v2(void*) { return 0; }
FAKE CUresult cuCtxPopCurrent_v2(void** ctx) {
  *ctx = nullptr;
  return 0;
}
FAKE CUresult cuCtxSynchronize() { return 0; }
FAKE CUresult cuMemHostAlloc(void** p, size_t bytes, unsigned) {
  mode_at_alloc = capture_mode;
  *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  return *p != nullptr ? 0 : 2;
}
FAKE CUresult cuMemFreeHost(void* p) {
  std::free(p);
  return 0;
}
FAKE CUresult cuMemHostRegister_v2(void*, size_t, unsigned) {
  mode_at_register = capture_mode;
  return 0;
}
FAKE CUresult cuMemHostUnregister(void*) { return 0; }
FAKE CUresult cuEventCreate(void** e, unsigned) {
  *e = new int(0);
  return 0;
}
FAKE CUresult cuEventRecord(void*, void*) {
  mode_at_record = capture_mode;
  return 0;
}
FAKE CUresult cuEventQuery(void*) {
  mode_at_query = capture_mode;
  ++queries;
  return query_result;
}
FAKE CUresult cuEventSynchronize(void*) {
  if (synchronize_failures > 0) {
    --synchronize_failures;
    return 906;  // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
  }
  return 0;
}
FAKE CUresult cuEventDestroy_v2(void* e) {
  delete static_cast<int*>(e);
  return 0;
}
FAKE CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  *free = 1 << 30;
  *total = 2 << 30;
  return 0;
}
FAKE CUresult cuDeviceGetPCIBusId(char* id, int n, int) {
  std::strncpy(id, "0000:00:00.0", static_cast<size_t>(n));
  return 0;
}
FAKE CUresult cuGetErrorName(CUresult, const char** name) {
  *name = "CUDA_ERROR_FAKE";
  return 0;
}
