#include "engine/autotune.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "engine/engine_state.h"
#include "stoker/testing/faulty.h"

namespace stoker {
namespace {

// A simulated pipeline: each worker makes `per_worker` samples/s up to `cores` workers; the
// consumer takes `consumer` samples/s. Returns the window's figures for (workers).
AutotuneFigures simulate(int workers, double per_worker, int cores, double consumer,
                         double jitter = 1.0) {
  const double supply = per_worker * std::min(workers, cores) * jitter;
  const double rate = std::min(supply, consumer);
  AutotuneFigures f;
  f.seconds = 0.25;
  f.samples_per_s = rate;
  f.consumer_wait_fraction = supply >= consumer ? 0.0 : 1.0 - supply / consumer;
  f.worker_busy_fraction = std::min(1.0, rate / (per_worker * workers));
  return f;
}

TEST(Autotune, GrowsToTheCoresAndStops) {
  AutotuneLimits lim;
  lim.max_workers = 8;
  lim.max_buffers = 1000;
  AutotuneController c(lim, 1, 2);
  std::mt19937_64 rng(1);
  std::uniform_real_distribution<double> jitter(0.98, 1.02);
  int changes_late = 0;
  for (int t = 0; t < 200; ++t) {
    auto d = c.update(t * 0.25, simulate(c.workers(), 100, 4, 1e9, jitter(rng)));
    if (d && t > 40 && d->workers_from != d->workers_to) ++changes_late;
  }
  EXPECT_EQ(c.workers(), 4);
  // After the ceiling expires it may probe once more per ceiling period, never more often.
  EXPECT_LE(changes_late, 2 * 200 * 0.25 / lim.ceiling_seconds + 2);
}

TEST(Autotune, ShrinksForASlowConsumerWithoutOscillating) {
  AutotuneLimits lim;
  lim.max_workers = 8;
  AutotuneController c(lim, 8, 2);
  int decisions = 0;
  for (int t = 0; t < 200; ++t)
    if (c.update(t * 0.25, simulate(c.workers(), 100, 8, 250))) ++decisions;
  // 250 samples/s needs 3 workers at 83% each; 4 carry it at 62.5% (< 70% shrink threshold
  // for 3 would be 83%: stays at 4).
  EXPECT_EQ(c.workers(), 4);
  EXPECT_LE(decisions, 6);
}

TEST(Autotune, RespectsTheMemoryBudget) {
  AutotuneLimits lim;
  lim.max_workers = 16;
  lim.max_buffers = 7;
  AutotuneController c(lim, 1, 2);
  for (int t = 0; t < 100; ++t) {
    c.update(t * 0.25, simulate(c.workers(), 100, 16, 1e9));
    EXPECT_LE(c.depth() + c.workers() + 1, 7u);
  }
  EXPECT_GE(c.workers(), 2);
}

TEST(Autotune, DeeperPrefetchWhenWorkersIdleButConsumerWaits) {
  AutotuneLimits lim;
  lim.max_workers = 2;
  lim.max_buffers = 100;
  AutotuneController c(lim, 2, 1);
  AutotuneFigures f;
  f.consumer_wait_fraction = 0.3;
  f.worker_busy_fraction = 0.4;
  f.worker_blocked_fraction = 0.5;
  f.samples_per_s = 100;
  auto d = c.update(1, f);
  ASSERT_TRUE(d);
  EXPECT_EQ(d->prefetch_to, 2);
}

// Samples delivered over `windows` windows of 0.25 s by a pipeline (per_worker samples/s per
// worker up to `cores`, an infinitely fast consumer) under the controller, starting where
// autotune_start puts it; the static configuration delivers per_worker * min(workers, cores).
double delivered(AutotuneController& c, int windows, double per_worker, int cores,
                 std::mt19937_64* rng = nullptr) {
  std::uniform_real_distribution<double> jitter(0.97, 1.03);
  double samples = 0;
  for (int t = 0; t < windows; ++t) {
    const AutotuneFigures f =
        simulate(c.workers(), per_worker, cores, 1e9, rng ? jitter(*rng) : 1.0);
    samples += f.samples_per_s * f.seconds;
    c.update(t * 0.25, f);
  }
  return samples;
}

TEST(Autotune, StartsWithTheBudgetNotOne) {
  // No memory: every core within the budget, the default prefetch.
  auto s = autotune_start(std::nullopt, 8, 3, 2, 8);
  EXPECT_EQ(s.workers, 3);
  EXPECT_EQ(s.prefetch, 2);
  EXPECT_EQ(autotune_start(std::nullopt, 2, 16, 1, 8).workers, 2);  // capped by the budget
  // What a loader on the same data learned wins, within this loader's limits.
  s = autotune_start(AutotuneStart{3, 5}, 8, 8, 2, 8);
  EXPECT_EQ(s.workers, 3);
  EXPECT_EQ(s.prefetch, 5);
  s = autotune_start(AutotuneStart{12, 20}, 4, 1, 2, 8);
  EXPECT_EQ(s.workers, 4);
  EXPECT_EQ(s.prefetch, 8);
}

TEST(Autotune, AShortEpochFromTheBudgetMatchesTheBestStatic) {
  // 8 batches of 64 images at 1,000 images/s per worker on 2 cores: about 0.26 s, about one
  // controller window. Starting from one worker delivered 0.6x of the static best.
  AutotuneLimits lim;
  lim.max_workers = 2;
  lim.max_buffers = 100;
  lim.shared_depth = true;
  const AutotuneStart start = autotune_start(std::nullopt, 2, 2, 1, kAutotuneMaxPrefetch);
  AutotuneController c(lim, start.workers, start.prefetch);
  const double best_static = 2 * 1000.0 * 0.25;  // one window
  EXPECT_GE(delivered(c, 1, 1000, 2), 0.97 * best_static);
  AutotuneController from_one(lim, 1, 1);
  EXPECT_LT(delivered(from_one, 1, 1000, 2), 0.6 * best_static);
}

TEST(Autotune, LongRunsStayWithinThreePercentOfTheBestStatic) {
  std::mt19937_64 rng(5);
  for (int cores : {2, 4}) {
    for (int budget : {cores, 2 * cores}) {
      AutotuneLimits lim;
      lim.max_workers = budget;
      lim.max_buffers = 1000;
      lim.shared_depth = true;
      const AutotuneStart start = autotune_start(std::nullopt, budget, cores, 1, 8);
      AutotuneController c(lim, start.workers, start.prefetch);
      const int windows = 2000;  // 500 s
      const double best_static = 300.0 * cores * 0.25 * windows;
      EXPECT_GE(delivered(c, windows, 300, cores, &rng), 0.97 * best_static)
          << cores << " cores, budget " << budget;
    }
  }
}

TEST(Autotune, SharedDepthCountsBatchesInFlightForAllWorkers) {
  AutotuneLimits lim;
  lim.max_workers = 4;
  lim.shared_depth = true;
  lim.max_buffers = 3;  // one batch in flight, the consumer's, one being taken
  AutotuneController c(lim, 4, 1);
  EXPECT_EQ(c.depth(), 1u);
  EXPECT_TRUE(c.fits(4, 1));
  EXPECT_FALSE(c.fits(4, 2));
  AutotuneFigures f;  // workers blocked by the depth, consumer waiting: deeper only if it fits
  f.seconds = 0.25;
  f.consumer_wait_fraction = 0.5;
  f.worker_busy_fraction = 0.3;
  f.worker_blocked_fraction = 0.6;
  f.samples_per_s = 100;
  for (int t = 0; t < 50; ++t) {
    c.update(t * 0.25, f);
    EXPECT_LE(c.depth() + 2, 3u);
  }
  lim.shared_depth = false;  // per worker: depth 4 x 1 plus a buffer per worker and the consumer
  lim.max_buffers = 9;
  AutotuneController per_worker(lim, 4, 1);
  EXPECT_EQ(per_worker.depth(), 4u);
  EXPECT_TRUE(per_worker.fits(4, 1));
  EXPECT_FALSE(per_worker.fits(4, 2));
}

TEST(AutotuneMemory, RemembersTheMostRecentKeysOnly) {
  AutotuneMemory::forget_all();
  EXPECT_FALSE(AutotuneMemory::recall("a"));
  AutotuneMemory::remember("", {3, 3});  // no key, nothing kept
  EXPECT_FALSE(AutotuneMemory::recall(""));
  AutotuneMemory::remember("a", {2, 1});
  AutotuneMemory::remember("a", {3, 2});
  ASSERT_TRUE(AutotuneMemory::recall("a"));
  EXPECT_EQ(AutotuneMemory::recall("a")->workers, 3);
  for (size_t i = 0; i < AutotuneMemory::kEntries; ++i)
    AutotuneMemory::remember(std::string("k").append(std::to_string(i)), {1, 1});
  EXPECT_FALSE(AutotuneMemory::recall("a"));  // the least recently used went
  EXPECT_TRUE(AutotuneMemory::recall("k0"));
  AutotuneMemory::forget_all();
}

TEST(AutotuneMemory, ALoaderOnTheSameDataStartsWhereTheLastOneEnded) {
  AutotuneMemory::forget_all();
  auto src = std::make_shared<FaultySource>(1000, 4, std::set<uint64_t>{});
  EngineOptions o;
  o.batch_size = 16;
  o.cpu_budget = 6;
  Engine::State first(src, o);
  ASSERT_FALSE(first.autotune_key.empty());
  AutotuneDecision d;
  d.workers_from = first.autotune_active;
  d.workers_to = 5;
  d.prefetch_from = 2;
  d.prefetch_to = 3;
  first.record_autotune(d);
  Engine::State again(src, o);  // e.g. the next epoch's or evaluation pass's loader
  EXPECT_EQ(again.autotune_active, 5);
  EXPECT_EQ(again.autotune_prefetch_now, 3);
  // The same data built again from scratch is the same data.
  Engine::State rebuilt(std::make_shared<FaultySource>(1000, 4, std::set<uint64_t>{}), o);
  EXPECT_EQ(rebuilt.autotune_active, 5);
  // Other data, another batch size or CPU budget: learned separately.
  Engine::State other(std::make_shared<FaultySource>(999, 4, std::set<uint64_t>{}), o);
  EXPECT_NE(other.autotune_key, first.autotune_key);
  EngineOptions b = o;
  b.batch_size = 32;
  EXPECT_NE(Engine::State(src, b).autotune_key, first.autotune_key);
  EngineOptions cpu = o;
  cpu.cpu_budget = 2;
  Engine::State smaller(src, cpu);
  EXPECT_NE(smaller.autotune_key, first.autotune_key);
  EXPECT_LE(smaller.autotune_active, 2);
  // Fixed knobs learn nothing.
  EngineOptions fixed = o;
  fixed.num_workers = 2;
  fixed.prefetch_factor = 2;
  EXPECT_TRUE(Engine::State(src, fixed).autotune_key.empty());
  AutotuneMemory::forget_all();
}

TEST(BufferGate, CountsBuffersOutAndLetsAForcedEntryThrough) {
  auto gate = std::make_shared<BufferGate>();
  gate->set_limit(2);
  std::stop_source stopped;
  stopped.request_stop();       // enter() then answers at once: true only if it need not wait
  const int it = 0, other = 0;  // two iterators' identities
  auto enter = [&](const void* owner, uint64_t b) {
    return gate->enter(stopped.get_token(), owner, b);
  };
  ASSERT_TRUE(enter(&it, 0));
  Buffer a = BufferGate::wrap(gate, Buffer(new std::byte[8], std::default_delete<std::byte[]>()));
  ASSERT_TRUE(enter(&it, 1));
  Buffer b = BufferGate::wrap(gate, Buffer(new std::byte[8], std::default_delete<std::byte[]>()));
  EXPECT_FALSE(enter(&it, 2));     // two out: the window is full
  gate->force(&it, 2);             // the consumer waits for batch 2, which nobody has opened
  EXPECT_FALSE(enter(&other, 2));  // another iterator's batch 2 is not the one waited for
  EXPECT_FALSE(enter(&it, 3));     // nor is a later batch (a force that came late)
  ASSERT_TRUE(enter(&it, 2));
  EXPECT_FALSE(enter(&it, 2));  // one forced entry only
  Buffer copy = a;
  a.reset();
  EXPECT_FALSE(enter(&it, 3));  // still held through the copy
  copy.reset();
  b.reset();
  gate->leave();  // the forced one
  EXPECT_TRUE(enter(&it, 3));
  EXPECT_TRUE(enter(&it, 4));
  EXPECT_FALSE(enter(&it, 5));
  gate->force(&it, 5);
  gate->forget(&it);  // the iterator ended
  EXPECT_FALSE(enter(&it, 5));
  gate->set_limit(3);  // a deeper window lets one more in
  EXPECT_TRUE(enter(&it, 5));
}

// Large batches with "auto" prefetch: the consumer's batch counts in the window, so a consumer
// that drops each batch before asking for the next has at most two buffers out (the one it holds
// and the one being filled), whatever the timing.
TEST(AutotuneDepth, LargeBatchesUseTwoBuffersWithTheConsumers) {
  AutotuneMemory::forget_all();
  auto src = std::make_shared<FaultySource>(256, 64 * 1024, std::set<uint64_t>{});  // 512 KiB
  EngineOptions o;
  o.batch_size = 16;  // 8 MiB batches
  o.num_workers = 2;
  o.memory_budget = 64 << 20;
  Engine loader(src, o);
  for (uint64_t epoch = 0; epoch < 3; ++epoch) {
    auto it = loader.iterate(epoch);
    uint64_t batches = 0;
    // As `for x, y in loader` does: the previous batch is held while the next one is asked for.
    std::shared_ptr<Batch> previous;
    while (auto b = it->next()) {
      ++batches;
      const auto* v = reinterpret_cast<const int64_t*>(b->fields[0].data);
      EXPECT_EQ(v[0], v[64 * 1024 - 1]);
      previous = std::move(b);
    }
    EXPECT_EQ(batches, 16u);
  }
  // Two buffers at depth 1; the controller may deepen the window when workers wait on it (a
  // slow consumer, as under a sanitizer): then one more per step, never more.
  const EngineStats s = loader.stats();
  int depth = 1;
  for (const AutotuneDecision& d : s.autotune_decisions) depth = std::max(depth, d.prefetch_to);
  EXPECT_LE(s.buffer_bytes_peak, uint64_t(depth + 1) * s.batch_bytes) << "depth " << depth;
  EXPECT_EQ(s.samples, 3u * 256);
  AutotuneMemory::forget_all();
}

// A consumer that keeps batches (the last one of an epoch, all of them) slows the prefetch down
// but never stops the batch it waits for.
TEST(AutotuneDepth, AConsumerKeepingBatchesStillGetsEveryOne) {
  AutotuneMemory::forget_all();
  auto src = std::make_shared<FaultySource>(96, 64 * 1024, std::set<uint64_t>{});
  EngineOptions o;
  o.batch_size = 16;
  o.num_workers = 2;
  o.memory_budget = 256 << 20;
  Engine loader(src, o);
  std::vector<std::shared_ptr<Batch>> kept;
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    auto it = loader.iterate(epoch);
    while (auto b = it->next()) kept.push_back(std::move(b));
  }
  ASSERT_EQ(kept.size(), 12u);
  std::set<int64_t> seen;
  for (size_t i = 6; i < kept.size(); ++i)
    for (uint64_t k = 0; k < kept[i]->length; ++k)
      seen.insert(reinterpret_cast<const int64_t*>(kept[i]->fields[0].data)[k * 64 * 1024]);
  EXPECT_EQ(seen.size(), 96u);
  AutotuneMemory::forget_all();
}

}  // namespace
}  // namespace stoker
