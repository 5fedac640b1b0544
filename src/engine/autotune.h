// The online autotune controller: while training runs, it sets the number of active worker threads
// and the prefetch depth of a loader whose num_workers / prefetch_factor are "auto".
//
// Stoker's stages are fused (a worker reads, decodes, transforms and collates a sample into its
// batch slot), so the two stages it balances are the worker pool and the consumer. Every window
// (>= kWindow and a few batches) it gets the figures of that window and decides:
// - starved (consumer waits > wait_high of the time):
//   - workers busy (>= busy_high): one more active worker, within the CPU budget and the memory
//     budget. The next window checks the gain: less than min_gain (and still starved) means the
//     cores are saturated: the worker is removed and that count becomes a ceiling for
//     ceiling_seconds.
//   - workers blocked by the prefetch depth (> blocked_high of their time): one more prefetch
//     step, checked like a grow: undone, with a ceiling, if it brought less than min_gain. (Idle
//     time at epoch ends is neither busy nor blocked, hence busy_high below 1.)
//   - neither: the time goes to per-batch hand-offs; one more worker, kept only if it pays.
// - comfortable (consumer waits < wait_low) for shrink_windows windows in a row, with the
//   workers' load fitting in one worker fewer below shrink_busy: one worker fewer (parked, not
//   destroyed). A shrink that starves the consumer is undone and its count becomes a floor.
// - in between: nothing (hysteresis band).
// Depth (batches claimed or ready ahead of the consumer): workers x prefetch, as torch's
// prefetch_factor; with shared_depth (large batches, which the workers fill together), prefetch
// itself is the number of batches in flight for all workers.
// Memory: the buffers the depth needs, plus the consumer's and one being taken, never exceed the
// pool's capacity (the memory budget).
//
// Internal to the engine: the loader runs it. The figures it decides on and the decisions it
// makes (AutotuneFigures, AutotuneDecision) are stats() values, in include/stoker/engine.h.
//
// Thread safety: AutotuneController is not thread-safe; the iterator calls it from the consumer
// thread, under its lock. AutotuneMemory is safe to use from any thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "stoker/engine.h"

namespace stoker {

// The largest prefetch the controller may choose (per worker, or in all with shared_depth).
inline constexpr int kAutotuneMaxPrefetch = 8;

struct AutotuneLimits {
  bool tune_workers = true;
  bool tune_prefetch = true;
  int max_workers = 1;  // the CPU budget (threads that exist)
  int max_prefetch = 16;
  uint64_t max_buffers = 0;   // pool capacity under the memory budget
  bool shared_depth = false;  // depth = prefetch, not workers x prefetch
  double wait_high = 0.10, wait_low = 0.03;
  double busy_high = 0.60, shrink_busy = 0.70, blocked_high = 0.10;
  double min_gain = 0.05;
  int shrink_windows = 3;
  double ceiling_seconds = 30;
};

class AutotuneController {
 public:
  AutotuneController(const AutotuneLimits& limits, int workers, int prefetch);

  // Feeds one window's figures, taken at time `now_s`; returns the change made, if any.
  std::optional<AutotuneDecision> update(double now_s, const AutotuneFigures& f);

  int workers() const { return workers_; }
  int prefetch() const { return prefetch_; }
  uint64_t depth() const { return depth(workers_, prefetch_); }
  uint64_t depth(int workers, int prefetch) const;
  // Whether `workers` x `prefetch` stays within max_buffers.
  bool fits(int workers, int prefetch) const;

 private:
  std::optional<AutotuneDecision> change(double now_s, const AutotuneFigures& f, int workers,
                                         int prefetch, std::string reason);

  AutotuneLimits lim_;
  int workers_, prefetch_;
  // After a grow: the throughput before it, to check the gain in the next window.
  // A step up (one more worker, one more prefetch) on trial: the next window keeps it only if
  // throughput rose by min_gain; otherwise it is undone and its old value becomes a ceiling.
  struct Trial {
    std::optional<double> before;  // samples/s of the window before the step
    int ceiling = 0;               // 0 = none
    double ceiling_until = 0;
    int cap(int limit) const { return ceiling != 0 ? std::min(ceiling, limit) : limit; }
  };
  // Ends `t`'s trial; true when the step did not pay and `undo_to` became the ceiling.
  bool failed(Trial& t, double now_s, double samples_per_s, int undo_to, bool eligible);
  Trial grow_, deepen_;
  int floor_ = 1;
  bool shrunk_last_ = false;
  int calm_windows_ = 0;
};

// Where "auto" starts. A loader built again on the same data (an evaluation pass, a loader per
// epoch) starts where the last one ended, from an in-process memory keyed by the data and the
// settings that shape the work (AutotuneMemory). Otherwise the consumer of a new loader waits
// from its first batch, so every worker the CPU budget allows (up to the usable cores) starts at
// once instead of one; the controller shrinks if fewer carry the load, and grows past the cores
// only if a trial pays. (The machine's load is not asked: /proc/loadavg's runnable count is an
// instant that other processes' bursts, and this process's own import, swing from 0 to all.)
struct AutotuneStart {
  int workers = 1;
  int prefetch = 1;
};

class AutotuneMemory {
 public:
  static constexpr size_t kEntries = 64;  // most recently used keys kept

  // The last values remembered for `key`; nothing for an empty key.
  static std::optional<AutotuneStart> recall(const std::string& key);
  static void remember(const std::string& key, AutotuneStart start);
  static void forget_all();  // for tests
};

// The start: `learned` if any (clamped to the limits), else min(cores, max_workers) workers at
// `prefetch`.
AutotuneStart autotune_start(const std::optional<AutotuneStart>& learned, int max_workers,
                             int cores, int prefetch, int max_prefetch);

}  // namespace stoker
