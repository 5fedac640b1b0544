#include "stoker/engine.h"

#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "stoker/mixture.h"
#include "stoker/cuda/cuda.h"
#include "stoker/testing/faulty.h"
#include "stoker/errors.h"
#include "stoker/order.h"
#include "stoker/stratified_order.h"
#include "test_threads.h"

namespace stoker {
namespace {

using Batches = std::vector<std::vector<int64_t>>;

std::shared_ptr<FaultySource> source(uint64_t n, std::set<uint64_t> fail = {}, int64_t delay = 0) {
  return std::make_shared<FaultySource>(n, 1, std::move(fail), delay);
}

std::vector<int64_t> values(const Batch& b) {
  const auto* p = reinterpret_cast<const int64_t*>(b.fields[0].data);
  return {p, p + b.length};
}

Batches drain(EpochIterator& it) {
  Batches out;
  while (auto b = it.next()) out.push_back(values(*b));
  return out;
}

Batches run(std::shared_ptr<const Source> src, EngineOptions o, uint64_t epoch = 0,
            uint64_t start = 0) {
  Engine loader(std::move(src), o);
  return drain(*loader.iterate(epoch, start));
}

// Threads of this process. The first call starts a thread and joins it, so that runtimes which
// start a helper thread of their own on first use (TSan does) have done so before counting.
int thread_count() {
  static const bool warmed = [] {
    std::thread([] {}).join();
    return true;
  }();
  (void)warmed;
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

TEST(Engine, EverySampleExactlyOncePerEpochAcrossRanks) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 150; ++trial) {
    const uint64_t n = 1 + rng() % 200, world = 1 + rng() % 4;
    EngineOptions o;
    o.batch_size = 1 + rng() % 16;
    o.drop_last = rng() % 2;
    o.shuffle = rng() % 2;
    o.seed = rng();
    o.num_workers = static_cast<int>(rng() % 4);
    o.world_size = world;
    std::map<int64_t, int> count;
    std::set<size_t> batches_per_rank;
    for (uint64_t r = 0; r < world; ++r) {
      o.rank = r;
      const Batches bs = run(source(n), o, trial);
      batches_per_rank.insert(bs.size());
      for (const auto& b : bs)
        for (int64_t v : b) ++count[v];
    }
    ASSERT_EQ(batches_per_rank.size(), 1u) << "ranks got different batch counts";
    const uint64_t per_rank = o.drop_last ? n / world : (n + world - 1) / world;
    const uint64_t kept = o.drop_last ? per_rank / o.batch_size * o.batch_size : per_rank;
    uint64_t total = 0;
    for (auto [v, c] : count) {
      ASSERT_GE(v, 0);
      ASSERT_LT(v, static_cast<int64_t>(n));
      if (o.drop_last) {
        ASSERT_EQ(c, 1) << "sample " << v << " repeated";
      }
      total += c;
    }
    ASSERT_EQ(total, kept * world);
    if (!o.drop_last) {
      ASSERT_EQ(count.size(), n) << "a sample is missing";
    }
  }
}

TEST(Engine, BatchesAreIdenticalForAnyWorkerCountAndPrefetch) {
  EngineOptions o;
  o.batch_size = 7;
  o.shuffle = true;
  o.seed = 99;
  o.num_workers = 0;
  const Batches reference = run(source(500), o, 3);
  for (int workers : {1, 2, 4})
    for (int prefetch : {1, 2, 5}) {
      o.num_workers = workers;
      o.prefetch_factor = prefetch;
      EXPECT_EQ(run(source(500), o, 3), reference) << workers << " workers, prefetch " << prefetch;
    }
}

TEST(Engine, NewEpochNewOrderSameEpochSameOrder) {
  EngineOptions o;
  o.batch_size = 10;
  o.shuffle = true;
  o.num_workers = 2;
  EXPECT_EQ(run(source(100), o, 1), run(source(100), o, 1));
  EXPECT_NE(run(source(100), o, 1), run(source(100), o, 2));
}

TEST(Engine, ResumeMidEpochMatchesUninterruptedRun) {
  std::mt19937_64 rng(8);
  for (int trial = 0; trial < 30; ++trial) {
    EngineOptions o;
    o.batch_size = 1 + rng() % 8;
    o.shuffle = true;
    o.seed = rng();
    o.num_workers = static_cast<int>(rng() % 3);
    const uint64_t n = 20 + rng() % 100;
    const Batches full = run(source(n), o, 4);
    const uint64_t k = rng() % (full.size() + 1);
    o.num_workers = static_cast<int>(rng() % 3);  // resume with another worker count
    o.prefetch_factor = 1 + static_cast<int>(rng() % 3);
    const Batches rest = run(source(n), o, 4, k);
    ASSERT_EQ(rest, Batches(full.begin() + k, full.end()));
  }
}

// A job of another world size resumes the epoch where the old one stopped: with the plan that
// starts at the old job's position, its ranks deliver exactly the rest of the old epoch's order.
TEST(Engine, ElasticPlanYieldsTheRestOfTheEpoch) {
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 40; ++trial) {
    EngineOptions o;
    o.batch_size = 1 + rng() % 6;
    o.shuffle = rng() % 2;
    o.seed = rng();
    o.num_workers = static_cast<int>(rng() % 3);
    const uint64_t n = 10 + rng() % 90, old_world = 1 + rng() % 4, new_world = 1 + rng() % 4;
    o.world_size = old_world;
    Engine old_job(source(n), o);
    const uint64_t done = rng() % (old_job.num_batches() + 1);
    std::map<int64_t, int> count;
    for (uint64_t r = 0; r < old_world; ++r) {
      o.rank = r;
      Engine loader(source(n), o);
      auto it = loader.iterate(3);
      for (uint64_t k = 0; k < done; ++k)
        for (int64_t v : values(*it->next())) ++count[v];
    }
    const uint64_t at = old_job.plan().position_after(done);
    o.world_size = new_world;
    for (uint64_t r = 0; r < new_world; ++r) {
      o.rank = r;
      Engine loader(source(n), o);
      const BatchPlan plan(n, o.batch_size, o.drop_last, r, new_world, at);
      for (const auto& b : drain(*loader.iterate(3, 0, plan)))
        for (int64_t v : b) ++count[v];
    }
    int repeats = 0;
    for (uint64_t v = 0; v < n; ++v) {
      ASSERT_GE(count[static_cast<int64_t>(v)], 1) << "sample " << v << " was lost";
      repeats += count[static_cast<int64_t>(v)] - 1;
    }
    ASSERT_LT(repeats, static_cast<int>(std::max(old_world, new_world)));
  }
}

// Producers that share a rank's epoch by strides together deliver its batches, bit-identical.
TEST(Engine, StridedPlansTogetherGiveTheRanksBatches) {
  EngineOptions o;
  o.batch_size = 5;
  o.shuffle = true;
  o.seed = 12;
  o.num_workers = 2;
  o.world_size = 3;
  o.rank = 1;
  Engine loader(source(157), o);
  const Batches full = drain(*loader.iterate(2));
  for (uint64_t step : {1u, 2u, 3u, 7u}) {
    Batches merged(full.size());
    for (uint64_t first = 0; first < step; ++first) {
      const Batches part = drain(*loader.iterate(2, 0, loader.plan().strided(first, step)));
      for (uint64_t j = 0; j < part.size(); ++j) merged[first + j * step] = part[j];
    }
    ASSERT_EQ(merged, full) << "step " << step;
  }
  EXPECT_THROW(loader.iterate(2, 0, BatchPlan(156, 5, false, 0, 1)), InvalidArgument);
  EXPECT_THROW(loader.iterate(2, 0, BatchPlan(157, 4, false, 0, 1)), InvalidArgument);
  EXPECT_THROW(loader.iterate(2, 3, loader.plan().strided(0, 20)), InvalidArgument);
}

TEST(Engine, ErrorNamesTheSampleAndComesInOrder) {
  for (int workers : {0, 2}) {
    EngineOptions o;
    o.batch_size = 4;
    o.num_workers = workers;
    Engine loader(source(20, {9}), o);
    auto it = loader.iterate(0);
    EXPECT_EQ(values(*it->next()), (std::vector<int64_t>{0, 1, 2, 3}));
    EXPECT_EQ(values(*it->next()), (std::vector<int64_t>{4, 5, 6, 7}));
    try {
      it->next();
      FAIL() << "expected a SampleError";
    } catch (const SampleError& e) {
      EXPECT_EQ(e.index(), 9u);
      EXPECT_EQ(e.path(), "sample-9.bin");
      EXPECT_NE(std::string(e.what()).find("sample 9 (sample-9.bin): corrupt data"),
                std::string::npos)
          << e.what();
      EXPECT_THROW(std::rethrow_exception(e.cause()), DecodeError);
    }
    // The iterator goes on after the failed batch.
    EXPECT_EQ(values(*it->next()), (std::vector<int64_t>{12, 13, 14, 15}));
  }
}

TEST(Engine, SkippedCountsReplacedSamplesNotFailedReplacements) {
  EngineOptions o;
  o.batch_size = 4;
  o.on_error = OnError::kSkip;
  o.num_workers = 0;
  // Most samples are bad, so replacement candidates often fail too; each bad sample still counts
  // once, when its own turn comes.
  const std::set<uint64_t> bad{0, 1, 2, 3, 4, 5};
  Engine loader(source(10, bad), o);
  const Batches batches = drain(*loader.iterate(0));
  EXPECT_EQ(loader.stats().skipped, 6u);
  EXPECT_EQ(loader.stats().skipped_samples.size(), 6u);
  for (const auto& b : batches)
    for (int64_t v : b) EXPECT_EQ(bad.count(v), 0u);
}

TEST(Engine, SkipReplacesDeterministicallyAndCounts) {
  EngineOptions o;
  o.batch_size = 5;
  o.on_error = OnError::kSkip;
  o.shuffle = true;
  o.num_workers = 0;
  const std::set<uint64_t> bad{3, 17, 18};
  Engine loader0(source(40, bad), o);
  const Batches reference = drain(*loader0.iterate(0));
  EXPECT_EQ(loader0.stats().skipped, 3u);
  ASSERT_EQ(loader0.stats().skipped_samples.size(), 3u);
  EXPECT_NE(loader0.stats().skipped_samples[0].find("(sample-"), std::string::npos);
  size_t total = 0;
  for (const auto& b : reference)
    for (int64_t v : b) {
      EXPECT_EQ(bad.count(v), 0u) << "a failed sample was delivered";
      ++total;
    }
  EXPECT_EQ(total, 40u);
  o.num_workers = 3;
  EXPECT_EQ(run(source(40, bad), o), reference);
}

TEST(Engine, BufferMemoryStaysUnderBudget) {
  EngineOptions o;
  o.batch_size = 16;
  o.num_workers = 4;
  o.prefetch_factor = 8;
  o.memory_budget = 3 * 16 * 8 * 64 + 100;  // three buffers of 16 samples x 64 int64
  auto src = std::make_shared<FaultySource>(5000, 64, std::set<uint64_t>{});
  Engine loader(src, o);
  uint64_t samples = 0;
  auto it = loader.iterate(0);
  while (auto b = it->next()) samples += b->length;
  EXPECT_EQ(samples, 5000u);
  EXPECT_LE(loader.stats().buffer_bytes_peak, o.memory_budget);
  EXPECT_GT(loader.stats().buffer_bytes_peak, 0u);
}

TEST(Engine, ConsumerHoldingEveryBufferGetsAnErrorNotAHang) {
  for (int workers : {0, 2}) {
    EngineOptions o;
    o.batch_size = 4;
    o.num_workers = workers;
    o.memory_budget = 2 * 4 * 8;
    Engine loader(source(100), o);
    auto it = loader.iterate(0);
    std::vector<std::shared_ptr<Batch>> held{it->next(), it->next()};
    EXPECT_THROW(it->next(), BudgetExceeded);
    held.pop_back();  // free one: the stream goes on
    EXPECT_EQ(values(*it->next()), (std::vector<int64_t>{8, 9, 10, 11}));
  }
}

TEST(Engine, DestroyingAnIteratorMidEpochJoinsItsThreads) {
  const int before = thread_count();
  {
    EngineOptions o;
    o.batch_size = 2;
    o.num_workers = 4;
    Engine loader(source(1000, {}, 2000), o);
    auto it = loader.iterate(0);
    it->next();
    EXPECT_GE(thread_count(), before + 4);
  }
  EXPECT_EQ(thread_count(), before);
}

TEST(Engine, DestroyingWhileWorkersWaitForMemoryDoesNotHang) {
  const int before = thread_count();
  const std::vector<pid_t> others = testing::other_threads();  // a sanitizer's, if any
  {
    EngineOptions o;
    o.batch_size = 1;
    o.num_workers = 4;
    o.memory_budget = 8;  // one buffer
    Engine loader(source(100), o);
    auto it = loader.iterate(0);
    auto held = it->next();
    // Destroy only once every worker is blocked (waiting for the one buffer, or for a batch it
    // may claim): that is the state the destructor must get out of.
    ASSERT_TRUE(testing::wait_until([&] {
      std::vector<pid_t> workers;
      for (pid_t t : testing::other_threads())
        if (std::find(others.begin(), others.end(), t) == others.end()) workers.push_back(t);
      return workers.size() == 4 &&
             std::all_of(workers.begin(), workers.end(), testing::blocked_in_futex);
    }));
  }
  EXPECT_EQ(thread_count(), before);
}

TEST(Engine, StatsCountBatchesSamplesAndWaits) {
  EngineOptions o;
  o.batch_size = 8;
  o.num_workers = 2;
  Engine loader(source(100, {}, 100), o);
  auto it = loader.iterate(0);
  while (it->next()) {
  }
  const EngineStats s = loader.stats();
  EXPECT_EQ(s.batches, 13u);
  EXPECT_EQ(s.samples, 100u);
  EXPECT_GT(s.read_seconds, 0.005);
  EXPECT_GT(s.consumer_wait_seconds, 0.0);
}

TEST(Engine, RejectsInvalidOptions) {
  EngineOptions o;
  o.num_workers = -2;
  EXPECT_THROW(Engine(source(10), o), InvalidArgument);
  o.num_workers = kMaxWorkers + 1;
  EXPECT_THROW(Engine(source(10), o), InvalidArgument);
  o = {};
  o.prefetch_factor = 0;
  EXPECT_THROW(Engine(source(10), o), InvalidArgument);
  o = {};
  o.batch_size = 0;
  EXPECT_THROW(Engine(source(10), o), InvalidArgument);
  o = {};
  Engine ok(source(10), o);
  EXPECT_THROW(ok.iterate(0, 11), InvalidArgument);
  EXPECT_GE(ok.options().num_workers, 1);
  EXPECT_EQ(ok.options().prefetch_factor, 2);  // autotuned, small batches: starts at two
}

}  // namespace
}  // namespace stoker

namespace stoker {
namespace {

TEST(Engine, AutotunedPrefetchOfLargeBatchesStartsAtOne) {
  EngineOptions o;
  o.batch_size = 64;
  o.num_workers = 2;  // prefetch_factor stays "auto"
  auto big = std::make_shared<FaultySource>(1000, 16 * 1024, std::set<uint64_t>{});  // 8 MiB
  EXPECT_EQ(Engine(big, o).options().prefetch_factor, 1);
  EXPECT_EQ(Engine(source(1000), o).options().prefetch_factor, 2);
}

}  // namespace
}  // namespace stoker

namespace stoker {
namespace {

// A stratified order through the loader: the batches of its plan, whatever the worker count and
// the prefetch depth, on every rank, resumable at any batch.
TEST(Engine, StratifiedBatchesAreThePlansWhateverTheWorkers) {
  std::mt19937_64 rng(41);
  std::vector<int64_t> labels(700);
  for (auto& l : labels) l = rng() % 10 == 0 ? 1 : (rng() % 3 == 0 ? 2 : 0);
  auto classes = std::make_shared<const ClassGroups>(labels);
  for (const std::vector<double>& weights : {std::vector<double>{}, std::vector<double>{1, 1, 2}})
    for (uint64_t world : {1u, 3u})
      for (uint64_t rank = 0; rank < world; ++rank) {
        EngineOptions o;
        o.batch_size = 24;
        o.shuffle = true;
        o.seed = 9;
        o.drop_last = rank == 1;
        o.rank = rank;
        o.world_size = world;
        o.classes = classes;
        o.class_weights = weights;
        o.num_workers = 0;
        const StratifiedPlan plan(classes, weights, 9, 24, o.drop_last, rank, world);
        const StratifiedEpoch epoch = plan.epoch(4);
        Batches expected;
        for (uint64_t b = 0; b < plan.num_batches(); ++b) {
          std::vector<uint64_t> out(plan.batch_length(b));
          epoch.batch(b, out);
          expected.emplace_back(out.begin(), out.end());
        }
        ASSERT_EQ(run(source(700), o, 4), expected);
        const std::vector<uint64_t> indices = Engine(source(700), o).epoch_indices(4);
        Batches flat{{indices.begin(), indices.end()}}, joined{{}};
        for (const auto& b : expected) joined[0].insert(joined[0].end(), b.begin(), b.end());
        EXPECT_EQ(flat, joined);
        for (int workers : {1, 3}) {
          o.num_workers = workers;
          o.prefetch_factor = workers == 1 ? 1 : 4;
          ASSERT_EQ(run(source(700), o, 4), expected) << workers;
          const uint64_t start = rng() % expected.size();
          ASSERT_EQ(run(source(700), o, 4, start),
                    Batches(expected.begin() + static_cast<long>(start), expected.end()));
        }
      }
}

// Writes the sample's index and the epoch of its randomness key.
class KeySource final : public Source {
 public:
  explicit KeySource(uint64_t n) : n_(n), fields_{{"key", {DType::kInt, 64}, {2}}} {}
  uint64_t size() const override { return n_; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read(const SampleKey& key, std::span<std::byte* const> slots, WorkerState*) const override {
    const int64_t v[2] = {static_cast<int64_t>(key.index), static_cast<int64_t>(key.epoch)};
    std::memcpy(slots[0], v, sizeof v);
  }

 private:
  uint64_t n_;
  std::vector<FieldSpec> fields_;
};

// A worker whose state cannot be made: the source's error reaches the consumer.
class StatelessSource final : public Source {
 public:
  StatelessSource() : fields_{{"x", {DType::kInt, 64}, {1}}} {}
  uint64_t size() const override { return 64; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  std::unique_ptr<WorkerState> make_worker_state() const override {
    throw IoError("the worker's model file cannot be opened");
  }
  void read(const SampleKey&, std::span<std::byte* const>, WorkerState*) const override {}

 private:
  std::vector<FieldSpec> fields_;
};

TEST(Engine, AWorkerThatFailsOutsideAnySampleEndsTheEpochWithItsError) {
  EngineOptions o;
  o.batch_size = 4;
  for (int workers : {1, 3}) {
    o.num_workers = workers;
    Engine loader(std::make_shared<StatelessSource>(), o);
    auto it = loader.iterate(0);
    EXPECT_THROW(
        try { it->next(); } catch (const IoError& e) {
          EXPECT_STREQ(e.what(), "the worker's model file cannot be opened");
          throw;
        },
        IoError);
    EXPECT_THROW(it->next(), IoError);  // the epoch stays failed
  }
}

// Counts the worker states it makes; a state counts the samples read with it, which two
// threads at once would get wrong (TSan reports it).
class StateCountingSource final : public Source {
 public:
  struct State final : WorkerState {
    uint64_t reads = 0;
  };
  StateCountingSource() : fields_{{"x", {DType::kInt, 64}, {1}}} {}
  uint64_t size() const override { return 64; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  std::unique_ptr<WorkerState> make_worker_state() const override {
    ++made;
    return std::make_unique<State>();
  }
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override {
    ++static_cast<State*>(state)->reads;
    const auto v = static_cast<int64_t>(key.index);
    std::memcpy(slots[0], &v, sizeof v);
  }
  mutable std::atomic<int> made{0};

 private:
  std::vector<FieldSpec> fields_;
};

// A worker's state (a video worker's open decoder) outlives its epoch: the next epochs' workers
// take the kept ones instead of making their own, and still read every sample once.
TEST(Engine, WorkerStatesAreKeptFromOneEpochToTheNext) {
  for (int workers : {0, 1, 3}) {
    auto src = std::make_shared<StateCountingSource>();
    EngineOptions o;
    o.batch_size = 4;
    o.num_workers = workers;
    o.prefetch_factor = 2;
    Engine loader(src, o);
    for (uint64_t epoch = 0; epoch < 4; ++epoch) {
      std::multiset<int64_t> seen;
      for (const auto& b : drain(*loader.iterate(epoch))) seen.insert(b.begin(), b.end());
      ASSERT_EQ(seen.size(), 64u);
      for (int64_t i = 0; i < 64; ++i) ASSERT_EQ(seen.count(i), 1u) << i;
    }
    EXPECT_GE(src->made.load(), 1) << workers;
    EXPECT_LE(src->made.load(), std::max(1, workers)) << workers;
  }
}

// Samples of 2^46 bytes: no batch buffer of them can be allocated (the address space is 2^47).
class HugeSource final : public Source {
 public:
  HugeSource() : fields_{{"x", kUInt8, {uint64_t{1} << 46}}} {}
  uint64_t size() const override { return 8; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read(const SampleKey&, std::span<std::byte* const> slots, WorkerState*) const override {
    *slots[0] = std::byte{1};
  }

 private:
  std::vector<FieldSpec> fields_;
};

TEST(Engine, ABufferThatCannotBeAllocatedEndsTheEpochWithItsError) {
  EngineOptions o;
  o.batch_size = 4;
  o.memory_budget = uint64_t{1} << 50;  // the budget allows it; the allocation fails
  for (int workers : {0, 2}) {
    o.num_workers = workers;
    Engine loader(std::make_shared<HugeSource>(), o);
    auto it = loader.iterate(0);
    EXPECT_THROW(it->next(), std::bad_alloc) << workers;
  }
}

TEST(Engine, RepeatsOfAnOversampledSampleDrawTheirOwnRandomness) {
  std::vector<int64_t> labels(300, 0);
  for (size_t i = 0; i < 12; ++i) labels[i * 25] = 1;  // 12 rare samples, drawn ~150 times
  EngineOptions o;
  o.batch_size = 20;
  o.shuffle = true;
  o.num_workers = 2;
  o.classes = std::make_shared<const ClassGroups>(labels);
  o.class_weights = {1, 1};
  Engine loader(std::make_shared<KeySource>(300), o);
  std::set<std::pair<int64_t, int64_t>> keys;
  uint64_t draws = 0;
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    auto it = loader.iterate(epoch);
    while (auto b = it->next()) {
      const auto* p = reinterpret_cast<const int64_t*>(b->fields[0].data);
      for (uint64_t s = 0; s < b->length; ++s) keys.emplace(p[2 * s], p[2 * s + 1]);
      draws += b->length;
    }
  }
  EXPECT_EQ(keys.size(), draws);  // no two draws share (index, key)
  // Without weights the key is the epoch, as with the plain order.
  o.class_weights.clear();
  auto it = Engine(std::make_shared<KeySource>(300), o).iterate(3);
  while (auto b = it->next()) {
    const auto* p = reinterpret_cast<const int64_t*>(b->fields[0].data);
    for (uint64_t s = 0; s < b->length; ++s) ASSERT_EQ(p[2 * s + 1], 3);
  }
}

TEST(Engine, StratifiedOptionsAreChecked) {
  auto classes = std::make_shared<const ClassGroups>(std::vector<int64_t>{0, 1, 0, 1});
  EngineOptions o;
  o.classes = classes;
  EXPECT_THROW(Engine(source(4), o), InvalidArgument);  // shuffle=false
  o.shuffle = true;
  EXPECT_THROW(Engine(source(5), o), InvalidArgument);  // labels for 4 samples, 5 in the source
  EXPECT_NO_THROW(Engine(source(4), o));
  o.class_weights = {1, 2, 3};
  EXPECT_THROW(Engine(source(4), o), InvalidArgument);  // one weight per class
  o.classes = nullptr;
  o.class_weights = {1, 2};
  EXPECT_THROW(Engine(source(4), o), InvalidArgument);  // weights without classes
}

// ---- repeats (repeated augmentation) ------------------------------------------------------------

using Draw = std::pair<int64_t, int64_t>;  // (sample, the cycle that keyed it)

std::vector<Draw> draws(const Batch& b) {
  const auto* p = reinterpret_cast<const int64_t*>(b.fields[0].data);
  std::vector<Draw> out;
  for (uint64_t s = 0; s < b.length; ++s) out.emplace_back(p[2 * s], p[2 * s + 1]);
  return out;
}

std::vector<std::vector<Draw>> drain_draws(EpochIterator& it) {
  std::vector<std::vector<Draw>> out;
  while (auto b = it.next()) out.push_back(draws(*b));
  return out;
}

// What position q of a repeated epoch holds, from EpochOrder itself.
Draw expected_draw(uint64_t n, uint64_t k, bool shuffle, uint64_t seed, uint64_t epoch,
                   uint64_t q) {
  const EpochOrder order(n, shuffle, seed, epoch);
  return {static_cast<int64_t>(order[q / k]), static_cast<int64_t>(epoch * k + q % k)};
}

// Padding rule: DistributedSampler's over the n * k positions. Without drop_last every rank gets
// ceil(n * k / world) positions and the last ranks wrap to the epoch's first positions (fewer
// than world_size draws repeat); with drop_last, the ranks together take the first
// floor(n * k / world) / batch_size * batch_size * world positions, each once.
TEST(EngineRepeats, EveryCopyOfEverySampleExactlyOnceAcrossRanksPaddingStated) {
  std::mt19937_64 rng(21);
  for (int trial = 0; trial < 120; ++trial) {
    const uint64_t n = 1 + rng() % 60, k = 1 + rng() % 4, world = 1 + rng() % 4;
    EngineOptions o;
    o.batch_size = 1 + rng() % 9;
    o.drop_last = rng() % 2;
    o.shuffle = rng() % 2;
    o.seed = rng();
    o.num_workers = static_cast<int>(rng() % 3);
    o.world_size = world;
    o.repeats = k;
    const uint64_t epoch = rng() % 5;
    std::multiset<Draw> got;
    for (uint64_t r = 0; r < world; ++r) {
      o.rank = r;
      Engine loader(std::make_shared<KeySource>(n), o);
      for (const auto& b : drain_draws(*loader.iterate(epoch))) got.insert(b.begin(), b.end());
    }
    const uint64_t positions = n * k;
    const uint64_t per_rank = o.drop_last ? positions / world : (positions + world - 1) / world;
    const uint64_t taken =
        o.drop_last ? per_rank / o.batch_size * o.batch_size * world : per_rank * world;
    std::multiset<Draw> want;
    for (uint64_t q = 0; q < taken; ++q)
      want.insert(expected_draw(n, k, o.shuffle, o.seed, epoch, q % positions));
    ASSERT_EQ(got, want) << "trial " << trial;
    if (!o.drop_last && positions % world == 0) {
      std::map<int64_t, uint64_t> per_sample;
      std::set<Draw> distinct(got.begin(), got.end());
      for (const Draw& d : got) ++per_sample[d.first];
      ASSERT_EQ(per_sample.size(), n);
      for (auto [sample, count] : per_sample) ASSERT_EQ(count, k) << "sample " << sample;
      ASSERT_EQ(distinct.size(), got.size()) << "a copy repeated its randomness";
    }
  }
}

TEST(EngineRepeats, CopiesAreAdjacentInTheGlobalOrderAndGoToDifferentRanks) {
  const uint64_t n = 50, k = 3;
  EngineOptions o;
  o.batch_size = 4;
  o.shuffle = true;
  o.seed = 5;
  o.num_workers = 2;
  o.repeats = k;
  const std::vector<uint64_t> order = Engine(std::make_shared<KeySource>(n), o).epoch_indices(7);
  ASSERT_EQ(order.size(), n * k);
  std::set<uint64_t> seen;
  for (uint64_t j = 0; j < n; ++j) {
    for (uint64_t r = 1; r < k; ++r) ASSERT_EQ(order[j * k + r], order[j * k]);
    seen.insert(order[j * k]);
  }
  EXPECT_EQ(seen.size(), n);  // the copies of one sample are together: a permutation of runs
  // With as many ranks as copies, rank r holds copy r of every sample, at the same place.
  o.world_size = k;
  std::vector<std::vector<std::vector<Draw>>> ranks;
  for (uint64_t r = 0; r < k; ++r) {
    o.rank = r;
    ranks.push_back(drain_draws(*Engine(std::make_shared<KeySource>(n), o).iterate(7)));
  }
  for (uint64_t b = 0; b < ranks[0].size(); ++b)
    for (uint64_t s = 0; s < ranks[0][b].size(); ++s)
      for (uint64_t r = 0; r < k; ++r) {
        ASSERT_EQ(ranks[r][b][s].first, ranks[0][b][s].first);
        ASSERT_EQ(ranks[r][b][s].second, static_cast<int64_t>(7 * k + r));
      }
}

TEST(EngineRepeats, OneRepeatIsThePlainOrderKeyedByTheEpoch) {
  EngineOptions o;
  o.batch_size = 6;
  o.shuffle = true;
  o.seed = 3;
  o.num_workers = 2;
  o.world_size = 2;
  o.rank = 1;
  const auto plain = drain_draws(*Engine(std::make_shared<KeySource>(77), o).iterate(4));
  o.repeats = 1;
  EXPECT_EQ(drain_draws(*Engine(std::make_shared<KeySource>(77), o).iterate(4)), plain);
  for (const auto& b : plain)
    for (const Draw& d : b) ASSERT_EQ(d.second, 4);
}

TEST(EngineRepeats, AnyWorkerCountAndAResumeGiveTheSameBatches) {
  EngineOptions o;
  o.batch_size = 7;
  o.shuffle = true;
  o.seed = 8;
  o.repeats = 3;
  o.num_workers = 0;
  const auto src = std::make_shared<KeySource>(40);
  const auto full = drain_draws(*Engine(src, o).iterate(2));
  ASSERT_EQ(full.size(), 18u);  // 120 positions in batches of 7
  for (int workers : {1, 3}) {
    o.num_workers = workers;
    EXPECT_EQ(drain_draws(*Engine(src, o).iterate(2)), full);
    const auto rest = drain_draws(*Engine(src, o).iterate(2, 11));
    EXPECT_EQ(rest, decltype(full)(full.begin() + 11, full.end()));
  }
}

// A job of 3 ranks goes on with the epoch where one of 2 ranks stopped: every (sample, copy) not
// yet delivered comes exactly once, but for the new job's padding (fewer than 3 draws).
TEST(EngineRepeats, ElasticResumeDeliversEachRemainingCopyOnce) {
  const uint64_t n = 37, k = 2;
  EngineOptions o;
  o.batch_size = 4;
  o.shuffle = true;
  o.seed = 13;
  o.num_workers = 2;
  o.repeats = k;
  o.world_size = 2;
  const auto src = std::make_shared<KeySource>(n);
  std::multiset<Draw> before, after;
  const uint64_t done = 5;
  for (uint64_t r = 0; r < 2; ++r) {
    o.rank = r;
    auto it = Engine(src, o).iterate(1);
    for (uint64_t b = 0; b < done; ++b) {
      const auto d = draws(*it->next());
      before.insert(d.begin(), d.end());
    }
  }
  const uint64_t at = Engine(src, o).plan().position_after(done);
  EXPECT_EQ(at, done * 4 * 2);
  o.world_size = 3;
  for (uint64_t r = 0; r < 3; ++r) {
    o.rank = r;
    Engine loader(src, o);
    for (const auto& b : drain_draws(*loader.iterate(1, 0, BatchPlan(n * k, 4, false, r, 3, at))))
      after.insert(b.begin(), b.end());
  }
  std::set<Draw> all;
  for (uint64_t q = 0; q < n * k; ++q) all.insert(expected_draw(n, k, true, 13, 1, q));
  ASSERT_EQ(before.size(), std::set<Draw>(before.begin(), before.end()).size());
  std::set<Draw> remaining;
  for (const Draw& d : all)
    if (!before.count(d)) remaining.insert(d);
  for (const Draw& d : remaining) ASSERT_EQ(after.count(d), 1u) << "lost or repeated";
  // The rest is the new job's padding (34 positions left for 3 ranks: 12 each, 2 more), which
  // wraps to the epoch's first positions.
  EXPECT_EQ(after.size() - remaining.size(), 2u);
  for (const Draw& d : after) {
    if (!remaining.count(d)) {
      EXPECT_TRUE(d == expected_draw(n, k, true, 13, 1, 0) ||
                  d == expected_draw(n, k, true, 13, 1, 1));
    }
  }
  // A plan of the source's samples, not the repeated epoch's, is refused.
  EXPECT_THROW(Engine(src, o).iterate(1, 0, BatchPlan(n, 4, false, 0, 3)), InvalidArgument);
}

// A source whose samples live in blocks (a Parquet table's row groups), keyed as KeySource.
class BlockKeySource final : public Source {
 public:
  BlockKeySource() : fields_{{"key", {DType::kInt, 64}, {2}}} {}
  uint64_t size() const override { return 60; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  Blocks blocks() const override { return {{10, 20, 5, 25}, 2}; }
  void read(const SampleKey& key, std::span<std::byte* const> slots, WorkerState*) const override {
    const int64_t v[2] = {static_cast<int64_t>(key.index), static_cast<int64_t>(key.epoch)};
    std::memcpy(slots[0], v, sizeof v);
  }

 private:
  std::vector<FieldSpec> fields_;
};

TEST(EngineRepeats, SourcesWithBlocksKeepTheirOrderWithCopies) {
  EngineOptions o;
  o.batch_size = 8;
  o.shuffle = true;
  o.seed = 4;
  o.num_workers = 2;
  const auto src = std::make_shared<BlockKeySource>();
  const std::vector<uint64_t> once = Engine(src, o).epoch_indices(2);
  o.repeats = 2;
  const auto batches = drain_draws(*Engine(src, o).iterate(2));
  std::vector<Draw> flat;
  for (const auto& b : batches) flat.insert(flat.end(), b.begin(), b.end());
  ASSERT_EQ(flat.size(), 120u);
  for (uint64_t j = 0; j < 60; ++j) {
    // The block order's sample j, twice, keyed by cycles 4 and 5.
    EXPECT_EQ(flat[2 * j], Draw(static_cast<int64_t>(once[j]), 4));
    EXPECT_EQ(flat[2 * j + 1], Draw(static_cast<int64_t>(once[j]), 5));
  }
}

TEST(EngineRepeats, RejectsWhatItCannotHonour) {
  EngineOptions o;
  o.repeats = 0;
  EXPECT_THROW(Engine(std::make_shared<KeySource>(10), o), InvalidArgument);
  o.repeats = 2;
  o.shuffle = true;
  o.classes = std::make_shared<const ClassGroups>(std::vector<int64_t>(10, 0));
  try {
    Engine(std::make_shared<KeySource>(10), o);
    ADD_FAILURE() << "repeats with a stratified order";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("repeats is for the plain order"), std::string::npos);
  }
  o.classes = nullptr;
  o.mixture =
      std::make_shared<const MixtureOrder>(MixtureOrder{{4, 6}, {MixturePhase{0, {1.0, 1.0}}}});
  EXPECT_THROW(Engine(std::make_shared<KeySource>(10), o), InvalidArgument);
  o.mixture = nullptr;
  o.repeats = uint64_t{1} << 62;
  EXPECT_THROW(Engine(std::make_shared<KeySource>(10), o), InvalidArgument);  // overflow
}

// The option rules every front asks (engine.h): one home, one message each.
TEST(EngineRules, RepeatsOnlyInThePlainOrder) {
  EXPECT_NO_THROW(check_repeats(1, SampleOrder::kExternal));
  EXPECT_NO_THROW(check_repeats(3, SampleOrder::kPlain));
  EXPECT_THROW(check_repeats(0, SampleOrder::kPlain), InvalidArgument);
  for (SampleOrder o : {SampleOrder::kStratified, SampleOrder::kMixture, SampleOrder::kExternal})
    EXPECT_THROW(check_repeats(2, o), InvalidArgument);
}

TEST(EngineRules, MemoryBudgetAutoIsHalfOfPhysicalMemory) {
  EXPECT_EQ(resolve_memory_budget(12345), 12345u);
  EXPECT_EQ(resolve_memory_budget(0), physical_memory_bytes() / 2);
  EngineOptions o;
  EXPECT_EQ(Engine(std::make_shared<KeySource>(4), o).options().memory_budget,
            physical_memory_bytes() / 2);
}

TEST(EngineRules, PinningWithoutCudaFallsBackAndSaysSo) {
  bool unavailable = true;
  EXPECT_FALSE(resolve_pinned(PinMemory::kOff, &unavailable));
  EXPECT_FALSE(unavailable);
  EXPECT_EQ(resolve_pinned(PinMemory::kAuto, &unavailable), cuda_available());
  EXPECT_FALSE(unavailable);
  EXPECT_EQ(resolve_pinned(PinMemory::kOn, &unavailable), cuda_available());
  EXPECT_EQ(unavailable, !cuda_available());
  EngineOptions o;
  o.pin_memory = PinMemory::kOn;
  Engine loader(std::make_shared<KeySource>(4), o);  // never throws: torch warns and goes on
  EXPECT_EQ(loader.pinned(), cuda_available());
  EXPECT_EQ(loader.pin_unavailable(), !cuda_available());
}

}  // namespace
}  // namespace stoker
