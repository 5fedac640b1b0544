#include "engine/work_timer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace stoker {
namespace {

TEST(WorkTimer, CountsTheThreadsCpuTimeNotItsSleep) {
  EXPECT_GT(thread_cpu_ns(), 0);
  std::atomic<int64_t> cpu{0};
  const WorkTimer timer;
  volatile double x = 0;
  for (int i = 0; i < 2000000; ++i) x = x + i;
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const int64_t wall = timer.stop(cpu);
  EXPECT_GE(wall, 50'000'000);
  EXPECT_GT(cpu.load(), 0);
  EXPECT_LT(cpu.load(), wall - 40'000'000);  // the sleep is wall time only
}

}  // namespace
}  // namespace stoker
