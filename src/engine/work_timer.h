// Internal: the engine's one timer of a worker's work, wall and CPU time together.
//
// The CPU time is the calling thread's (CLOCK_THREAD_CPUTIME_ID): what a worker spent reading,
// decoding and transforming, excluding its waits, for EngineStats::worker_cpu_seconds. The wall
// time is what the autotune controller counts as the worker busy.
//
// Thread safety: a WorkTimer belongs to the thread that made it; thread_cpu_ns is safe anywhere.
#pragma once

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>

namespace stoker {

// CPU time of the calling thread, in nanoseconds.
inline int64_t thread_cpu_ns() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

class WorkTimer {
 public:
  WorkTimer() : wall_(std::chrono::steady_clock::now()), cpu_(thread_cpu_ns()) {}

  // Adds the thread's CPU time since construction to `cpu_ns` and returns the wall time since
  // then. REQUIRES: called on the thread that made the timer.
  int64_t stop(std::atomic<int64_t>& cpu_ns) const {
    const int64_t wall = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now() - wall_)
                             .count();
    cpu_ns += thread_cpu_ns() - cpu_;
    return wall;
  }

 private:
  std::chrono::steady_clock::time_point wall_;
  int64_t cpu_;
};

}  // namespace stoker
