#include "engine/autotune.h"

#include <algorithm>
#include <cstdio>
#include <list>
#include <mutex>
#include <utility>

namespace stoker {

AutotuneController::AutotuneController(const AutotuneLimits& limits, int workers, int prefetch)
    : lim_(limits), workers_(std::max(workers, 1)), prefetch_(std::max(prefetch, 1)) {
  lim_.max_workers = std::max(lim_.max_workers, 1);
  lim_.max_prefetch = std::max(lim_.max_prefetch, 1);
  // Start within the memory budget.
  while (!fits(workers_, prefetch_) && prefetch_ > 1) --prefetch_;
  while (!fits(workers_, prefetch_) && workers_ > 1) --workers_;
}

uint64_t AutotuneController::depth(int workers, int prefetch) const {
  return lim_.shared_depth ? uint64_t(prefetch) : uint64_t(workers) * uint64_t(prefetch);
}

bool AutotuneController::fits(int workers, int prefetch) const {
  if (lim_.max_buffers == 0) return true;
  // Whole batches per worker: each worker may hold one more while it waits to claim. Shared
  // batches: one buffer being taken for the next batch. Plus the consumer's.
  const uint64_t extra = lim_.shared_depth ? 2 : uint64_t(workers) + 1;
  return depth(workers, prefetch) + extra <= lim_.max_buffers;
}

std::optional<AutotuneDecision> AutotuneController::change(double now_s, const AutotuneFigures& f,
                                                           int workers, int prefetch,
                                                           std::string reason) {
  AutotuneDecision d{now_s, workers_, workers, prefetch_, prefetch, f, std::move(reason)};
  workers_ = workers;
  prefetch_ = prefetch;
  calm_windows_ = 0;
  return d;
}

bool AutotuneController::failed(Trial& t, double now_s, double samples_per_s, int undo_to,
                                bool eligible) {
  if (!t.before) return false;
  const double before = *t.before;
  t.before.reset();
  if (!eligible || samples_per_s >= before * (1 + lim_.min_gain)) return false;
  t.ceiling = undo_to;
  t.ceiling_until = now_s + lim_.ceiling_seconds;
  return true;
}

std::optional<AutotuneDecision> AutotuneController::update(double now_s, const AutotuneFigures& f) {
  for (Trial* t : {&grow_, &deepen_})
    if (t->ceiling != 0 && now_s >= t->ceiling_until) t->ceiling = 0;
  const bool starved = f.consumer_wait_fraction > lim_.wait_high;
  char why[160];
  const double before_deepen = deepen_.before.value_or(0);
  if (failed(deepen_, now_s, f.samples_per_s, prefetch_ - 1, prefetch_ > 1)) {
    std::snprintf(why, sizeof why,
                  "the last prefetch step added no throughput (%.0f -> %.0f samples/s): "
                  "prefetch ceiling %d",
                  before_deepen, f.samples_per_s, deepen_.ceiling);
    return change(now_s, f, workers_, prefetch_ - 1, why);
  }
  const double before_grow = grow_.before.value_or(0);
  if (failed(grow_, now_s, f.samples_per_s, workers_ - 1, starved)) {
    std::snprintf(why, sizeof why,
                  "the last worker added no throughput (%.0f -> %.0f samples/s): cores "
                  "saturated, ceiling %d",
                  before_grow, f.samples_per_s, grow_.ceiling);
    return change(now_s, f, workers_ - 1, prefetch_, why);
  }

  if (starved) {
    calm_windows_ = 0;
    if (shrunk_last_) {  // the last shrink starved the consumer: undo it, never go below again
      shrunk_last_ = false;
      floor_ = workers_ + 1;
      if (workers_ + 1 <= lim_.max_workers && fits(workers_ + 1, prefetch_))
        return change(now_s, f, workers_ + 1, prefetch_, "the last shrink starved the consumer");
    }
    const int cap = grow_.cap(lim_.max_workers);
    if (lim_.tune_workers && f.worker_busy_fraction >= lim_.busy_high && workers_ < cap) {
      if (fits(workers_ + 1, prefetch_)) {
        grow_.before = f.samples_per_s;
        return change(now_s, f, workers_ + 1, prefetch_, "consumer waits, workers busy");
      }
      if (lim_.tune_prefetch && prefetch_ > 1 && fits(workers_ + 1, prefetch_ - 1)) {
        grow_.before = f.samples_per_s;
        return change(now_s, f, workers_ + 1, prefetch_ - 1,
                      "consumer waits, workers busy; memory budget: shallower prefetch");
      }
    }
    const int prefetch_cap = deepen_.cap(lim_.max_prefetch);
    if (lim_.tune_prefetch && f.worker_blocked_fraction > lim_.blocked_high &&
        prefetch_ < prefetch_cap && fits(workers_, prefetch_ + 1)) {
      deepen_.before = f.samples_per_s;
      return change(now_s, f, workers_, prefetch_ + 1,
                    "consumer waits, workers blocked by the prefetch depth: deeper prefetch");
    }
    // Neither busy nor blocked: the time goes to per-batch hand-offs (small, fast batches).
    // Another worker overlaps them; the check after the grow undoes it if it does not pay.
    if (lim_.tune_workers && workers_ < cap && fits(workers_ + 1, prefetch_)) {
      grow_.before = f.samples_per_s;
      return change(now_s, f, workers_ + 1, prefetch_,
                    "consumer waits, workers neither busy nor blocked: overlap hand-offs");
    }
    return std::nullopt;
  }

  shrunk_last_ = false;
  if (f.consumer_wait_fraction < lim_.wait_low && lim_.tune_workers && workers_ > floor_) {
    const double load = f.worker_busy_fraction * workers_ / (workers_ - 1);
    if (load < lim_.shrink_busy) {
      if (++calm_windows_ >= lim_.shrink_windows) {
        shrunk_last_ = true;
        return change(now_s, f, workers_ - 1, prefetch_,
                      "consumer never waits and one worker fewer would carry the load");
      }
      return std::nullopt;
    }
  }
  calm_windows_ = 0;
  return std::nullopt;
}

namespace {

std::mutex memory_mu;
// Most recently used first; bounded by kEntries.
std::list<std::pair<std::string, AutotuneStart>>& memory_entries() {
  static std::list<std::pair<std::string, AutotuneStart>> entries;
  return entries;
}

}  // namespace

std::optional<AutotuneStart> AutotuneMemory::recall(const std::string& key) {
  if (key.empty()) return std::nullopt;
  std::lock_guard lock(memory_mu);
  auto& entries = memory_entries();
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    if (it->first == key) {
      entries.splice(entries.begin(), entries, it);
      return entries.front().second;
    }
  }
  return std::nullopt;
}

void AutotuneMemory::remember(const std::string& key, AutotuneStart start) {
  if (key.empty()) return;
  std::lock_guard lock(memory_mu);
  auto& entries = memory_entries();
  for (auto it = entries.begin(); it != entries.end(); ++it) {
    if (it->first == key) {
      entries.erase(it);
      break;
    }
  }
  entries.emplace_front(key, start);
  if (entries.size() > kEntries) entries.pop_back();
}

void AutotuneMemory::forget_all() {
  std::lock_guard lock(memory_mu);
  memory_entries().clear();
}

AutotuneStart autotune_start(const std::optional<AutotuneStart>& learned, int max_workers,
                             int cores, int prefetch, int max_prefetch) {
  max_workers = std::max(max_workers, 1);
  max_prefetch = std::max(max_prefetch, 1);
  if (learned)
    return {std::clamp(learned->workers, 1, max_workers),
            std::clamp(learned->prefetch, 1, max_prefetch)};
  return {std::clamp(cores, 1, max_workers), std::clamp(prefetch, 1, max_prefetch)};
}

}  // namespace stoker
