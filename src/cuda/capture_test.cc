// cuda.cc against a fake driver (test_fake_libcuda.cc): fences and the driver calls Stoker makes
// from its own threads while a user captures a CUDA graph. A test program of its own: the fake is
// loaded before anything asks for the driver, so every test here sees one fake device.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>

#include "stoker/cuda/cuda.h"
#include "stoker/batch_pool.h"

namespace stoker {
namespace {

// The fake's controls.
struct Fake {
  void* lib = dlopen(STOKER_FAKE_LIBCUDA, RTLD_NOW | RTLD_LOCAL);
  template <typename F>
  F fn(const char* name) const {
    return reinterpret_cast<F>(dlsym(lib, name));
  }
  void set_query_result(int rc) const { fn<void (*)(int)>("fake_cuda_set_query_result")(rc); }
  void set_synchronize_failures(int n) const {
    fn<void (*)(int)>("fake_cuda_set_synchronize_failures")(n);
  }
  int queries() const { return fn<int (*)()>("fake_cuda_queries")(); }
  int mode_at(const char* call) const {
    return fn<int (*)(const char*)>("fake_cuda_mode_at")(call);
  }
  // This thread's capture mode, set to `mode`; returns the previous one.
  int exchange_mode(int mode) const {
    fn<int (*)(int*)>("cuThreadExchangeStreamCaptureMode")(&mode);
    return mode;
  }
};

const Fake& fake() {
  static const Fake f;
  return f;
}

constexpr int kNotReady = 600;
constexpr int kGlobal = 0, kThreadLocal = 1, kRelaxed = 2;

class FakeDriver : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(fake().lib, nullptr) << dlerror();
    ASSERT_TRUE(cuda_available()) << "cuda.cc did not load the fake driver";
    fake().set_query_result(0);
  }
};

TEST_F(FakeDriver, AFenceCompletesOnlyOnSuccessNotOnACaptureError) {
  const auto fence = cuda::record_fence(0, 0);
  for (int rc : {kNotReady, 900, 901, 904, 906, 907, 908}) {
    fake().set_query_result(rc);
    EXPECT_FALSE(fence->completed()) << rc;
  }
  fake().set_query_result(0);
  EXPECT_TRUE(fence->completed());
  // Any other error: the context is dead and runs nothing more (as before).
  fake().set_query_result(700);  // CUDA_ERROR_ILLEGAL_ADDRESS
  EXPECT_TRUE(fence->completed());
}

TEST_F(FakeDriver, ABufferIsNotReusedWhileACaptureRefusesItsFenceQuery) {
  auto pool = BatchPool::create(4096, 4096, MemoryKind::kPageable);  // one buffer
  Buffer held = pool->acquire({});
  const std::byte* first = held.get();
  fake().set_query_result(kNotReady);
  pool->add_fence(first, cuda::record_fence(0, 0));
  held.reset();
  // A user's graph capture makes the query fail: the copy may still read the buffer.
  fake().set_query_result(906);  // CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
  const int before = fake().queries();
  EXPECT_EQ(pool->acquire_for({}, std::chrono::milliseconds(20)), nullptr);
  EXPECT_GT(fake().queries(), before);
  EXPECT_EQ(pool->fenced_buffers(), 1u);
  fake().set_query_result(901);  // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
  EXPECT_EQ(pool->acquire_for({}, std::chrono::milliseconds(20)), nullptr);
  fake().set_query_result(0);
  Buffer again = pool->acquire_for({}, std::chrono::milliseconds(1000));
  EXPECT_EQ(again.get(), first);
}

TEST_F(FakeDriver, WaitingOnAFenceOutlastsCaptureErrors) {
  auto fence = cuda::record_fence(0, 0);
  fake().set_synchronize_failures(3);
  fence->wait();  // returns only once the driver's wait succeeded
  EXPECT_EQ(fake().fn<int (*)()>("fake_cuda_synchronize_failures")(), 0);
}

TEST_F(FakeDriver, DriverCallsRunInRelaxedCaptureModeAndRestoreTheThreadsMode) {
  const int original = fake().exchange_mode(kThreadLocal);
  auto fence = cuda::record_fence(0, 0);
  EXPECT_EQ(fake().mode_at("record"), kRelaxed);
  EXPECT_EQ(fake().exchange_mode(kThreadLocal), kThreadLocal);
  fence->completed();
  EXPECT_EQ(fake().mode_at("query"), kRelaxed);
  EXPECT_EQ(fake().exchange_mode(kGlobal), kThreadLocal);

  void* p = cuda::alloc_pinned(4096);
  EXPECT_EQ(fake().mode_at("alloc"), kRelaxed);
  EXPECT_EQ(fake().exchange_mode(kGlobal), kGlobal);
  cuda::free_pinned(p, 4096);

  void* page = std::aligned_alloc(4096, 4096);
  cuda::register_host(page, 4096);
  EXPECT_EQ(fake().mode_at("register"), kRelaxed);
  EXPECT_EQ(fake().exchange_mode(kGlobal), kGlobal);
  cuda::unregister_host(page, 4096);
  std::free(page);
  fake().exchange_mode(original);
}

}  // namespace
}  // namespace stoker
