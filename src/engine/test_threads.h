// Test helpers: conditions a test observes instead of sleeps that make a race likely.
//
// blocked_in_futex(tid) reads /proc/self/task/<tid>/wchan: a thread that waits on a mutex or a
// condition variable sleeps in the kernel's futex wait. A test that must act only once a thread
// blocks (then releases it, or destroys what it waits on) waits until this is true.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace stoker::testing {

inline pid_t this_thread_id() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

inline bool blocked_in_futex(pid_t tid) {
  std::ifstream wchan("/proc/self/task/" + std::to_string(tid) + "/wchan");
  std::string where;
  wchan >> where;
  return where.rfind("futex", 0) == 0;
}

// The threads of this process other than the calling one.
inline std::vector<pid_t> other_threads() {
  std::vector<pid_t> tids;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    const pid_t tid = static_cast<pid_t>(std::stol(e.path().filename().string()));
    if (tid != this_thread_id()) tids.push_back(tid);
  }
  return tids;
}

// Polls `condition` until it holds (true) or `deadline` passes (false).
inline bool wait_until(const std::function<bool()>& condition,
                       std::chrono::seconds deadline = std::chrono::seconds(30)) {
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return true;
}

}  // namespace stoker::testing
