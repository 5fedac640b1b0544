#include "stoker/batch_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "stoker/errors.h"
#include "test_threads.h"

namespace stoker {
namespace {

TEST(BatchPool, NeverHoldsMoreThanTheBudget) {
  auto pool = BatchPool::create(1000, 3500, MemoryKind::kPageable);
  EXPECT_EQ(pool->capacity(), 3u);
  std::stop_source stop;
  Buffer a = pool->acquire(stop.get_token()), b = pool->acquire(stop.get_token()),
         c = pool->acquire(stop.get_token());
  EXPECT_TRUE(pool->exhausted());
  EXPECT_EQ(pool->acquire_for(stop.get_token(), std::chrono::milliseconds(20)), nullptr);
  EXPECT_EQ(pool->bytes_allocated(), 3000u);
  b.reset();
  Buffer d = pool->acquire(stop.get_token());
  EXPECT_NE(d, nullptr);
  EXPECT_EQ(pool->peak_bytes_allocated(), 3000u);
}

TEST(BatchPool, RecyclesBuffers) {
  auto pool = BatchPool::create(64, 64, MemoryKind::kPageable);
  std::stop_source stop;
  std::byte* first = pool->acquire(stop.get_token()).get();
  EXPECT_EQ(pool->acquire(stop.get_token()).get(), first);
}

TEST(BatchPool, WaiterWakesOnReleaseAndOnStop) {
  auto pool = BatchPool::create(64, 64, MemoryKind::kPageable);
  std::stop_source stop;
  Buffer held = pool->acquire(stop.get_token());
  std::atomic<pid_t> tid{0};
  std::thread waiter([&] {
    tid = testing::this_thread_id();
    EXPECT_NE(pool->acquire(stop.get_token()), nullptr);
  });
  // Release only once the waiter is blocked in acquire(): the wake-up is what is tested.
  ASSERT_TRUE(testing::wait_until([&] { return tid != 0 && testing::blocked_in_futex(tid); }));
  held.reset();
  waiter.join();

  held = pool->acquire(stop.get_token());
  std::stop_source cancel;
  tid = 0;
  std::thread cancelled([&] {
    tid = testing::this_thread_id();
    EXPECT_EQ(pool->acquire(cancel.get_token()), nullptr);
  });
  ASSERT_TRUE(testing::wait_until([&] { return tid != 0 && testing::blocked_in_futex(tid); }));
  cancel.request_stop();
  cancelled.join();
}

TEST(BatchPool, BufferOutlivesPoolHandle) {
  Buffer b;
  {
    auto pool = BatchPool::create(128, 1024, MemoryKind::kPageable);
    b = pool->acquire(std::stop_source().get_token());
  }
  std::fill(b.get(), b.get() + 128, std::byte{7});  // still valid: the buffer owns the pool
}

TEST(BatchPool, RejectsABatchLargerThanTheBudget) {
  EXPECT_THROW(BatchPool::create(1000, 999, MemoryKind::kPageable), InvalidArgument);
}

TEST(BatchPool, PinnedNeedsCuda) {
  if (cuda_available()) GTEST_SKIP() << "CUDA present";
  auto pool = BatchPool::create(64, 64, MemoryKind::kPinned);
  EXPECT_THROW(pool->acquire(std::stop_source().get_token()), Error);
  EXPECT_FALSE(pool->exhausted());  // the failed allocation gave its reservation back
}

}  // namespace
}  // namespace stoker
