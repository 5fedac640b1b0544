#include "stoker/tuning/tuner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "stoker/errors.h"

namespace stoker {
namespace {

// Throughput saturating at 4 workers (a plateau), peaking at prefetch 4, flat in pin_memory.
double model(const Config& c) {
  const double w = static_cast<double>(c.at("num_workers"));
  const double p = static_cast<double>(c.at("prefetch_factor"));
  double v = 1000.0 * std::min(w, 4.0) + (w > 4 ? -10.0 * (w - 4) : 0.0);
  v *= p >= 4 ? 1.0 : (p == 2 ? 0.9 : 0.7);
  return v;
}

std::vector<Knob> knobs() {
  return {{"num_workers", {1, 2, 3, 4, 6, 8, 12, 16}, 8, 0, 256},
          {"prefetch_factor", {1, 2, 4, 8}, 2, 1, 64},
          {"pin_memory", {0, 1}, 0, 0, 1}};
}

TEST(Tuner, FindsThePlateauDeterministic) {
  int calls = 0;
  TuneOptions o;
  TuneResult r = tune(
      knobs(),
      [&](const Config& c) {
        ++calls;
        return model(c);
      },
      o);
  EXPECT_EQ(r.recommended.at("num_workers"), 4);
  EXPECT_EQ(r.recommended.at("prefetch_factor"), 4);
  EXPECT_EQ(r.stopped, "converged");
  EXPECT_NEAR(r.samples_per_s, 4000, 1e-9);
  EXPECT_EQ(static_cast<size_t>(calls), r.points.size());
  EXPECT_EQ(calls % o.repeats, 0);
  EXPECT_LT(calls / o.repeats, 8 * 4 * 2);  // fewer configurations than the grid
}

TEST(Tuner, SeededNoiseStillFindsThePlateau) {
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(1.0, 0.01);
  TuneResult r = tune(knobs(), [&](const Config& c) { return model(c) * noise(rng); }, {});
  EXPECT_EQ(r.recommended.at("num_workers"), 4);
  EXPECT_GE(r.recommended.at("prefetch_factor"), 4);
  EXPECT_GT(r.noise, 0);
}

TEST(Tuner, PlateauPicksFewestWorkersWithinTolerance) {
  // 3 workers reach 99% of the best (at 8): recommend 3.
  auto f = [](const Config& c) {
    const int64_t w = c.at("num_workers");
    return w >= 3 ? (w >= 8 ? 1000.0 : 990.0) : 400.0 * w;
  };
  TuneResult r = tune({{"num_workers", {1, 2, 3, 4, 6, 8}, 1, 0, 256}}, f, {});
  EXPECT_EQ(r.recommended.at("num_workers"), 3);
}

TEST(Tuner, NeverMeasuresOverTheMemoryBudget) {
  TuneOptions o;
  const uint64_t sample = 1000;
  o.memory_budget =
      estimate_loader_memory({{"num_workers", 3}, {"prefetch_factor", 2}}, sample, 10);
  auto mem = [&](const Config& c) { return estimate_loader_memory(c, sample, 10); };
  TuneResult r = tune(knobs(), model, o, mem);
  for (const TunePoint& p : r.points) {
    EXPECT_LE(p.memory_estimate, o.memory_budget);
    EXPECT_LE(mem(p.config), o.memory_budget);
  }
  EXPECT_FALSE(r.over_budget.empty());
  EXPECT_LE(mem(r.recommended), o.memory_budget);
}

TEST(Tuner, StopsOnTheTimeBudgetAndRejectsBadKnobs) {
  TuneOptions o;
  o.time_budget_s = 1e-9;
  TuneResult r = tune(knobs(), model, o);
  EXPECT_EQ(r.stopped, "time_budget");
  EXPECT_LE(r.points.size(), 1u);
  EXPECT_THROW(tune({{"x", {2, 1}, 1}}, model, {}), InvalidArgument);
  EXPECT_THROW(tune({{"x", {1, 2}, 3}}, model, {}), InvalidArgument);
  EXPECT_THROW(tune({{"x", {1, 300}, 1, 0, 256}}, model, {}), InvalidArgument);
  TuneOptions tiny;
  tiny.memory_budget = 1;
  EXPECT_THROW(tune(knobs(), model, tiny, [](const Config&) { return uint64_t{100}; }),
               InvalidArgument);
}

TEST(Tuner, MemoryEstimate) {
  // 10 bytes x batch 4 x (2 x 3 + 3 + 1) buffers
  EXPECT_EQ(estimate_loader_memory({{"num_workers", 3}, {"prefetch_factor", 2}}, 10, 4), 400u);
  EXPECT_EQ(estimate_loader_memory({{"num_workers", 0}, {"batch_size", 8}}, 10, 4), 80u);
}

}  // namespace
}  // namespace stoker
