#include "stoker/tuning/tuner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>

#include "stoker/errors.h"

namespace stoker {
namespace {

using Clock = std::chrono::steady_clock;

struct Eval {
  std::vector<double> runs;
  double mean = 0;      // the median of the runs: one disturbed run does not move it
  double noise = 0;     // (max - min) / median, the spread reported to the user
  double decision = 0;  // 2 x 1.4826 x MAD / median: a robust two-sigma band for comparisons
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  if (v.size() % 2 == 1) return v[mid];
  const double upper = v[mid];
  return (*std::max_element(v.begin(), v.begin() + mid) + upper) / 2;
}

std::string describe(const Config& c) {
  std::string s;
  for (const auto& [k, v] : c) s += (s.empty() ? "" : ", ") + k + "=" + std::to_string(v);
  return "{" + s + "}";
}

void check_knobs(const std::vector<Knob>& knobs) {
  if (knobs.empty()) throw InvalidArgument("tune needs at least one knob");
  for (const Knob& k : knobs) {
    if (k.values.empty()) throw InvalidArgument("knob " + k.name + " has no values");
    if (!std::is_sorted(k.values.begin(), k.values.end()) ||
        std::adjacent_find(k.values.begin(), k.values.end()) != k.values.end())
      throw InvalidArgument("knob " + k.name + ": values must be strictly ascending");
    if (k.values.front() < k.min || k.values.back() > k.max)
      throw InvalidArgument("knob " + k.name + ": values must lie in [" + std::to_string(k.min) +
                            ", " + std::to_string(k.max) + "]");
    if (std::find(k.values.begin(), k.values.end(), k.start) == k.values.end())
      throw InvalidArgument("knob " + k.name + ": start " + std::to_string(k.start) +
                            " is not one of its values");
  }
}

class Search {
 public:
  Search(const std::vector<Knob>& knobs, const MeasureFn& measure, const TuneOptions& options,
         const MemoryFn& memory, const ProgressFn& progress)
      : knobs_(knobs), measure_(measure), opt_(options), memory_(memory), progress_(progress) {}

  TuneResult run() {
    Config incumbent;
    for (const Knob& k : knobs_) incumbent[k.name] = k.start;
    incumbent = fit_budget(incumbent);
    if (!evaluate(incumbent)) return finish(incumbent, "time_budget");

    std::string stopped = "max_rounds";
    for (int round = 1; round <= opt_.max_rounds; ++round) {
      result_.rounds = round;
      bool moved = false;
      for (const Knob& k : knobs_) {
        const std::optional<bool> m = climb(k, incumbent);
        if (!m) return finish(incumbent, "time_budget");
        moved = moved || *m;
      }
      if (!moved) {
        // Knobs interact (more workers pay off only with larger batches, say): before stopping,
        // try raising each pair of knobs together, a step each.
        const std::optional<bool> jumped = probe_pairs(incumbent);
        if (!jumped) return finish(incumbent, "time_budget");
        if (!*jumped) {
          stopped = "converged";
          break;
        }
      }
    }
    return finish(incumbent, stopped);
  }

 private:
  uint64_t estimate(const Config& c) const { return memory_ ? memory_(c) : 0; }
  bool fits(const Config& c) const {
    return opt_.memory_budget == 0 || estimate(c) <= opt_.memory_budget;
  }

  // The start, with knobs lowered (last knob first) until the estimate fits the budget.
  Config fit_budget(Config c) {
    for (auto k = knobs_.rbegin(); k != knobs_.rend() && !fits(c); ++k) {
      auto it = std::find(k->values.begin(), k->values.end(), c[k->name]);
      while (it != k->values.begin() && !fits(c)) c[k->name] = *--it;
    }
    if (!fits(c))
      throw InvalidArgument("no configuration fits memory_budget (" +
                            std::to_string(opt_.memory_budget) + " bytes): the smallest, " +
                            describe(c) + ", needs about " + std::to_string(estimate(c)) +
                            " bytes");
    return c;
  }

  // nullptr when over the memory budget; nullopt-like stop via out_of_time_.
  const Eval* evaluate(const Config& c) {
    if (auto it = cache_.find(c); it != cache_.end()) return &it->second;
    if (!fits(c)) {
      if (std::find(result_.over_budget.begin(), result_.over_budget.end(), c) ==
          result_.over_budget.end())
        result_.over_budget.push_back(c);
      return nullptr;
    }
    Eval e;
    for (int r = 0; r < opt_.repeats; ++r) {
      if (out_of_time()) {
        out_of_time_ = true;
        return nullptr;
      }
      const auto start = Clock::now();
      const double v = measure_(c);
      TunePoint p{c, v, r, std::chrono::duration<double>(Clock::now() - start).count(),
                  estimate(c)};
      result_.measuring_seconds += p.seconds;
      result_.points.push_back(p);
      if (progress_) progress_(p);
      e.runs.push_back(v);
    }
    e.mean = median(e.runs);
    const auto [lo, hi] = std::minmax_element(e.runs.begin(), e.runs.end());
    e.noise = e.mean > 0 ? (*hi - *lo) / e.mean : 0;
    std::vector<double> dev;
    for (double v : e.runs) dev.push_back(std::abs(v - e.mean));
    e.decision = e.mean > 0 ? 2 * 1.4826 * median(dev) / e.mean : 0;
    return &cache_.emplace(c, std::move(e)).first->second;
  }

  bool out_of_time() const {
    return opt_.time_budget_s > 0 && result_.measuring_seconds >= opt_.time_budget_s;
  }

  // Moves knob `k` of `incumbent` to its best neighbour, repeatedly: up first, down if up did
  // not move. For the plateau knob, a step down is taken when it stays within plateau_tolerance
  // of the best seen on that axis (fewer workers for the same throughput). Returns whether it
  // moved; nullopt when the time budget ran out.
  std::optional<bool> climb(const Knob& k, Config& incumbent) {
    const bool plateau = k.name == opt_.plateau_knob;
    size_t idx = std::find(k.values.begin(), k.values.end(), incumbent[k.name]) - k.values.begin();
    bool moved = false;
    for (int dir : {+1, -1}) {
      double axis_best = cache_.at(incumbent).mean;
      for (;;) {
        if ((dir < 0 && idx == 0) || (dir > 0 && idx + 1 >= k.values.size())) break;
        const size_t j = idx + dir;
        Config cand = incumbent;
        cand[k.name] = k.values[j];
        const Eval* e = evaluate(cand);
        if (out_of_time_) return std::nullopt;
        if (e == nullptr) break;  // over budget
        const Eval& inc = cache_.at(incumbent);
        double noise = std::max({inc.decision, e->decision, opt_.noise_floor});
        // On the plateau axis a step up must also clear the plateau tolerance, or a later step
        // down (accepted within that tolerance) could undo it round after round.
        if (plateau) noise = std::max(noise, opt_.plateau_tolerance);
        axis_best = std::max(axis_best, e->mean);
        const bool better = e->mean > inc.mean * (1 + noise);
        const bool cheaper_same =
            plateau && dir < 0 && e->mean >= axis_best * (1 - opt_.plateau_tolerance);
        if (!better && !cheaper_same) break;
        incumbent = cand;
        idx = j;
        moved = true;
      }
      if (moved) break;
    }
    return moved;
  }

  // Moves the incumbent to the best configuration one step up on two knobs at once, if that beats
  // it by more than the noise. Returns whether it moved; nullopt when the time budget ran out.
  std::optional<bool> probe_pairs(Config& incumbent) {
    auto step_up = [&](const Knob& k, Config& c) {
      auto it = std::find(k.values.begin(), k.values.end(), c[k.name]);
      if (it == k.values.end() || it + 1 == k.values.end()) return false;
      c[k.name] = *(it + 1);
      return true;
    };
    const Eval inc = cache_.at(incumbent);
    std::optional<Config> best;
    double best_value = 0;
    for (size_t i = 0; i < knobs_.size(); ++i)
      for (size_t j = i + 1; j < knobs_.size(); ++j) {
        Config cand = incumbent;
        if (!step_up(knobs_[i], cand) || !step_up(knobs_[j], cand)) continue;
        const Eval* e = evaluate(cand);
        if (out_of_time_) return std::nullopt;
        if (e == nullptr) continue;  // over budget
        const double noise = std::max({inc.decision, e->decision, opt_.noise_floor});
        if (e->mean > inc.mean * (1 + noise) && e->mean > best_value) {
          best = cand;
          best_value = e->mean;
        }
      }
    if (!best) return false;
    incumbent = *best;
    return true;
  }

  TuneResult finish(Config incumbent, const std::string& stopped) {
    result_.stopped = stopped;
    for (const auto& [c, e] : cache_)
      if (e.mean > result_.best_samples_per_s) {
        result_.best_samples_per_s = e.mean;
        result_.best = c;
      }
    // Plateau rule on the final configuration's plateau axis.
    if (incumbent.count(opt_.plateau_knob) != 0 && cache_.count(incumbent) != 0) {
      double best = 0;
      std::vector<std::pair<int64_t, double>> axis;
      for (const auto& [c, e] : cache_) {
        Config other = c;
        other[opt_.plateau_knob] = incumbent[opt_.plateau_knob];
        if (other != incumbent) continue;
        axis.emplace_back(c.at(opt_.plateau_knob), e.mean);
        best = std::max(best, e.mean);
      }
      std::sort(axis.begin(), axis.end());
      for (const auto& [v, mean] : axis)
        if (mean >= best * (1 - opt_.plateau_tolerance)) {
          incumbent[opt_.plateau_knob] = v;
          break;
        }
    }
    result_.recommended = incumbent;
    if (auto it = cache_.find(incumbent); it != cache_.end()) {
      result_.samples_per_s = it->second.mean;
      result_.noise = it->second.noise;
    }
    return std::move(result_);
  }

  const std::vector<Knob>& knobs_;
  const MeasureFn& measure_;
  const TuneOptions& opt_;
  const MemoryFn& memory_;
  const ProgressFn& progress_;
  std::map<Config, Eval> cache_;
  TuneResult result_;
  bool out_of_time_ = false;
};

}  // namespace

TuneResult tune(const std::vector<Knob>& knobs, const MeasureFn& measure,
                const TuneOptions& options, const MemoryFn& memory, const ProgressFn& progress) {
  check_knobs(knobs);
  if (!measure) throw InvalidArgument("tune needs a measurement callback");
  if (options.repeats < 1) throw InvalidArgument("repeats must be at least 1");
  if (options.max_rounds < 1) throw InvalidArgument("max_rounds must be at least 1");
  return Search(knobs, measure, options, memory, progress).run();
}

uint64_t estimate_loader_memory(const Config& config, uint64_t sample_bytes,
                                int64_t default_batch_size, int64_t default_prefetch) {
  auto get = [&](const char* name, int64_t def) {
    auto it = config.find(name);
    return it == config.end() ? def : it->second;
  };
  const uint64_t batch =
      static_cast<uint64_t>(std::max<int64_t>(get("batch_size", default_batch_size), 1));
  const uint64_t workers = static_cast<uint64_t>(std::max<int64_t>(get("num_workers", 1), 0));
  const uint64_t prefetch =
      static_cast<uint64_t>(std::max<int64_t>(get("prefetch_factor", default_prefetch), 1));
  const uint64_t buffers = prefetch * workers + workers + 1;
  return sample_bytes * batch * buffers;
}

EngineOptions apply_config(EngineOptions o, const Config& config) {
  for (const auto& [k, v] : config) {
    if (k == "num_workers")
      o.num_workers = static_cast<int>(v);
    else if (k == "prefetch_factor")
      o.prefetch_factor = static_cast<int>(v);
    else if (k == "pin_memory")
      o.pin_memory = v != 0 ? PinMemory::kOn : PinMemory::kOff;
    else if (k == "batch_size")
      o.batch_size = static_cast<uint64_t>(v);
    else
      throw InvalidArgument("unknown loader knob " + k);
  }
  return o;
}

double measure_loader(std::shared_ptr<const Source> source, const EngineOptions& options,
                      double min_seconds, uint64_t min_batches) {
  Engine loader(std::move(source), options);
  if (loader.num_batches() == 0) throw InvalidArgument("the dataset has no batches");
  uint64_t epoch = 0;
  std::unique_ptr<EpochIterator> it = loader.iterate(epoch), next_it;
  if (!it->next()) return 0;  // the first batch: thread start, not timed
  // A short dataset would measure its epoch-end tail (workers idle while the last batches finish)
  // as much as its steady state; a training epoch is long enough for the tail not to matter. So
  // the next epoch starts as the current one nears its end, as if epochs were one long stream.
  const uint64_t lead = static_cast<uint64_t>(std::max(options.num_workers, 1));
  uint64_t batches = 0, samples = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (batches < min_batches || elapsed < min_seconds) {
    if (!next_it && it->position() + lead >= loader.num_batches())
      next_it = loader.iterate(++epoch);
    std::shared_ptr<Batch> b = it->next();
    if (!b) {
      it = std::move(next_it);
      continue;
    }
    ++batches;
    samples += b->length;
    b.reset();
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return elapsed > 0 ? samples / elapsed : 0;
}

}  // namespace stoker
