#include "stoker/pydata/shared_pool.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace stoker::python {
namespace {

using std::chrono::milliseconds;

TEST(SharedPool, HandsOutDistinctBuffersUpToTheBudgetAndRecyclesThem) {
  SharedPool pool(10000, 30000);  // three buffers of 10000 bytes (12288 in the arena each)
  std::vector<std::shared_ptr<Lease>> leases;
  std::set<size_t> offsets;
  for (int i = 0; i < 3; ++i) {
    leases.push_back(pool.acquire(milliseconds(0)));
    ASSERT_NE(leases.back(), nullptr);
    offsets.insert(leases.back()->offset);
    EXPECT_LE(leases.back()->offset + 10000, pool.arena()->size());
    EXPECT_EQ(leases.back()->offset % 4096, 0u);
  }
  EXPECT_EQ(offsets.size(), 3u);
  EXPECT_EQ(pool.acquire(milliseconds(0)), nullptr);  // the budget is spent
  const size_t freed = leases[1]->offset;
  leases[1].reset();
  const auto again = pool.acquire(milliseconds(0));
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->offset, freed);
}

TEST(SharedPool, ABufferViewedLongerThanItsLeaseStaysOut) {
  SharedPool pool(4096, 4096);
  auto lease = pool.acquire(milliseconds(0));
  Buffer view = lease->buffer;  // what an exported tensor holds
  lease.reset();
  EXPECT_EQ(pool.acquire(milliseconds(0)), nullptr);
  view.reset();
  EXPECT_NE(pool.acquire(milliseconds(0)), nullptr);
}

TEST(SharedPool, AnotherMappingOfTheMemfdSeesTheSameBytesAtTheSameOffset) {
  SharedPool pool(4096, 8192);
  auto lease = pool.acquire(milliseconds(0));
  // What a spawned worker does: map the memfd it was handed and write at the lease's offset.
  auto other = SharedArena::attach(dup(pool.arena()->fd()));
  ASSERT_EQ(other->size(), pool.arena()->size());
  ASSERT_NE(other->base(), pool.arena()->base());
  std::memcpy(other->base() + lease->offset, "batch", 6);
  EXPECT_STREQ(reinterpret_cast<const char*>(lease->buffer.get()), "batch");
  // Dropping a mapping's pages keeps the data for every mapping.
  other->drop_pages(lease->offset, 4096);
  pool.arena()->drop_pages(lease->offset, 4096);
  EXPECT_STREQ(reinterpret_cast<const char*>(other->base() + lease->offset), "batch");
}

TEST(SharedPool, ThreadsSharingThePoolNeverHoldTheSameBuffer) {
  // Leases are dropped on whatever thread drops an exported tensor last: the pool must hand each
  // buffer to one holder at a time (the TSan build checks the synchronisation too).
  SharedPool pool(4096, 3 * 4096);
  std::atomic<int> clashes{0}, rounds{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 300; ++i) {
        auto lease = pool.acquire(milliseconds(10000));
        ASSERT_NE(lease, nullptr);
        auto* word = reinterpret_cast<volatile int*>(lease->buffer.get());
        *word = t;
        std::this_thread::yield();
        if (*word != t) clashes.fetch_add(1);
        rounds.fetch_add(1);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(clashes.load(), 0);
  EXPECT_EQ(rounds.load(), 1200);
  EXPECT_LE(pool.pool().peak_bytes_allocated(), 3u * 4096);
}

}  // namespace
}  // namespace stoker::python
