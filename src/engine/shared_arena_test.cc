#include "stoker/shared_arena.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>

#include "stoker/errors.h"

namespace stoker {
namespace {

TEST(SharedArena, AttachMapsTheSameMemoryAndOwnsItsFd) {
  auto arena = SharedArena::create(10000);
  EXPECT_EQ(arena->size(), 12288u);
  std::byte* p = arena->carve(4096);
  ASSERT_NE(p, nullptr);
  std::memcpy(p + 100, "shared", 7);
  auto other = SharedArena::attach(dup(arena->fd()));
  EXPECT_EQ(other->size(), arena->size());
  EXPECT_STREQ(reinterpret_cast<const char*>(other->base() + arena->offset_of(p) + 100), "shared");
  EXPECT_EQ(other->carve(1), nullptr);  // the creator's pool owns the layout
  const int fd = other->fd();
  other.reset();
  EXPECT_EQ(fcntl(fd, F_GETFD), -1);  // closed with the arena
}

TEST(SharedArena, AttachRefusesAFileThatIsNoArena) {
  const int fd = memfd_create("not-an-arena", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 100), 0);
  EXPECT_THROW(SharedArena::attach(fd), Error);
  EXPECT_THROW(SharedArena::attach(-1), Error);
}

TEST(SharedArena, DropPagesKeepsTheDataAndClipsTheRange) {
  auto arena = SharedArena::create(8192);
  std::memset(arena->base(), 7, 8192);
  arena->drop_pages(0, 1 << 30);  // past the end: clipped
  arena->drop_pages(1 << 30, 10);
  EXPECT_EQ(static_cast<int>(arena->base()[8191]), 7);
  EXPECT_EQ(static_cast<int>(arena->base()[0]), 7);
}

}  // namespace
}  // namespace stoker
