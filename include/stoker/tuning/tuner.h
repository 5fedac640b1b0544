// The offline tuner: finds the knob values (num_workers, prefetch_factor, pin_memory, batch_size,
// or any other integer knobs) that maximize a measured throughput, measuring as few
// configurations as it can.
//
// Search
// - Greedy coordinate hill-climbing: each knob in turn walks from the incumbent value to its
//   neighbours in its list of values while that improves, then the next knob; rounds repeat
//   until a whole round moves nothing (or max_rounds / the time budget is reached). Before
//   stopping, each pair of knobs is raised together by one step (knobs interact: more workers may
//   pay off only with larger batches); the best such move that beats the incumbent starts
//   another round.
// - Every configuration is measured `repeats` times; its throughput is the median of the repeats
//   and its spread ((max - min) / median) is reported. A move counts only if the candidate's
//   median beats the incumbent's by more than the larger robust noise band of the two (two
//   sigmas estimated from the median absolute deviation), floored at noise_floor: one disturbed
//   run on a shared machine neither fakes a gain nor hides a real one.
// - Plateau rule: for the plateau knob (num_workers), the recommendation is the smallest measured
//   value, other knobs as recommended, whose median is within plateau_tolerance of the best, so no
//   CPU is spent for a gain within a few percent.
// - Memory budget: a configuration whose estimate (memory_estimate) exceeds memory_budget is
//   never measured; it is recorded in Result::over_budget instead.
// - The measurement is a callback (samples per second of one run of a configuration), so one
//   tuner serves Stoker's native loader (measure_loader(), no Python per batch) and a Python
//   callback timing torch's DataLoader.
//
// Thread safety: Tuner::run is reentrant; callbacks are called from the calling thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "stoker/engine.h"
#include "stoker/source.h"

namespace stoker {

// A knob: explicit candidate values, ascending, within the hard caps [min, max].
struct Knob {
  std::string name;
  std::vector<int64_t> values;
  int64_t start = 0;  // where the climb starts; must be one of values
  int64_t min = INT64_MIN;
  int64_t max = INT64_MAX;
};

using Config = std::map<std::string, int64_t>;

struct TunePoint {
  Config config;
  double samples_per_s = 0;
  int repeat = 0;      // 0-based repeat number of this configuration
  double seconds = 0;  // measuring time of this run
  uint64_t memory_estimate = 0;
};

struct TuneOptions {
  int repeats = 3;
  double noise_floor = 0.02;        // relative; moves must beat max(noise, this)
  double plateau_tolerance = 0.03;  // relative; see the plateau rule
  std::string plateau_knob = "num_workers";
  uint64_t memory_budget = 0;  // bytes; 0 = no budget
  int max_rounds = 4;
  double time_budget_s = 0;  // total measuring seconds; 0 = none. Checked between measurements.
};

struct TuneResult {
  Config recommended;
  double samples_per_s = 0;  // median of the recommendation's repeats
  double noise = 0;          // relative spread of the recommendation's repeats
  Config best;               // highest median measured (before the plateau rule)
  double best_samples_per_s = 0;
  std::vector<TunePoint> points;    // every measurement, in order
  std::vector<Config> over_budget;  // configurations skipped by the memory budget
  double measuring_seconds = 0;
  int rounds = 0;
  std::string stopped;  // "converged", "max_rounds" or "time_budget"
};

using MeasureFn = std::function<double(const Config&)>;    // samples/s of one run
using MemoryFn = std::function<uint64_t(const Config&)>;   // estimated bytes of a configuration
using ProgressFn = std::function<void(const TunePoint&)>;  // after each measurement

// Throws InvalidArgument for empty knob lists, values outside [min, max], unsorted values, a
// start that is not a value, repeats < 1, or a start configuration over the memory budget when
// no smaller configuration fits (then nothing can be measured).
TuneResult tune(const std::vector<Knob>& knobs, const MeasureFn& measure,
                const TuneOptions& options, const MemoryFn& memory = nullptr,
                const ProgressFn& progress = nullptr);

// The loader's memory for a configuration: batch_bytes x (prefetch depth + workers + 1), where
// prefetch depth = prefetch_factor x num_workers and batch_bytes = sample_bytes x batch_size.
// Knobs absent from `config` take the defaults given.
uint64_t estimate_loader_memory(const Config& config, uint64_t sample_bytes,
                                int64_t default_batch_size, int64_t default_prefetch = 2);

// Samples/s of Stoker's loader over `source` with `options`: iterates batches (dropping each at
// once), across epochs as needed, for at least `min_seconds` and `min_batches` after the first
// batch, which is not timed (thread start). No Python runs per batch.
double measure_loader(std::shared_ptr<const Source> source, const EngineOptions& options,
                      double min_seconds, uint64_t min_batches = 4);

// Applies config entries num_workers, prefetch_factor, pin_memory (0/1) and batch_size to `base`.
EngineOptions apply_config(EngineOptions base, const Config& config);

}  // namespace stoker
