#include "stoker/stratified_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "stoker/errors.h"
#include "stoker/order.h"

namespace stoker {
namespace {

struct Config {
  std::vector<int64_t> labels;
  uint64_t batch_size = 1, world = 1;
  bool drop_last = false;
  uint64_t seed = 0;
  std::vector<double> weights;

  std::string describe() const {
    std::map<int64_t, int> counts;
    for (int64_t l : labels) ++counts[l];
    std::string s = "n=" + std::to_string(labels.size()) + " counts={";
    for (auto [l, c] : counts) s += std::to_string(l) + ":" + std::to_string(c) + " ";
    s += "} batch=" + std::to_string(batch_size) + " world=" + std::to_string(world) +
         " drop_last=" + std::to_string(drop_last) + " seed=" + std::to_string(seed);
    if (!weights.empty()) {
      s += " weights=";
      for (double w : weights) s += std::to_string(w) + " ";
    }
    return s;
  }
};

// Random class sizes: a few classes, skewed, often one with fewer samples than there are batches.
Config random_config(std::mt19937_64& rng, bool weighted) {
  Config cfg;
  const int classes = 1 + static_cast<int>(rng() % 6);
  for (int c = 0; c < classes; ++c) {
    const uint64_t size = rng() % 4 == 0 ? 1 + rng() % 3 : 1 + rng() % 80;
    const int64_t label = static_cast<int64_t>(rng() % 1000) - 500;  // any values, any gaps
    for (uint64_t k = 0; k < size; ++k) cfg.labels.push_back(label);
  }
  std::shuffle(cfg.labels.begin(), cfg.labels.end(), rng);
  cfg.batch_size = 1 + rng() % 20;
  cfg.world = 1 + rng() % 4;
  cfg.drop_last = rng() % 2;
  cfg.seed = rng();
  if (weighted) {
    const ClassGroups g(cfg.labels);
    for (uint32_t c = 0; c < g.num_classes(); ++c)
      cfg.weights.push_back(rng() % 5 == 0 ? 0.0 : 0.1 + static_cast<double>(rng() % 1000) / 97);
    if (std::all_of(cfg.weights.begin(), cfg.weights.end(), [](double w) { return w == 0; }))
      cfg.weights[0] = 1;
  }
  return cfg;
}

// Every rank's batches of an epoch, in row order (batch b of rank r is row b * world + r).
std::vector<std::vector<uint64_t>> epoch_rows(const Config& cfg,
                                              std::shared_ptr<const ClassGroups> groups,
                                              uint64_t epoch) {
  std::vector<std::vector<std::vector<uint64_t>>> per_rank;
  for (uint64_t r = 0; r < cfg.world; ++r) {
    const StratifiedPlan plan(groups, cfg.weights, cfg.seed, cfg.batch_size, cfg.drop_last, r,
                              cfg.world);
    const StratifiedEpoch e = plan.epoch(epoch);
    per_rank.emplace_back();
    for (uint64_t b = 0; b < plan.num_batches(); ++b) {
      std::vector<uint64_t> out(plan.batch_length(b));
      e.batch(b, out);
      per_rank.back().push_back(std::move(out));
    }
  }
  std::vector<std::vector<uint64_t>> rows;
  for (size_t b = 0; b < per_rank[0].size(); ++b)
    for (uint64_t r = 0; r < cfg.world; ++r) {
      EXPECT_EQ(per_rank[r].size(), per_rank[0].size()) << "ranks differ in batch count";
      rows.push_back(per_rank[r][b]);
    }
  return rows;
}

// Checks that every row holds each class within one sample of length * share.
void expect_rows_within_one(const std::vector<std::vector<uint64_t>>& rows, const Config& cfg,
                            const ClassGroups& g, const std::vector<double>& share,
                            const std::string& where) {
  std::vector<uint32_t> class_of(g.num_samples());
  for (uint32_t c = 0; c < g.num_classes(); ++c)
    for (uint64_t k = 0; k < g.count(c); ++k) class_of[g.member(c, k)] = c;
  for (size_t row = 0; row < rows.size(); ++row) {
    std::vector<uint64_t> counts(g.num_classes(), 0);
    for (uint64_t i : rows[row]) ++counts[class_of[i]];
    for (uint32_t c = 0; c < g.num_classes(); ++c) {
      const double expected = static_cast<double>(rows[row].size()) * share[c];
      ASSERT_LT(std::abs(static_cast<double>(counts[c]) - expected), 1.0 + 1e-6)
          << where << ": row " << row << " holds " << counts[c] << " of class " << g.label(c)
          << ", expected " << expected << "; " << cfg.describe();
    }
  }
}

TEST(ClassGroups, GroupsSamplesByLabelInAscendingOrder) {
  const std::vector<int64_t> labels = {7, -3, 7, 1000000000000, 7, -3, 0};
  const ClassGroups g(labels);
  ASSERT_EQ(g.num_classes(), 4u);
  EXPECT_EQ(g.num_samples(), labels.size());
  EXPECT_EQ(g.label(0), -3);
  EXPECT_EQ(g.label(1), 0);
  EXPECT_EQ(g.label(2), 7);
  EXPECT_EQ(g.label(3), 1000000000000);
  EXPECT_EQ(g.count(0), 2u);
  EXPECT_EQ(g.member(0, 0), 1u);
  EXPECT_EQ(g.member(0, 1), 5u);
  EXPECT_EQ(g.count(2), 3u);
  EXPECT_EQ(g.member(2, 2), 4u);
  EXPECT_EQ(g.member(3, 0), 3u);
  // Dense labels (a table) and sparse ones (a search) group the same way.
  std::mt19937_64 rng(3);
  std::vector<int64_t> dense(5000), sparse(5000);
  for (size_t i = 0; i < dense.size(); ++i) {
    dense[i] = static_cast<int64_t>(rng() % 37);
    sparse[i] = dense[i] * 1000003 - 17;
  }
  const ClassGroups a(dense), b(sparse);
  ASSERT_EQ(a.num_classes(), b.num_classes());
  for (uint32_t c = 0; c < a.num_classes(); ++c) {
    ASSERT_EQ(a.count(c), b.count(c));
    for (uint64_t k = 0; k < a.count(c); ++k) {
      ASSERT_EQ(a.member(c, k), b.member(c, k));
      ASSERT_EQ(dense[a.member(c, k)], a.label(c));
    }
  }
  // 4 bytes a sample for the grouping, a few words a class.
  EXPECT_LT(a.memory_bytes(), 4 * dense.size() + 16 * a.num_classes() + 256);
}

TEST(StratifiedPlan, EverySampleOncePerEpochAndEveryBatchInProportion) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 600; ++trial) {
    const Config cfg = random_config(rng, false);
    auto g = std::make_shared<const ClassGroups>(cfg.labels);
    const uint64_t n = cfg.labels.size();
    const BatchPlan reference(n, cfg.batch_size, cfg.drop_last, 0, cfg.world);
    std::vector<double> share(g->num_classes());
    for (uint32_t c = 0; c < g->num_classes(); ++c) share[c] = double(g->count(c)) / double(n);
    for (uint64_t epoch : {0u, 1u, 5u}) {
      const auto rows = epoch_rows(cfg, g, epoch);
      ASSERT_EQ(rows.size(), reference.num_batches() * cfg.world) << cfg.describe();
      for (size_t row = 0; row < rows.size(); ++row)
        ASSERT_EQ(rows[row].size(), reference.batch_length(row / cfg.world)) << cfg.describe();
      std::vector<uint64_t> seen(n, 0);
      uint64_t total = 0;
      for (const auto& row : rows)
        for (uint64_t i : row) {
          ASSERT_LT(i, n);
          ++seen[i];
          ++total;
        }
      if (cfg.drop_last) {
        ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](uint64_t s) { return s <= 1; }))
            << "a sample repeated; " << cfg.describe();
      } else {
        // Each sample once; the < world padded slots repeat samples, as DistributedSampler's.
        ASSERT_TRUE(std::all_of(seen.begin(), seen.end(), [](uint64_t s) { return s >= 1; }))
            << "a sample is missing; " << cfg.describe();
        ASSERT_EQ(total, reference.samples_per_rank() * cfg.world);
        ASSERT_LT(total - n, cfg.world);
      }
      expect_rows_within_one(rows, cfg, *g, share, "epoch " + std::to_string(epoch));
    }
  }
}

TEST(StratifiedPlan, DroppedTailKeepsTheSharesAndChangesEveryEpoch) {
  std::mt19937_64 rng(23);
  int changed = 0, compared = 0;
  for (int trial = 0; trial < 300; ++trial) {
    Config cfg = random_config(rng, false);
    cfg.drop_last = true;
    auto g = std::make_shared<const ClassGroups>(cfg.labels);
    const uint64_t n = cfg.labels.size();
    std::set<uint64_t> previous;
    for (uint64_t epoch = 0; epoch < 4; ++epoch) {
      const auto rows = epoch_rows(cfg, g, epoch);
      std::vector<bool> seen(n, false);
      for (const auto& row : rows)
        for (uint64_t i : row) seen[i] = true;
      std::set<uint64_t> dropped;
      for (uint64_t i = 0; i < n; ++i)
        if (!seen[i]) dropped.insert(i);
      for (uint32_t c = 0; c < g->num_classes(); ++c) {
        uint64_t count = 0;
        for (uint64_t k = 0; k < g->count(c); ++k) count += !seen[g->member(c, k)];
        const double expected = double(dropped.size()) * double(g->count(c)) / double(n);
        ASSERT_LT(std::abs(double(count) - expected), 1.0)
            << "dropped " << count << " of class " << g->label(c) << ", expected " << expected
            << "; " << cfg.describe();
      }
      if (epoch > 0 && !dropped.empty() && dropped.size() < n) {
        ++compared;
        changed += dropped != previous;
      }
      previous = std::move(dropped);
    }
  }
  ASSERT_GT(compared, 100);
  EXPECT_GT(changed, compared * 8 / 10);  // the same dropped set again is the exception
}

TEST(StratifiedPlan, WeightedEpochsHitTheTargetInEveryBatchAndStarveNoSample) {
  std::mt19937_64 rng(29);
  for (int trial = 0; trial < 400; ++trial) {
    const Config cfg = random_config(rng, true);
    auto g = std::make_shared<const ClassGroups>(cfg.labels);
    const uint64_t n = cfg.labels.size();
    const double sum = std::accumulate(cfg.weights.begin(), cfg.weights.end(), 0.0);
    std::vector<double> share(g->num_classes());
    for (uint32_t c = 0; c < g->num_classes(); ++c) share[c] = cfg.weights[c] / sum;
    const StratifiedPlan plan0(g, cfg.weights, cfg.seed, cfg.batch_size, cfg.drop_last, 0,
                               cfg.world);
    const BatchPlan reference(n, cfg.batch_size, cfg.drop_last, 0, cfg.world);
    ASSERT_EQ(plan0.num_batches(), reference.num_batches());
    // Draw counts over consecutive epochs: within one class, no sample is drawn a second time
    // before every sample was drawn once (counts differ by at most one after every batch).
    std::vector<uint64_t> drawn(n, 0);
    std::vector<uint32_t> class_of(n);
    for (uint32_t c = 0; c < g->num_classes(); ++c)
      for (uint64_t k = 0; k < g->count(c); ++k) class_of[g->member(c, k)] = c;
    const uint64_t epochs = 6;
    for (uint64_t epoch = 0; epoch < epochs; ++epoch) {
      const auto rows = epoch_rows(cfg, g, epoch);
      expect_rows_within_one(rows, cfg, *g, share, "weighted epoch " + std::to_string(epoch));
      std::vector<uint64_t> per_class(g->num_classes(), 0);
      for (const auto& row : rows) {
        for (uint64_t i : row) {
          ++drawn[i];
          ++per_class[class_of[i]];
        }
        for (uint32_t c = 0; c < g->num_classes(); ++c) {
          uint64_t lo = UINT64_MAX, hi = 0;
          for (uint64_t k = 0; k < g->count(c); ++k) {
            lo = std::min(lo, drawn[g->member(c, k)]);
            hi = std::max(hi, drawn[g->member(c, k)]);
          }
          ASSERT_LE(hi - lo, 1u) << "class " << g->label(c) << " repeated a sample before "
                                 << "drawing another; epoch " << epoch << "; " << cfg.describe();
        }
      }
      for (uint32_t c = 0; c < g->num_classes(); ++c) {
        ASSERT_EQ(per_class[c], plan0.class_draws(c)) << cfg.describe();  // fixed and stated
        if (cfg.weights[c] == 0) {
          ASSERT_EQ(per_class[c], 0u);
        }
      }
    }
  }
}

TEST(StratifiedPlan, ExtrasSpreadOverTheEpochAndOverRanks) {
  // A class's extra slots (the batches that hold ceil rather than floor of its share) are spread
  // over the epoch: every prefix of the rows holds its share within about 2 sqrt(rows), and
  // every rank gets its share of the class within as much, not a run of consecutive batches.
  std::mt19937_64 rng(37);
  for (int trial = 0; trial < 40; ++trial) {
    Config cfg;
    const int classes = 2 + static_cast<int>(rng() % 4);
    for (int c = 0; c < classes; ++c)
      for (uint64_t k = 0, size = 20 + rng() % 2000; k < size; ++k) cfg.labels.push_back(c);
    std::shuffle(cfg.labels.begin(), cfg.labels.end(), rng);
    cfg.batch_size = 8 + rng() % 40;
    cfg.world = 1 + rng() % 4;
    cfg.drop_last = true;
    cfg.seed = rng();
    auto g = std::make_shared<const ClassGroups>(cfg.labels);
    const auto rows = epoch_rows(cfg, g, 1);
    const double bound = 2 * std::sqrt(double(rows.size())) + 2;
    for (uint32_t c = 0; c < g->num_classes(); ++c) {
      std::vector<double> count;
      for (const auto& row : rows)
        count.push_back(double(std::count_if(
            row.begin(), row.end(), [&](uint64_t i) { return cfg.labels[i] == g->label(c); })));
      const double mean = std::accumulate(count.begin(), count.end(), 0.0) / double(count.size());
      double drift = 0, worst = 0;
      std::vector<double> per_rank(cfg.world, 0);
      for (size_t row = 0; row < count.size(); ++row) {
        drift += count[row] - mean;
        worst = std::max(worst, std::abs(drift));
        per_rank[row % cfg.world] += count[row] - mean;
      }
      ASSERT_LT(worst, bound) << "class " << c << "; " << cfg.describe();
      for (double r : per_rank)
        ASSERT_LT(std::abs(r), bound) << "class " << c << "; " << cfg.describe();
    }
  }
}

TEST(StratifiedPlan, CyclesNameEveryDrawOnce) {
  // (sample, cycle) is unique over all draws of consecutive epochs, so that it can key each
  // draw's randomness. Without weights the cycle is the epoch, but for padded repeats (which
  // take later cycles, as the stream runs on into the next epoch's).
  std::mt19937_64 rng(43);
  for (int trial = 0; trial < 200; ++trial) {
    const Config cfg = random_config(rng, trial % 2 == 0);
    auto g = std::make_shared<const ClassGroups>(cfg.labels);
    const bool padded = cfg.weights.empty() && !cfg.drop_last;
    std::set<std::pair<uint64_t, uint64_t>> draws;
    uint64_t total = 0;
    for (uint64_t epoch = 0; epoch < 4; ++epoch) {
      for (uint64_t r = 0; r < cfg.world; ++r) {
        const StratifiedPlan plan(g, cfg.weights, cfg.seed, cfg.batch_size, cfg.drop_last, r,
                                  cfg.world);
        const StratifiedEpoch e = plan.epoch(epoch);
        for (uint64_t b = 0; b < plan.num_batches(); ++b) {
          std::vector<uint64_t> out(plan.batch_length(b)), cycles(out.size()), alone(out.size());
          e.batch(b, out, cycles);
          e.batch(b, alone);
          ASSERT_EQ(out, alone);  // asking for cycles changes nothing else
          for (size_t k = 0; k < out.size(); ++k) {
            if (cfg.weights.empty()) {
              ASSERT_GE(cycles[k], epoch);
            }
            if (padded && cycles[k] > epoch) continue;  // a padded repeat
            draws.emplace(out[k], cycles[k]);
            ++total;
          }
        }
      }
    }
    ASSERT_EQ(draws.size(), total) << "a (sample, cycle) pair repeats; " << cfg.describe();
  }
}

TEST(StratifiedPlan, ABatchDependsOnlyOnEpochAndPosition) {
  // Resume: any batch, made alone from a fresh plan, is the batch of the full run.
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 100; ++trial) {
    const Config cfg = random_config(rng, trial % 2 == 1);
    auto g = std::make_shared<const ClassGroups>(cfg.labels);
    const uint64_t rank = rng() % cfg.world, epoch = rng() % 7;
    const StratifiedPlan plan(g, cfg.weights, cfg.seed, cfg.batch_size, cfg.drop_last, rank,
                              cfg.world);
    if (plan.num_batches() == 0) continue;
    const StratifiedEpoch e = plan.epoch(epoch);
    std::vector<std::vector<uint64_t>> full;
    for (uint64_t b = 0; b < plan.num_batches(); ++b) {
      full.emplace_back(plan.batch_length(b));
      e.batch(b, full.back());
    }
    const uint64_t b = rng() % plan.num_batches();
    const StratifiedPlan again(g, cfg.weights, cfg.seed, cfg.batch_size, cfg.drop_last, rank,
                               cfg.world);
    std::vector<uint64_t> alone(again.batch_length(b));
    again.epoch(epoch).batch(b, alone);
    ASSERT_EQ(alone, full[b]) << cfg.describe();
  }
}

TEST(StratifiedPlan, OrderIsRandomAndDependsOnSeedAndEpoch) {
  std::vector<int64_t> labels;
  for (int i = 0; i < 950; ++i) labels.push_back(0);
  for (int i = 0; i < 50; ++i) labels.push_back(1);
  auto g = std::make_shared<const ClassGroups>(labels);
  const auto flat = [&](uint64_t seed, uint64_t epoch) {
    const StratifiedPlan plan(g, {}, seed, 32, true, 0, 1);
    const StratifiedEpoch e = plan.epoch(epoch);
    std::vector<uint64_t> all;
    for (uint64_t b = 0; b < plan.num_batches(); ++b) {
      std::vector<uint64_t> out(plan.batch_length(b));
      e.batch(b, out);
      all.insert(all.end(), out.begin(), out.end());
    }
    return all;
  };
  const auto a = flat(1, 0);
  EXPECT_EQ(a, flat(1, 0));
  EXPECT_NE(a, flat(1, 1));
  EXPECT_NE(a, flat(2, 0));
  // The rare class is not always in the same slots of a batch, nor the same samples first.
  std::set<uint64_t> first_of_batch;
  for (size_t k = 0; k < a.size(); k += 32) first_of_batch.insert(a[k]);
  EXPECT_GT(first_of_batch.size(), 25u);
  std::vector<int> rare_slot(32, 0);
  for (size_t k = 0; k < a.size(); ++k) rare_slot[k % 32] += labels[a[k]] == 1;
  EXPECT_GT(std::count_if(rare_slot.begin(), rare_slot.end(), [](int x) { return x > 0; }), 20);
  // Over many epochs the first sample of batch 0 is spread over the whole dataset.
  const StratifiedPlan plan(g, {}, 5, 32, true, 0, 1);
  std::map<uint64_t, int> first;
  std::vector<uint64_t> batch0(32);
  for (uint64_t epoch = 0; epoch < 3000; ++epoch) {
    plan.epoch(epoch).batch(0, batch0);
    ++first[batch0[0]];
  }
  EXPECT_GT(first.size(), 850u);  // about 1000 * (1 - e^-3) = 950 distinct if uniform
}

TEST(StratifiedPlan, ScenarioOfTheIssue) {
  // Two classes, 95% and 5%, batch 32, drop_last: the rare class has 1 or 2 in every batch
  // (32 * 0.05 = 1.6), never 0, on every rank.
  std::vector<int64_t> labels(10000, 0);
  for (size_t i = 0; i < labels.size(); i += 20) labels[i] = 1;
  auto g = std::make_shared<const ClassGroups>(labels);
  for (uint64_t world : {1u, 3u}) {
    for (uint64_t r = 0; r < world; ++r) {
      const StratifiedPlan plan(g, {}, 0, 32, true, r, world);
      for (uint64_t epoch = 0; epoch < 3; ++epoch) {
        const StratifiedEpoch e = plan.epoch(epoch);
        uint64_t twos = 0;
        for (uint64_t b = 0; b < plan.num_batches(); ++b) {
          std::vector<uint64_t> out(32);
          e.batch(b, out);
          const auto rare =
              std::count_if(out.begin(), out.end(), [&](uint64_t i) { return labels[i] == 1; });
          ASSERT_TRUE(rare == 1 || rare == 2) << rare;
          twos += rare == 2;
        }
        EXPECT_NEAR(double(twos) / double(plan.num_batches()), 0.6, 0.1);
      }
    }
  }
  // Balanced weights: 16 of each in every batch; the 500 rare samples cycle, each drawn once
  // before any is drawn again.
  const StratifiedPlan balanced(g, {1.0, 1.0}, 0, 32, true, 0, 1);
  EXPECT_EQ(balanced.class_draws(0), 4992u);
  EXPECT_EQ(balanced.class_draws(1), 4992u);
  const StratifiedEpoch e = balanced.epoch(0);
  std::vector<uint64_t> out(32);
  for (uint64_t b = 0; b < balanced.num_batches(); ++b) {
    e.batch(b, out);
    ASSERT_EQ(std::count_if(out.begin(), out.end(), [&](uint64_t i) { return labels[i] == 1; }),
              16);
  }
}

TEST(StratifiedPlan, SingleClassAndEmptyDatasets) {
  auto one = std::make_shared<const ClassGroups>(std::vector<int64_t>(10, 4));
  const StratifiedPlan plan(one, {}, 3, 4, false, 0, 1);
  std::multiset<uint64_t> seen;
  const StratifiedEpoch e = plan.epoch(2);
  for (uint64_t b = 0; b < plan.num_batches(); ++b) {
    std::vector<uint64_t> out(plan.batch_length(b));
    e.batch(b, out);
    seen.insert(out.begin(), out.end());
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(std::set<uint64_t>(seen.begin(), seen.end()).size(), 10u);
  auto none = std::make_shared<const ClassGroups>(std::vector<int64_t>{});
  EXPECT_EQ(StratifiedPlan(none, {}, 0, 4, false, 0, 2).num_batches(), 0u);
}

TEST(StratifiedPlan, RejectsInvalidArguments) {
  auto g = std::make_shared<const ClassGroups>(std::vector<int64_t>{0, 1, 1, 2});
  EXPECT_THROW(StratifiedPlan(nullptr, {}, 0, 2, false, 0, 1), InvalidArgument);
  EXPECT_THROW(StratifiedPlan(g, {}, 0, 0, false, 0, 1), InvalidArgument);
  EXPECT_THROW(StratifiedPlan(g, {}, 0, 2, false, 2, 2), InvalidArgument);
  EXPECT_THROW(StratifiedPlan(g, {1.0, 2.0}, 0, 2, false, 0, 1), InvalidArgument);
  EXPECT_THROW(StratifiedPlan(g, {1.0, -1.0, 1.0}, 0, 2, false, 0, 1), InvalidArgument);
  EXPECT_THROW(StratifiedPlan(g, {0.0, 0.0, 0.0}, 0, 2, false, 0, 1), InvalidArgument);
  EXPECT_THROW(StratifiedPlan(g, {1.0, NAN, 1.0}, 0, 2, false, 0, 1), InvalidArgument);
  const StratifiedPlan plan(g, {}, 0, 2, false, 0, 1);
  std::vector<uint64_t> wrong(3), out(2);
  EXPECT_THROW(plan.epoch(0).batch(0, wrong), InvalidArgument);
  EXPECT_THROW(plan.epoch(0).batch(2, out), InvalidArgument);
}

}  // namespace
}  // namespace stoker
