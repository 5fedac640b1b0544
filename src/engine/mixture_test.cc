#include "stoker/mixture.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "stoker/errors.h"
#include "stoker/engine.h"
#include "stoker/order.h"

namespace stoker {
namespace {

struct Job {
  std::vector<uint64_t> sizes;
  uint64_t batch_size = 1, world = 1, seed = 0;
  bool drop_last = false, shuffle = true;

  uint64_t n() const { return std::accumulate(sizes.begin(), sizes.end(), uint64_t{0}); }
  std::string describe() const {
    std::string s = "sizes=";
    for (uint64_t x : sizes) s += std::to_string(x) + " ";
    return s + "batch=" + std::to_string(batch_size) + " world=" + std::to_string(world) +
           " drop_last=" + std::to_string(drop_last) + " shuffle=" + std::to_string(shuffle) +
           " seed=" + std::to_string(seed);
  }
  MixturePlan plan(const std::vector<MixturePhase>& schedule, uint64_t epoch, uint64_t rank,
                   MixtureStart start = {}) const {
    return MixturePlan({sizes, schedule}, seed, shuffle, epoch, batch_size, drop_last, rank, world,
                       std::move(start));
  }
};

Job random_job(std::mt19937_64& rng, uint64_t max_sources = 5) {
  Job j;
  const uint64_t C = 1 + rng() % max_sources;
  for (uint64_t c = 0; c < C; ++c) j.sizes.push_back(1 + rng() % 60);
  j.batch_size = 1 + rng() % 40;
  j.world = 1 + rng() % 4;
  j.seed = rng();
  j.drop_last = rng() % 2;
  j.shuffle = rng() % 4 != 0;
  return j;
}

std::vector<double> random_weights(std::mt19937_64& rng, uint64_t C) {
  std::vector<double> w(C);
  for (double& x : w) x = rng() % 3 == 0 ? 0.0 : std::ldexp(double(rng() % 1000 + 1), -3);
  if (std::accumulate(w.begin(), w.end(), 0.0) == 0) w[rng() % C] = 1;
  return w;
}

uint64_t source_of(const std::vector<uint64_t>& sizes, uint64_t global) {
  uint64_t c = 0;
  for (uint64_t at = 0; global >= at + sizes[c]; at += sizes[c++]) {
  }
  return c;
}

struct Draw {
  uint64_t source, cycle, local;
  bool operator<(const Draw& o) const {
    return std::tie(source, cycle, local) < std::tie(o.source, o.cycle, o.local);
  }
};

// Every rank's batches [from, to) of plans made by `make(rank)`, as draws.
template <typename Make>
std::vector<Draw> draws_of(const Job& job, Make make, uint64_t from, uint64_t to) {
  std::vector<Draw> out;
  std::vector<uint64_t> offsets(job.sizes.size());
  for (size_t c = 1; c < offsets.size(); ++c) offsets[c] = offsets[c - 1] + job.sizes[c - 1];
  for (uint64_t r = 0; r < job.world; ++r) {
    const MixturePlan p = make(r);
    for (uint64_t b = from; b < std::min(to, p.num_batches()); ++b) {
      std::vector<uint64_t> idx(p.batches().batch_length(b)), cyc(idx.size());
      p.batch(b, idx, cyc);
      for (size_t s = 0; s < idx.size(); ++s) {
        const uint64_t c = source_of(job.sizes, idx[s]);
        out.push_back({c, cyc[s], idx[s] - offsets[c]});
      }
    }
  }
  return out;
}

// The draws are exactly stream positions [from_c, to_c) of every source c: nothing lost, nothing
// repeated, each sample once per cycle.
void expect_streams(const Job& job, std::vector<Draw> draws, const std::vector<uint64_t>& to,
                    std::vector<uint64_t> from = {}) {
  from.resize(job.sizes.size());
  std::vector<Draw> expected;
  for (uint64_t c = 0; c < job.sizes.size(); ++c) {
    const uint64_t n = job.sizes[c];
    for (uint64_t p = from[c]; p < to[c]; ++p)
      expected.push_back(
          {c, p / n, EpochOrder(n, job.shuffle, mixture_source_seed(job.seed, c), p / n)[p % n]});
  }
  std::sort(draws.begin(), draws.end());
  std::sort(expected.begin(), expected.end());
  ASSERT_EQ(draws.size(), expected.size()) << job.describe();
  for (size_t i = 0; i < draws.size(); ++i)
    ASSERT_TRUE(!(draws[i] < expected[i]) && !(expected[i] < draws[i]))
        << job.describe() << " draw " << i << ": source " << draws[i].source << " cycle "
        << draws[i].cycle << " sample " << draws[i].local << ", expected sample "
        << expected[i].local << " of cycle " << expected[i].cycle;
}

TEST(MixturePlan, BatchesAreThoseOfThePlainPlan) {
  std::mt19937_64 rng(1);
  for (int t = 0; t < 200; ++t) {
    const Job job = random_job(rng);
    for (uint64_t r = 0; r < job.world; ++r) {
      const MixturePlan p = job.plan({{0, random_weights(rng, job.sizes.size())}}, 0, r);
      const BatchPlan plain(job.n(), job.batch_size, job.drop_last, r, job.world);
      ASSERT_EQ(p.num_batches(), plain.num_batches());
      for (uint64_t b = 0; b < plain.num_batches(); ++b)
        ASSERT_EQ(p.batches().batch_length(b), plain.batch_length(b));
    }
  }
}

TEST(MixturePlan, EveryBatchHoldsEachSourceWithinOneSampleOfItsWeight) {
  std::mt19937_64 rng(2);
  for (int t = 0; t < 300; ++t) {
    const Job job = random_job(rng, 7);
    const uint64_t C = job.sizes.size();
    std::vector<double> w = random_weights(rng, C);
    const double sum = std::accumulate(w.begin(), w.end(), 0.0);
    std::vector<std::unique_ptr<MixturePlan>> owned;
    for (uint64_t r = 0; r < job.world; ++r)
      owned.push_back(std::make_unique<MixturePlan>(MixtureOrder{job.sizes, {{0, w}}}, job.seed,
                                                    job.shuffle, t, job.batch_size, job.drop_last,
                                                    r, job.world));
    // Rows in row order (batch b of rank 0, 1, ...): cumulative counts stay within one of the
    // target too.
    std::vector<double> target(C), got(C);
    for (uint64_t b = 0; b < owned[0]->num_batches(); ++b) {
      for (uint64_t r = 0; r < job.world; ++r) {
        const MixturePlan& p = *owned[r];
        std::vector<uint64_t> idx(p.batches().batch_length(b));
        p.batch(b, idx);
        std::vector<uint64_t> counts(C);
        for (uint64_t i : idx) ++counts[source_of(job.sizes, i)];
        ASSERT_EQ(counts, p.batch_counts(b));
        for (uint64_t c = 0; c < C; ++c) {
          const double x = idx.size() * w[c] / sum;
          ASSERT_GE(double(counts[c]), std::floor(x - 1e-6)) << job.describe();
          ASSERT_LE(double(counts[c]), std::ceil(x + 1e-6)) << job.describe();
          target[c] += x;
          got[c] += counts[c];
          ASSERT_LT(std::abs(got[c] - target[c]), 1 + 1e-6)
              << job.describe() << " source " << c << " batch " << b << " rank " << r;
        }
      }
    }
  }
}

TEST(MixturePlan, EachSourceIsDrawnExactlyOncePerItsOwnEpoch) {
  std::mt19937_64 rng(3);
  for (int t = 0; t < 120; ++t) {
    const Job job = random_job(rng);
    const std::vector<MixturePhase> schedule = {
        {0, random_weights(rng, job.sizes.size())},
        {1 + rng() % 20, random_weights(rng, job.sizes.size())}};
    // Five mixture epochs, each starting where the one before ended.
    MixtureStart start;
    std::vector<Draw> all;
    for (uint64_t e = 0; e < 5; ++e) {
      const MixtureStart from = start;
      auto make = [&](uint64_t r) {
        return MixturePlan({job.sizes, schedule}, job.seed, job.shuffle, e, job.batch_size,
                           job.drop_last, r, job.world, from);
      };
      const std::vector<Draw> d = draws_of(job, make, 0, UINT64_MAX);
      all.insert(all.end(), d.begin(), d.end());
      const MixturePlan p = make(0);
      start.bases = p.epoch_end();
      start.first_step += p.num_batches();
      const MixtureStart again =
          MixturePlan::epoch_start({job.sizes, schedule}, job.seed, job.shuffle, e + 1,
                                   job.batch_size, job.drop_last, job.world);
      ASSERT_EQ(again.bases, start.bases);
      ASSERT_EQ(again.first_step, start.first_step);
    }
    expect_streams(job, all, start.bases);
  }
}

TEST(MixturePlan, DrawsAfterCountsEveryRanksBatches) {
  std::mt19937_64 rng(4);
  for (int t = 0; t < 100; ++t) {
    const Job job = random_job(rng);
    const std::vector<MixturePhase> schedule = {{0, random_weights(rng, job.sizes.size())}};
    std::vector<uint64_t> bases(job.sizes.size());
    for (auto& x : bases) x = rng() % 500;
    const MixtureStart start{0, 7, bases};
    const MixturePlan p0 = job.plan(schedule, 1, 0, start);
    std::vector<uint64_t> sum = bases;
    for (uint64_t b = 0; b <= p0.num_batches(); ++b) {
      ASSERT_EQ(p0.draws_after(b), sum) << job.describe() << " b=" << b;
      if (b == p0.num_batches()) break;
      for (uint64_t r = 0; r < job.world; ++r) {
        const std::vector<uint64_t> counts = job.plan(schedule, 1, r, start).batch_counts(b);
        for (size_t c = 0; c < sum.size(); ++c) sum[c] += counts[c];
      }
    }
  }
}

TEST(MixturePlan, ResumesEveryStreamOnAnotherWorldSizeWithOtherWeights) {
  std::mt19937_64 rng(5);
  for (int t = 0; t < 150; ++t) {
    Job old_job = random_job(rng);
    const uint64_t C = old_job.sizes.size();
    const std::vector<MixturePhase> before = {{0, random_weights(rng, C)}};
    const std::vector<MixturePhase> after = {{0, random_weights(rng, C)},
                                             {1 + rng() % 30, random_weights(rng, C)}};
    // Epoch 2 from scratch; the old job stops after `stop` batches.
    const MixtureStart s0 =
        MixturePlan::epoch_start({old_job.sizes, before}, old_job.seed, old_job.shuffle, 2,
                                 old_job.batch_size, old_job.drop_last, old_job.world);
    const MixturePlan old_plan = old_job.plan(before, 2, 0, s0);
    const uint64_t stop = rng() % (old_plan.num_batches() + 1);
    std::vector<Draw> seen =
        draws_of(old_job, [&](uint64_t r) { return old_job.plan(before, 2, r, s0); }, 0, stop);
    // The new job: another world size, other weights, from where the old one stopped.
    Job job = old_job;
    job.world = 1 + rng() % 5;
    const uint64_t position = old_plan.batches().position_after(stop);
    const MixtureStart s1{position, s0.first_step + stop, old_plan.draws_after(stop)};
    uint64_t step = s1.first_step;
    std::vector<uint64_t> bases = s1.bases;
    if (position < job.n()) {
      const MixturePlan p = job.plan(after, 2, 0, s1);
      ASSERT_EQ(
          p.num_batches(),
          BatchPlan(job.n(), job.batch_size, job.drop_last, 0, job.world, position).num_batches());
      const std::vector<Draw> d =
          draws_of(job, [&](uint64_t r) { return job.plan(after, 2, r, s1); }, 0, UINT64_MAX);
      seen.insert(seen.end(), d.begin(), d.end());
      bases = p.epoch_end();
      step += p.num_batches();
    }
    // And the next epoch, whole.
    const MixtureStart s2{0, step, bases};
    const std::vector<Draw> d =
        draws_of(job, [&](uint64_t r) { return job.plan(after, 3, r, s2); }, 0, UINT64_MAX);
    seen.insert(seen.end(), d.begin(), d.end());
    expect_streams(job, seen, job.plan(after, 3, 0, s2).epoch_end(), s0.bases);
  }
}

TEST(MixturePlan, ResumingWithTheSameInputsGivesTheSameBatches) {
  std::mt19937_64 rng(6);
  const Job job = random_job(rng);
  const std::vector<MixturePhase> schedule = {{0, {1, 2, 3, 4, 5}}, {3, {5, 0, 0, 1, 1}}};
  Job five = job;
  five.sizes = {10, 20, 30, 40, 50};
  const MixturePlan a = five.plan(schedule, 4, 0), b = five.plan(schedule, 4, 0);
  for (uint64_t x = a.num_batches(); x-- > 0;) {  // b's rows asked for backwards
    std::vector<uint64_t> ia(a.batches().batch_length(x)), ib(ia.size());
    a.batch(x, ia);
    b.batch(x, ib);
    ASSERT_EQ(ia, ib);
  }
}

TEST(MixturePlan, AScheduleChangesTheCountsAtItsStep) {
  const std::vector<uint64_t> sizes = {100, 100};
  // Steps 0..3 draw only source 0, then only source 1; the plan starts at step 2.
  const MixturePlan p({sizes, {{0, {1, 0}}, {4, {0, 1}}}}, 9, true, 0, 10, false, 0, 1, {0, 2, {}});
  for (uint64_t b = 0; b < p.num_batches(); ++b)
    EXPECT_EQ(p.batch_counts(b),
              (b + 2 < 4 ? std::vector<uint64_t>{10, 0} : std::vector<uint64_t>{0, 10}));
  EXPECT_EQ(p.weights_at(0), (std::vector<double>{1, 0}));
  EXPECT_EQ(p.weights_at(4), (std::vector<double>{0, 1}));
}

TEST(MixturePlan, WithoutShuffleSourcesComeInOrder) {
  const MixturePlan p({{4, 6}, {{0, {1, 1}}}}, 0, false, 0, 4, false, 0, 1);
  std::vector<uint64_t> out(4);
  p.batch(0, out);
  EXPECT_EQ(out, (std::vector<uint64_t>{0, 1, 4, 5}));
  p.batch(1, out);
  EXPECT_EQ(out, (std::vector<uint64_t>{2, 3, 6, 7}));
  std::vector<uint64_t> cycles(2), last(2);
  p.batch(2, last, cycles);
  EXPECT_EQ(last, (std::vector<uint64_t>{0, 8}));  // source 0 starts its second epoch
  EXPECT_EQ(cycles, (std::vector<uint64_t>{1, 0}));
}

TEST(MixturePlan, RejectsBadWeights) {
  const auto make = [](std::vector<MixturePhase> schedule, std::vector<uint64_t> sizes = {5, 5}) {
    return MixturePlan({std::move(sizes), std::move(schedule)}, 0, true, 0, 2, false, 0, 1);
  };
  const auto message = [&](std::vector<MixturePhase> schedule,
                           std::vector<uint64_t> sizes = {5, 5}) -> std::string {
    try {
      make(std::move(schedule), std::move(sizes));
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message({{0, {1, NAN}}}).find("source 1 has weight nan"), std::string::npos);
  EXPECT_NE(message({{0, {1, INFINITY}}}).find("finite"), std::string::npos);
  EXPECT_NE(message({{0, {-1, 2}}}).find("source 0 has weight -1"), std::string::npos);
  EXPECT_NE(message({{0, {0, 0}}}).find("sum to 0"), std::string::npos);
  EXPECT_NE(message({{0, {1, 1}}, {5, {0, 0}}}).find("at step 5 sum to 0"), std::string::npos);
  EXPECT_NE(message({{0, {1}}}).find("1 numbers for 2 sources"), std::string::npos);
  EXPECT_NE(message({{3, {1, 1}}, {3, {1, 2}}}).find("increasing"), std::string::npos);
  EXPECT_NE(message({}).find("needs weights"), std::string::npos);
  EXPECT_NE(message({{0, {1, 1}}}, {5, 0}).find("source 1 has no samples"), std::string::npos);
  EXPECT_NE(message({{0, {}}}, {}).find("at least one source"), std::string::npos);
  EXPECT_NO_THROW(make({{0, {1, 0}}}, {5, 0}));
}

// ---------------------------------------------------------------------------------------------
// The loader.

// Sample i is (i, the epoch its key names): a batch shows which draws it holds.
class KeySource final : public Source {
 public:
  explicit KeySource(uint64_t n) : n_(n), fields_{{"key", kInt64, {2}}} {}
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

using Pairs = std::vector<std::vector<std::pair<int64_t, int64_t>>>;

Pairs drain(EpochIterator& it) {
  Pairs out;
  while (auto b = it.next()) {
    const auto* p = reinterpret_cast<const int64_t*>(b->fields[0].data);
    out.emplace_back();
    for (uint64_t s = 0; s < b->length; ++s) out.back().emplace_back(p[2 * s], p[2 * s + 1]);
  }
  return out;
}

EngineOptions mixture_options(std::shared_ptr<const MixtureOrder> order, int workers) {
  EngineOptions o;
  o.batch_size = 7;
  o.shuffle = true;
  o.seed = 42;
  o.num_workers = workers;
  o.prefetch_factor = 2;
  o.memory_budget = 64 << 20;
  o.pin_memory = PinMemory::kOff;
  o.mixture = std::move(order);
  return o;
}

TEST(MixtureLoader, SameBatchesWhateverTheWorkersAndKeyedByTheSourcesEpoch) {
  auto order =
      std::make_shared<MixtureOrder>(MixtureOrder{{5, 40, 13}, {{0, {1, 1, 1}}, {6, {3, 1, 0}}}});
  const auto src = std::make_shared<KeySource>(58);
  Pairs first;
  for (int workers : {0, 1, 4}) {
    Engine loader(src, mixture_options(order, workers));
    Pairs all;
    for (uint64_t e = 0; e < 3; ++e) {
      const Pairs p = drain(*loader.iterate(e));
      all.insert(all.end(), p.begin(), p.end());
    }
    if (first.empty()) first = all;
    EXPECT_EQ(all, first) << workers << " workers";
  }
  // The keys are the draws' cycles, the batches those of the default plans.
  MixtureStart start = MixturePlan::epoch_start(*order, 42, true, 2, 7, false, 1);
  const MixturePlan plan(*order, 42, true, 2, 7, false, 0, 1, start);
  const uint64_t before = first.size() - plan.num_batches();
  for (uint64_t b = 0; b < plan.num_batches(); ++b) {
    std::vector<uint64_t> idx(plan.batches().batch_length(b)), cyc(idx.size());
    plan.batch(b, idx, cyc);
    for (size_t s = 0; s < idx.size(); ++s) {
      EXPECT_EQ(first[before + b][s].first, int64_t(idx[s]));
      EXPECT_EQ(first[before + b][s].second, int64_t(cyc[s]));
    }
  }
  // Source 0 (5 samples) has run through several epochs of its own.
  int64_t max_cycle = 0;
  for (const auto& b : first)
    for (auto [i, k] : b)
      if (i < 5) max_cycle = std::max(max_cycle, k);
  EXPECT_GE(max_cycle, 2);
}

TEST(MixtureLoader, IteratesAPlanFromABatchAndCountsEachSource) {
  auto order = std::make_shared<MixtureOrder>(MixtureOrder{{30, 30}, {{0, {1, 2}}}});
  const auto src = std::make_shared<KeySource>(60);
  Engine loader(src, mixture_options(order, 2));
  auto plan = std::make_shared<const MixturePlan>(MixtureOrder{{30, 30}, {{0, {1, 0}}}}, 42, true,
                                                  5, 7, false, 0, 1, MixtureStart{14, 100, {3, 4}});
  const Pairs all = drain(*loader.iterate(plan, 1));
  ASSERT_EQ(all.size(), plan->num_batches() - 1);
  for (const auto& b : all)
    for (auto [i, k] : b) EXPECT_LT(i, 30);  // weight 0 for source 1
  const EngineStats s = loader.stats();
  EXPECT_EQ(s.mixture_samples, (std::vector<uint64_t>{s.samples, 0}));
  EXPECT_EQ(s.samples, 60u - 14 - 7);

  auto other = std::make_shared<const MixturePlan>(MixtureOrder{{30, 30}, {{0, {1, 0}}}}, 41, true,
                                                   0, 7, false, 0, 1);
  EXPECT_THROW(loader.iterate(other), InvalidArgument);
  EXPECT_THROW(loader.iterate(loader.plan().strided(0, 2).num_batches(), 0,
                              BatchPlan(60, 7, false, 0, 1, 10)),
               InvalidArgument);
  EngineOptions bad = mixture_options(order, 0);
  bad.mixture = std::make_shared<MixtureOrder>(MixtureOrder{{30, 31}, {{0, {1, 2}}}});
  EXPECT_THROW(Engine(src, bad), InvalidArgument);
  bad.mixture = std::make_shared<MixtureOrder>(MixtureOrder{{30, 30}, {{0, {0, 0}}}});
  EXPECT_THROW(Engine(src, bad), InvalidArgument);
}

}  // namespace
}  // namespace stoker
