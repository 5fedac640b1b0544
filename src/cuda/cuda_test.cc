// What of the CUDA internals can be checked without a GPU: the context guard's errors. On a
// machine with CUDA the guard is exercised by every GPU test (pinned memory, fences, GPU decode).
#include <gtest/gtest.h>

#include <type_traits>

#include "cuda/cuda_driver.h"
#include "stoker/cuda/cuda.h"
#include "stoker/errors.h"

namespace stoker::cuda::internal {
namespace {

TEST(ContextGuard, WithoutCudaThrowsAndLeavesNothingPushed) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(ContextGuard::for_device(0), Error);
  EXPECT_THROW(ContextGuard guard(nullptr), Error);
  EXPECT_EQ(driver_symbol("cuCtxPushCurrent_v2"), nullptr);
}

TEST(ContextGuard, MovesButDoesNotCopy) {
  // A guard is taken, work that may throw done, and only then kept (GPU decode's begin()).
  static_assert(std::is_nothrow_move_constructible_v<ContextGuard>);
  static_assert(!std::is_copy_constructible_v<ContextGuard>);
  static_assert(!std::is_copy_assignable_v<ContextGuard>);
}

}  // namespace
}  // namespace stoker::cuda::internal
