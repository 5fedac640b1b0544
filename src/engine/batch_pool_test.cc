#include "stoker/batch_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "stoker/shared_arena.h"
#include "stoker/cuda/cuda.h"
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
  auto pool = BatchPool::create(4096, 4096, MemoryKind::kPinned);
  EXPECT_THROW(pool->acquire(std::stop_source().get_token()), Error);
  EXPECT_FALSE(pool->exhausted());  // the failed allocation gave its reservation back
  EXPECT_EQ(pool->bytes_allocated(), 0u);
}

TEST(BatchPool, PinnedBuffersCountWholePagesAgainstTheBudget) {
  // 5000 bytes take two pages once pinned: a budget of 3 pages holds one such buffer, not two.
  auto pinned = BatchPool::create(5000, 3 * 4096, MemoryKind::kPinned);
  EXPECT_EQ(pinned->capacity(), 1u);
  EXPECT_THROW(BatchPool::create(5000, 8191, MemoryKind::kPinned), InvalidArgument);
  EXPECT_EQ(BatchPool::create(5000, 3 * 4096, MemoryKind::kPageable)->capacity(), 2u);
  EXPECT_EQ(BatchPool::create(5000, 3 * 4096, MemoryKind::kPageable)->pinned_bytes(), 0u);
}

TEST(BatchPool, PinnedSharedPoolNeedsCuda) {
  if (cuda_available()) GTEST_SKIP() << "CUDA present";
  auto arena = SharedArena::create(4 * 4096);
  auto pool = BatchPool::create_shared(4096, 4 * 4096, arena, MemoryKind::kPinned);
  EXPECT_THROW(pool->acquire(std::stop_source().get_token()), Error);
  EXPECT_THROW(pool->acquire(std::stop_source().get_token()), Error);
  // A failed registration keeps its carved memory for the next try: the arena is not used up.
  EXPECT_NE(arena->carve(3 * 4096), nullptr);
}

// ---- Fences: what the GPU path relies on, with fences whose completion the test controls. ----

// What a test sees of a fake fence after handing it to a pool.
struct FenceProbe {
  std::atomic<bool> done{false};
  std::atomic<bool> waited{false};
  std::atomic<bool> destroyed{false};
  std::mutex mu;
  std::condition_variable polled;
  int polls = 0;  // guarded by mu

  // Waits until the fence was polled at least `n` times; false if that takes over 30 s (a pool
  // that never polls would otherwise hang the test instead of failing it).
  [[nodiscard]] bool await_polls(int n) {
    std::unique_lock lock(mu);
    return polled.wait_for(lock, std::chrono::seconds(30), [&] { return polls >= n; });
  }
  int poll_count() {
    std::lock_guard lock(mu);
    return polls;
  }
};

class FakeFence final : public Fence {
 public:
  explicit FakeFence(std::shared_ptr<FenceProbe> probe) : probe_(std::move(probe)) {}
  ~FakeFence() override { probe_->destroyed = true; }
  bool completed() override {
    {
      std::lock_guard lock(probe_->mu);
      ++probe_->polls;
    }
    probe_->polled.notify_all();
    return probe_->done;
  }
  void wait() override {
    probe_->waited = true;
    probe_->done = true;
  }

 private:
  std::shared_ptr<FenceProbe> probe_;
};

std::unique_ptr<Fence> fence_of(const std::shared_ptr<FenceProbe>& probe) {
  return std::make_unique<FakeFence>(probe);
}

TEST(BatchPoolFence, AFencedBufferIsNotHandedOutUntilItsFenceCompletes) {
  auto pool = BatchPool::create(64, 64, MemoryKind::kPageable);
  std::stop_source stop;
  Buffer held = pool->acquire(stop.get_token());
  std::byte* const first = held.get();
  auto probe = std::make_shared<FenceProbe>();
  pool->add_fence(first, fence_of(probe));
  held.reset();
  EXPECT_EQ(pool->fenced_buffers(), 1u);
  EXPECT_FALSE(pool->exhausted());  // it will come back without the consumer's help
  EXPECT_EQ(pool->acquire_for(stop.get_token(), std::chrono::milliseconds(10)), nullptr);
  EXPECT_GT(probe->poll_count(), 1);
  EXPECT_EQ(pool->bytes_allocated(), 64u);

  probe->done = true;
  EXPECT_EQ(pool->fenced_buffers(), 0u);  // completed, not yet taken back: no longer waiting
  Buffer again = pool->acquire_for(stop.get_token(), std::chrono::milliseconds(0));
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(pool->fenced_buffers(), 0u);
  EXPECT_TRUE(probe->destroyed);  // a completed fence is dropped
}

TEST(BatchPoolFence, AnotherBufferIsAllocatedWhileOneIsFencedWithinTheBudget) {
  auto pool = BatchPool::create(64, 128, MemoryKind::kPageable);
  std::stop_source stop;
  Buffer a = pool->acquire(stop.get_token());
  std::byte* const first = a.get();
  auto probe = std::make_shared<FenceProbe>();
  pool->add_fence(first, fence_of(probe));
  a.reset();
  Buffer b = pool->acquire(stop.get_token());
  EXPECT_NE(b.get(), first);  // the fenced one stays untouched
  EXPECT_EQ(pool->bytes_allocated(), 128u);
  EXPECT_EQ(pool->acquire_for(stop.get_token(), std::chrono::milliseconds(5)), nullptr);
  EXPECT_EQ(pool->peak_bytes_allocated(), 128u);  // never a third buffer
  probe->done = true;
  EXPECT_EQ(pool->acquire(stop.get_token()).get(), first);
}

TEST(BatchPoolFence, EveryFenceOfABufferMustComplete) {
  auto pool = BatchPool::create(64, 64, MemoryKind::kPageable);
  std::stop_source stop;
  Buffer held = pool->acquire(stop.get_token());
  auto copy = std::make_shared<FenceProbe>(), compute = std::make_shared<FenceProbe>();
  pool->add_fence(held.get(), fence_of(copy));
  pool->add_fence(held.get(), fence_of(compute));
  held.reset();
  copy->done = true;
  EXPECT_EQ(pool->acquire_for(stop.get_token(), std::chrono::milliseconds(5)), nullptr);
  compute->done = true;
  EXPECT_NE(pool->acquire_for(stop.get_token(), std::chrono::milliseconds(0)), nullptr);
}

TEST(BatchPoolFence, ACompletedFenceCostsNothing) {
  auto pool = BatchPool::create(64, 64, MemoryKind::kPageable);
  std::stop_source stop;
  Buffer held = pool->acquire(stop.get_token());
  auto probe = std::make_shared<FenceProbe>();
  probe->done = true;
  pool->add_fence(held.get(), fence_of(probe));
  EXPECT_TRUE(probe->destroyed);
  held.reset();
  EXPECT_EQ(pool->fenced_buffers(), 0u);
  EXPECT_NE(pool->acquire_for(stop.get_token(), std::chrono::milliseconds(0)), nullptr);
}

TEST(BatchPoolFence, AWaiterWakesWhenTheFenceCompletes) {
  auto pool = BatchPool::create(64, 64, MemoryKind::kPageable);
  std::stop_source stop;
  Buffer held = pool->acquire(stop.get_token());
  std::byte* const first = held.get();
  auto probe = std::make_shared<FenceProbe>();
  pool->add_fence(first, fence_of(probe));
  std::byte* got = nullptr;
  std::thread waiter([&] { got = pool->acquire(stop.get_token()).get(); });
  held.reset();  // a fenced release: a waiter waiting for a release starts polling
  const bool polled = probe->await_polls(3);
  probe->done = true;
  waiter.join();
  EXPECT_TRUE(polled);
  EXPECT_EQ(got, first);
}

TEST(BatchPoolFence, WaitersPollAtGrowingIntervalsInsteadOfSpinning) {
  auto pool = BatchPool::create(64, 64, MemoryKind::kPageable);
  std::stop_source stop;
  Buffer held = pool->acquire(stop.get_token());
  auto probe = std::make_shared<FenceProbe>();
  pool->add_fence(held.get(), fence_of(probe));
  held.reset();
  const auto start = std::chrono::steady_clock::now();
  std::thread waiter([&] { EXPECT_NE(pool->acquire(stop.get_token()), nullptr); });
  // Poll 1 was add_fence's; the waiter's polls 3..12 come after waits of 50, 100, 200, 400,
  // 800 us then 1 ms each: 6.55 ms in all, >= 5.55 ms for the first nine, whatever the machine's
  // load (waits never end early). A waiter that spun would poll twelve times in microseconds.
  constexpr int kPolls = 12;
  const bool polled = probe->await_polls(kPolls);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  probe->done = true;
  waiter.join();
  ASSERT_TRUE(polled);
  EXPECT_GE(elapsed, std::chrono::microseconds(5550));
}

TEST(BatchPoolFence, StopWakesAPollingWaiter) {
  auto pool = BatchPool::create(64, 64, MemoryKind::kPageable);
  Buffer held = pool->acquire(std::stop_source().get_token());
  auto probe = std::make_shared<FenceProbe>();
  pool->add_fence(held.get(), fence_of(probe));
  held.reset();
  std::stop_source cancel;
  std::thread waiter([&] { EXPECT_EQ(pool->acquire(cancel.get_token()), nullptr); });
  const bool polled = probe->await_polls(3);
  cancel.request_stop();
  waiter.join();
  ASSERT_TRUE(polled);
  EXPECT_EQ(pool->fenced_buffers(), 1u);
}

TEST(BatchPoolFence, DestroyingThePoolWaitsForPendingFencesThenFreesTheMemory) {
  auto probe = std::make_shared<FenceProbe>();
  {
    auto pool = BatchPool::create(4096, 3 * 4096, MemoryKind::kPageable);
    Buffer held = pool->acquire(std::stop_source().get_token());
    Buffer other = pool->acquire(std::stop_source().get_token());
    pool->add_fence(held.get(), fence_of(probe));
  }  // the Buffers die, then the pool (they held it): ASan reports any memory left behind
  EXPECT_TRUE(probe->waited);
  EXPECT_TRUE(probe->destroyed);
}

TEST(BatchPoolFence, OwnerFindsThePoolOfABuffer) {
  auto pool = BatchPool::create(64, 64, MemoryKind::kPageable);
  Buffer held = pool->acquire(std::stop_source().get_token());
  EXPECT_EQ(BatchPool::owner(held), pool);
  Buffer foreign(new std::byte[8], [](std::byte* p) { delete[] p; });
  EXPECT_EQ(BatchPool::owner(foreign), nullptr);
}

// Workers take buffers, "queue a copy" (a fence that a GPU thread completes later, in order) and
// drop them, as a training loop with non_blocking copies does. No buffer may be handed out while
// a copy of it is pending, two holders never share a buffer, and the budget holds throughout.
TEST(BatchPoolFence, ConcurrentUseNeverHandsOutABufferWithAPendingCopy) {
  constexpr int kWorkers = 4, kRounds = 400;
  auto pool = BatchPool::create(256, 3 * 256, MemoryKind::kPageable);
  std::mutex mu;
  std::condition_variable queued;
  std::deque<std::shared_ptr<FenceProbe>> copies;               // guarded by mu; the "GPU"'s queue
  std::map<std::byte*, std::shared_ptr<FenceProbe>> last_copy;  // guarded by mu
  std::set<std::byte*> in_use;                                  // guarded by mu
  std::atomic<int> violations{0};
  std::atomic<bool> finished{false};

  std::thread gpu([&] {
    std::unique_lock lock(mu);
    for (;;) {
      queued.wait(lock, [&] { return !copies.empty() || finished; });
      if (copies.empty()) return;
      std::shared_ptr<FenceProbe> next = copies.front();
      copies.pop_front();
      next->done = true;
    }
  });
  std::vector<std::thread> workers;
  for (int w = 0; w < kWorkers; ++w)
    workers.emplace_back([&] {
      for (int r = 0; r < kRounds; ++r) {
        Buffer b = pool->acquire(std::stop_token());  // never stopped
        auto copy = std::make_shared<FenceProbe>();
        {
          std::lock_guard lock(mu);
          if (!in_use.insert(b.get()).second) ++violations;
          auto it = last_copy.find(b.get());
          if (it != last_copy.end() && !it->second->done) ++violations;
          last_copy[b.get()] = copy;
          b.get()[0] = std::byte(r);  // what a worker writing the next batch would do
        }
        pool->add_fence(b.get(), fence_of(copy));
        {
          std::lock_guard lock(mu);
          in_use.erase(b.get());
          copies.push_back(copy);
        }
        queued.notify_one();
        b.reset();
      }
    });
  for (std::thread& t : workers) t.join();
  {
    std::lock_guard lock(mu);
    finished = true;
  }
  queued.notify_one();
  gpu.join();
  EXPECT_EQ(violations, 0);
  EXPECT_EQ(pool->peak_bytes_allocated(), 3u * 256);
}

}  // namespace
}  // namespace stoker
