#include "stoker/tuning/executor_policy.h"

#include <algorithm>
#include <cstdio>

namespace stoker {
namespace {

// printf-style text (the reasons' few numbers).
template <typename... Args>
std::string format(const char* fmt, Args... args) {
  char buf[160];
  std::snprintf(buf, sizeof buf, fmt, args...);
  return buf;
}

}  // namespace

const char* executor_kind_name(ExecutorDecision::Kind kind) {
  switch (kind) {
    case ExecutorDecision::Kind::kProcesses:
      return "processes";
    case ExecutorDecision::Kind::kThreads:
      return "threads";
    default:
      return "stay";
  }
}

ExecutorPolicy::ExecutorPolicy(int cores, bool forked, bool persistent, bool threads_allowed,
                               int batch_size)
    : cores_(std::max(1, cores)),
      batch_size_(std::max(1, batch_size)),
      start_s_(forked ? 0.0 : kSpawnStartS),
      persistent_(persistent),
      threads_allowed_(threads_allowed) {}

ExecutorDecision ExecutorPolicy::stay() {
  return {ExecutorDecision::Kind::kStay, 0, "the measured work does not pay for workers"};
}

ExecutorDecision ExecutorPolicy::processes(std::string reason) const {
  const double batch_s = pace_ * batch_size_;
  if (batch_s > kHelpBatchS && cores_ > 1)
    return {ExecutorDecision::Kind::kProcesses, cores_,
            reason + format("; a batch takes %.0f ms here: one worker a core", batch_s * 1e3)};
  return {ExecutorDecision::Kind::kProcesses, std::max(1, cores_ - 1), std::move(reason)};
}

ExecutorDecision ExecutorPolicy::first_chunks(double seconds_per_sample, double rest_of_batch) {
  pace_ = std::min(pace_, seconds_per_sample);
  const double work = pace_ * rest_of_batch;
  if (work > kForkNowS + start_s_)
    return processes(format("the first batch's rest takes %.0f ms here", work * 1e3));
  return stay();
}

ExecutorDecision ExecutorPolicy::thread_trial(double one_thread_s, double two_threads_s) const {
  if (two_threads_s < kThreadGain * one_thread_s)
    return {ExecutorDecision::Kind::kThreads, cores_,
            format("two threads took %.2fx one thread's time a sample: the work releases the GIL",
                   two_threads_s / one_thread_s)};
  return stay();
}

ExecutorDecision ExecutorPolicy::after_batch(double seconds_per_sample, double samples_left) {
  pace_ = std::min(pace_, seconds_per_sample);
  const double work = pace_ * samples_left;
  const double pays = (persistent_ ? kForkPersistentS : kForkEpochS) + start_s_;
  if (work > pays) return processes(format("the rest of the epoch takes %.2f s here", work));
  return stay();
}

}  // namespace stoker
