#include "stoker/autotune.h"

#include <algorithm>
#include <cstdio>

namespace stoker {

AutotuneController::AutotuneController(const AutotuneLimits& limits, int workers, int prefetch)
    : lim_(limits), workers_(std::max(workers, 1)), prefetch_(std::max(prefetch, 1)) {
  lim_.max_workers = std::max(lim_.max_workers, 1);
  lim_.max_prefetch = std::max(lim_.max_prefetch, 1);
  // Start within the memory budget.
  while (!fits(workers_, prefetch_) && prefetch_ > 1) --prefetch_;
  while (!fits(workers_, prefetch_) && workers_ > 1) --workers_;
}

bool AutotuneController::fits(int workers, int prefetch) const {
  if (lim_.max_buffers == 0) return true;
  return uint64_t(workers) * uint64_t(prefetch) + uint64_t(workers) + 1 <= lim_.max_buffers;
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

std::optional<AutotuneDecision> AutotuneController::update(double now_s, const AutotuneFigures& f) {
  if (ceiling_ != 0 && now_s >= ceiling_until_) ceiling_ = 0;
  if (prefetch_ceiling_ != 0 && now_s >= prefetch_ceiling_until_) prefetch_ceiling_ = 0;

  // The window after a deeper prefetch: keep it only if it paid.
  if (deepen_check_) {
    const double before = *deepen_check_;
    deepen_check_.reset();
    if (f.samples_per_s < before * (1 + lim_.min_gain) && prefetch_ > 1) {
      prefetch_ceiling_ = prefetch_ - 1;
      prefetch_ceiling_until_ = now_s + lim_.ceiling_seconds;
      char why[160];
      std::snprintf(why, sizeof why,
                    "the last prefetch step added no throughput (%.0f -> %.0f samples/s): "
                    "prefetch ceiling %d",
                    before, f.samples_per_s, prefetch_ceiling_);
      return change(now_s, f, workers_, prefetch_ - 1, why);
    }
  }
  const bool starved = f.consumer_wait_fraction > lim_.wait_high;

  // The window after a grow: keep the worker only if it paid.
  if (grow_check_) {
    const double before = *grow_check_;
    grow_check_.reset();
    if (starved && f.samples_per_s < before * (1 + lim_.min_gain)) {
      ceiling_ = workers_ - 1;
      ceiling_until_ = now_s + lim_.ceiling_seconds;
      char why[160];
      std::snprintf(why, sizeof why,
                    "the last worker added no throughput (%.0f -> %.0f samples/s): cores "
                    "saturated, ceiling %d",
                    before, f.samples_per_s, ceiling_);
      return change(now_s, f, workers_ - 1, prefetch_, why);
    }
  }

  if (starved) {
    calm_windows_ = 0;
    if (shrunk_last_) {  // the last shrink starved the consumer: undo it, never go below again
      shrunk_last_ = false;
      floor_ = workers_ + 1;
      if (workers_ + 1 <= lim_.max_workers && fits(workers_ + 1, prefetch_))
        return change(now_s, f, workers_ + 1, prefetch_, "the last shrink starved the consumer");
    }
    const int cap = ceiling_ != 0 ? std::min(ceiling_, lim_.max_workers) : lim_.max_workers;
    if (lim_.tune_workers && f.worker_busy_fraction >= lim_.busy_high && workers_ < cap) {
      if (fits(workers_ + 1, prefetch_)) {
        grow_check_ = f.samples_per_s;
        return change(now_s, f, workers_ + 1, prefetch_, "consumer waits, workers busy");
      }
      if (lim_.tune_prefetch && prefetch_ > 1 && fits(workers_ + 1, prefetch_ - 1)) {
        grow_check_ = f.samples_per_s;
        return change(now_s, f, workers_ + 1, prefetch_ - 1,
                      "consumer waits, workers busy; memory budget: shallower prefetch");
      }
    }
    const int prefetch_cap =
        prefetch_ceiling_ != 0 ? std::min(prefetch_ceiling_, lim_.max_prefetch) : lim_.max_prefetch;
    if (lim_.tune_prefetch && f.worker_blocked_fraction > lim_.blocked_high &&
        prefetch_ < prefetch_cap && fits(workers_, prefetch_ + 1)) {
      deepen_check_ = f.samples_per_s;
      return change(now_s, f, workers_, prefetch_ + 1,
                    "consumer waits, workers blocked by the prefetch depth: deeper prefetch");
    }
    // Neither busy nor blocked: the time goes to per-batch hand-offs (small, fast batches).
    // Another worker overlaps them; the check after the grow undoes it if it does not pay.
    if (lim_.tune_workers && workers_ < cap && fits(workers_ + 1, prefetch_)) {
      grow_check_ = f.samples_per_s;
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

}  // namespace stoker
