// Ragged sources (source.h) through the engine: padded batches, "lengths", budgets (budget.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "stoker/budget.h"
#include "stoker/engine.h"
#include "stoker/errors.h"

namespace stoker {
namespace {

// Sample i: "tokens", int32 rows of 2 values (i, row), length 1 + (i * 7) % max_len; "id", int64 i.
// Samples in `fail` throw when read.
class RaggedSource : public Source {
 public:
  RaggedSource(uint64_t n, uint64_t max_len, std::set<uint64_t> fail = {})
      : n_(n), max_len_(max_len), fail_(std::move(fail)) {
    FieldSpec tokens{"tokens", DType{DType::kInt, 32}, {static_cast<int64_t>(max_len), 2}};
    tokens.ragged = true;
    tokens.pad_value = -1;
    fields_ = {tokens, {"id", kInt64, {}}};
  }
  uint64_t size() const override { return n_; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  uint64_t length(uint64_t i) const override { return 1 + (i * 7) % max_len_; }
  void read(const SampleKey& key, std::span<std::byte* const> slots, WorkerState*) const override {
    if (fail_.count(key.index)) throw DecodeError("bad sample");
    auto* rows = reinterpret_cast<int32_t*>(slots[0]);
    for (uint64_t r = 0; r < length(key.index); ++r) {
      rows[2 * r] = static_cast<int32_t>(key.index);
      rows[2 * r + 1] = static_cast<int32_t>(r);
    }
    const int64_t id = static_cast<int64_t>(key.index);
    std::memcpy(slots[1], &id, sizeof id);
  }
  std::string path(uint64_t i) const override { return "doc" + std::to_string(i); }

 private:
  uint64_t n_, max_len_;
  std::set<uint64_t> fail_;
  std::vector<FieldSpec> fields_;
};

struct Seen {
  std::vector<std::vector<int64_t>> ids;  // per batch
  std::vector<int64_t> padded;            // per batch
};

// Checks every batch's layout and contents; returns the ids per batch.
Seen drain(EpochIterator& it, const Source& src, uint64_t multiple,
           const std::set<uint64_t>& replaced = {}) {
  Seen out;
  while (auto b = it.next()) {
    EXPECT_EQ(b->fields.size(), 3u);
    const BatchField& tokens = b->fields[0];
    const BatchField& lengths = b->fields[2];
    EXPECT_EQ(lengths.name, "lengths");
    EXPECT_EQ(tokens.shape.size(), 3u);
    if (tokens.shape.size() != 3) return out;
    EXPECT_EQ(tokens.shape[0], static_cast<int64_t>(b->length));
    EXPECT_EQ(tokens.shape[2], 2);
    const int64_t padded = tokens.shape[1];
    EXPECT_EQ(padded % static_cast<int64_t>(multiple), 0);
    const auto* ids = reinterpret_cast<const int64_t*>(b->fields[1].data);
    const auto* lens = reinterpret_cast<const int64_t*>(lengths.data);
    const auto* rows = reinterpret_cast<const int32_t*>(tokens.data);
    int64_t longest = 0;
    std::vector<int64_t> batch_ids;
    for (uint64_t s = 0; s < b->length; ++s) {
      batch_ids.push_back(ids[s]);
      EXPECT_EQ(lens[s], static_cast<int64_t>(src.length(ids[s])));
      longest = std::max(longest, lens[s]);
      for (int64_t r = 0; r < padded; ++r) {
        const int32_t* row = rows + (s * padded + r) * 2;
        const bool ok =
            r < lens[s] ? row[0] == ids[s] && row[1] == r : row[0] == -1 && row[1] == -1;
        EXPECT_TRUE(ok) << "sample " << ids[s] << " row " << r << ": " << row[0] << ", " << row[1];
        if (!ok) return out;
      }
    }
    if (replaced.empty()) {
      EXPECT_EQ(padded, (longest + multiple - 1) / multiple * multiple);
    }
    out.ids.push_back(batch_ids);
    out.padded.push_back(padded);
  }
  return out;
}

TEST(Ragged, FixedSizeBatchesArePaddedToTheirLongestSample) {
  auto src = std::make_shared<RaggedSource>(50, 13);
  for (int workers : {0, 3}) {
    EngineOptions o;
    o.batch_size = 4;
    o.shuffle = true;
    o.num_workers = workers;
    o.pad_to_multiple_of = 4;
    Engine loader(src, o);
    const Seen seen = drain(*loader.iterate(1), *src, 4);
    std::multiset<int64_t> all;
    for (const auto& b : seen.ids) all.insert(b.begin(), b.end());
    EXPECT_EQ(all.size(), 50u);
    EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 50u);
    const EngineStats st = loader.stats();
    EXPECT_GT(st.ragged_padded_rows, st.ragged_rows);
  }
}

std::vector<double> lengths_of(const Source& src) {
  std::vector<double> out(src.size());
  for (uint64_t i = 0; i < out.size(); ++i) out[i] = static_cast<double>(src.length(i));
  return out;
}

TEST(Ragged, BudgetBatchesStayWithinTheirBudgetAndDoNotDependOnWorkers) {
  auto src = std::make_shared<RaggedSource>(400, 40);
  BudgetOptions bo;
  bo.budget = 64;
  auto plan = std::make_shared<const BudgetPlan>(lengths_of(*src), bo);
  std::vector<std::vector<std::vector<int64_t>>> runs;
  for (int workers : {0, 1, 3}) {
    EngineOptions o;
    o.shuffle = true;
    o.seed = 9;
    o.num_workers = workers;
    o.budget = plan;
    Engine loader(src, o);
    const Seen seen = drain(*loader.iterate(2), *src, 1);
    std::set<int64_t> all;
    for (size_t b = 0; b < seen.ids.size(); ++b) {
      EXPECT_LE(static_cast<double>(seen.ids[b].size() * seen.padded[b]), bo.budget);
      all.insert(seen.ids[b].begin(), seen.ids[b].end());
    }
    EXPECT_EQ(all.size(), 400u);
    runs.push_back(seen.ids);
    EXPECT_THROW(loader.num_batches(), InvalidArgument);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

TEST(Ragged, ABudgetResumesFromItsEpochAtAnyBatch) {
  auto src = std::make_shared<RaggedSource>(300, 30);
  BudgetOptions bo;
  bo.budget = 90;
  auto plan = std::make_shared<const BudgetPlan>(lengths_of(*src), bo);
  EngineOptions o;
  o.shuffle = true;
  o.num_workers = 2;
  o.budget = plan;
  o.world_size = 2;
  o.rank = 1;
  Engine loader(src, o);
  auto epoch = plan->epoch(0, 3, true, 1, 2);
  const Seen whole = drain(*loader.iterate(epoch), *src, 1);
  ASSERT_EQ(whole.ids.size(), epoch->num_batches());
  const Seen rest = drain(*loader.iterate(epoch, 5), *src, 1);
  EXPECT_EQ(rest.ids, std::vector<std::vector<int64_t>>(whole.ids.begin() + 5, whole.ids.end()));
}

TEST(Ragged, ASkippedSampleIsReplacedByOneThatFitsTheBatch) {
  auto src = std::make_shared<RaggedSource>(200, 20, std::set<uint64_t>{3, 50, 121});
  EngineOptions o;
  o.batch_size = 8;
  o.shuffle = true;
  o.num_workers = 2;
  o.on_error = OnError::kSkip;
  Engine loader(src, o);
  const Seen seen = drain(*loader.iterate(0), *src, 1, {3, 50, 121});
  for (size_t b = 0; b < seen.ids.size(); ++b)
    for (int64_t id : seen.ids[b]) {
      EXPECT_TRUE(id != 3 && id != 50 && id != 121);
      EXPECT_LE(static_cast<int64_t>(src->length(id)), seen.padded[b]);
    }
  EXPECT_EQ(loader.stats().skipped, 3u);
  o.on_error = OnError::kRaise;
  Engine strict(src, o);
  auto it = strict.iterate(0);
  bool raised = false;
  try {
    while (it->next()) {
    }
  } catch (const SampleError& e) {
    raised = true;
    EXPECT_NE(std::string(e.what()).find("doc"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(raised);
}

TEST(Ragged, ABudgetRefusesWhatItCannotPlan) {
  auto src = std::make_shared<RaggedSource>(10, 5);
  BudgetOptions bo;
  bo.budget = 10;
  EngineOptions o;
  o.budget = std::make_shared<const BudgetPlan>(std::vector<double>(9, 1.0), bo);
  EXPECT_THROW(Engine(src, o), InvalidArgument) << "a plan of other samples";
  o.budget = std::make_shared<const BudgetPlan>(lengths_of(*src), bo);
  o.repeats = 2;
  EXPECT_THROW(Engine(src, o), InvalidArgument);
  o.repeats = 1;
  o.pad_to_multiple_of = 0;
  EXPECT_THROW(Engine(src, o), InvalidArgument);
}

// Two ragged groups: "tokens" (int32, group 0, length 1 + i % 5, pad -1) and "patches" (float32
// rows of 2, group 1, length (3 * i) % 7, pad 0.5); samples in `fail` throw when read.
class TwoGroupSource : public Source {
 public:
  explicit TwoGroupSource(uint64_t n, std::set<uint64_t> fail = {})
      : n_(n), fail_(std::move(fail)) {
    FieldSpec tokens{"tokens", DType{DType::kInt, 32}, {5}};
    tokens.ragged = true;
    tokens.pad_value = -1;
    FieldSpec patches{"patches", kFloat32, {6, 2}};
    patches.ragged = true;
    patches.pad_value = 0.5;
    patches.ragged_group = 1;
    fields_ = {tokens, patches, {"id", kInt64, {}}};
  }
  uint64_t size() const override { return n_; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  uint64_t length(uint64_t i) const override { return 1 + i % 5; }
  uint64_t group_length(uint64_t i, uint32_t g) const override {
    return g == 0 ? length(i) : (3 * i) % 7;
  }
  void read(const SampleKey& key, std::span<std::byte* const> slots, WorkerState*) const override {
    if (fail_.count(key.index)) throw DecodeError("bad sample");
    auto* tokens = reinterpret_cast<int32_t*>(slots[0]);
    for (uint64_t r = 0; r < length(key.index); ++r) tokens[r] = static_cast<int32_t>(key.index);
    auto* patches = reinterpret_cast<float*>(slots[1]);
    for (uint64_t r = 0; r < 2 * group_length(key.index, 1); ++r)
      patches[r] = static_cast<float>(key.index);
    const int64_t id = static_cast<int64_t>(key.index);
    std::memcpy(slots[2], &id, sizeof id);
  }

 private:
  uint64_t n_;
  std::set<uint64_t> fail_;
  std::vector<FieldSpec> fields_;
};

TEST(Ragged, GroupsArePaddedEachToItsOwnLongestWithALengthsFieldEach) {
  auto src = std::make_shared<TwoGroupSource>(60, std::set<uint64_t>{7, 33});
  for (int workers : {0, 2}) {
    EngineOptions o;
    o.batch_size = 4;
    o.shuffle = true;
    o.num_workers = workers;
    o.on_error = OnError::kSkip;
    Engine loader(src, o);
    auto it = loader.iterate(0);
    std::set<int64_t> seen;
    uint64_t delivered = 0;
    while (auto b = it->next()) {
      delivered += b->length;
      ASSERT_EQ(b->fields.size(), 5u);
      EXPECT_EQ(b->fields[3].name, "lengths");
      EXPECT_EQ(b->fields[4].name, "patches_lengths");
      const auto* ids = reinterpret_cast<const int64_t*>(b->fields[2].data);
      const auto* lens = reinterpret_cast<const int64_t*>(b->fields[3].data);
      const auto* plens = reinterpret_cast<const int64_t*>(b->fields[4].data);
      const int64_t t = b->fields[0].shape[1], p = b->fields[1].shape[1];
      EXPECT_EQ(b->fields[1].shape[2], 2);
      int64_t most_t = 0, most_p = 0;
      for (uint64_t s = 0; s < b->length; ++s) {
        const auto i = static_cast<uint64_t>(ids[s]);
        seen.insert(ids[s]);
        EXPECT_TRUE(i != 7 && i != 33);
        EXPECT_EQ(lens[s], static_cast<int64_t>(src->length(i)));
        EXPECT_EQ(plens[s], static_cast<int64_t>(src->group_length(i, 1)));
        most_t = std::max(most_t, lens[s]);
        most_p = std::max(most_p, plens[s]);
        const auto* tok = reinterpret_cast<const int32_t*>(b->fields[0].data) + s * t;
        for (int64_t r = 0; r < t; ++r) EXPECT_EQ(tok[r], r < lens[s] ? ids[s] : -1) << i;
        const auto* pat = reinterpret_cast<const float*>(b->fields[1].data) + s * p * 2;
        for (int64_t r = 0; r < 2 * p; ++r)
          EXPECT_EQ(pat[r], r < 2 * plens[s] ? static_cast<float>(ids[s]) : 0.5f) << i;
      }
      EXPECT_EQ(t, most_t);
      EXPECT_EQ(p, most_p);
    }
    EXPECT_EQ(delivered, 60u);  // the two bad samples replaced by others that fit the batch
    EXPECT_GE(seen.size(), 50u);
    EXPECT_EQ(loader.stats().skipped, 2u);
  }
}

}  // namespace
}  // namespace stoker
