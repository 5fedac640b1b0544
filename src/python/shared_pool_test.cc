#include "python/shared_pool.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <set>
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

}  // namespace
}  // namespace stoker::python
