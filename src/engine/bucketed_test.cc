// Bucketed sources (source.h) through the engine: every batch of one bucket, in that bucket's
// shape, the samples' slots packed at that shape; budgets (budget.h) plan by bucket.
#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "stoker/budget.h"
#include "stoker/engine.h"
#include "stoker/errors.h"

namespace stoker {
namespace {

// Three buckets of "image" shapes (uint8 [2, h, w]): sample i is in bucket i % 3, every element
// of its image i % 251; "id" int64 i. Samples in `fail` throw when read.
const std::vector<std::vector<int64_t>> kShapes = {{2, 3, 5}, {2, 4, 4}, {2, 6, 2}};

class BucketSource : public Source {
 public:
  explicit BucketSource(uint64_t n, std::set<uint64_t> fail = {}) : n_(n), fail_(std::move(fail)) {
    FieldSpec image{"image", kUInt8, {2, 6, 5}};
    image.bucket_shapes = kShapes;
    fields_ = {image, {"id", kInt64, {}}};
  }
  uint64_t size() const override { return n_; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  uint64_t bucket(uint64_t i) const override { return i % 3; }
  void read(const SampleKey& key, std::span<std::byte* const> slots, WorkerState*) const override {
    if (fail_.count(key.index)) throw DecodeError("bad image");
    const auto& s = kShapes[bucket(key.index)];
    std::memset(slots[0], static_cast<int>(key.index % 251), s[0] * s[1] * s[2]);
    const auto id = static_cast<int64_t>(key.index);
    std::memcpy(slots[1], &id, sizeof id);
  }
  std::string path(uint64_t i) const override { return "img" + std::to_string(i); }

 private:
  uint64_t n_;
  std::set<uint64_t> fail_;
  std::vector<FieldSpec> fields_;
};

std::shared_ptr<const BudgetPlan> plan_of(const Source& src, double budget) {
  BudgetOptions bo;
  bo.budget = budget;  // in pixels: h x w of the sample's bucket
  std::vector<double> pixels(src.size());
  for (uint64_t i = 0; i < src.size(); ++i) {
    const auto& s = kShapes[src.bucket(i)];
    pixels[i] = static_cast<double>(s[1] * s[2]);
    bo.bucket_of.push_back(static_cast<uint32_t>(src.bucket(i)));
  }
  return std::make_shared<const BudgetPlan>(pixels, bo);
}

// The ids of every batch, each batch checked: one bucket, its shape, every slot its sample's.
std::vector<std::vector<int64_t>> drain(EpochIterator& it, const Source& src) {
  std::vector<std::vector<int64_t>> out;
  while (auto b = it.next()) {
    const BatchField& image = b->fields[0];
    const auto* ids = reinterpret_cast<const int64_t*>(b->fields[1].data);
    const uint64_t bucket = src.bucket(ids[0]);
    std::vector<int64_t> shape{static_cast<int64_t>(b->length)};
    shape.insert(shape.end(), kShapes[bucket].begin(), kShapes[bucket].end());
    EXPECT_EQ(image.shape, shape);
    const int64_t per = shape[1] * shape[2] * shape[3];
    const auto* px = reinterpret_cast<const uint8_t*>(image.data);
    out.emplace_back();
    for (uint64_t s = 0; s < b->length; ++s) {
      EXPECT_EQ(src.bucket(ids[s]), bucket) << "sample " << ids[s];
      int64_t wrong = 0;
      for (int64_t e = 0; e < per; ++e) wrong += px[s * per + e] != ids[s] % 251;
      EXPECT_EQ(wrong, 0) << "sample " << ids[s];
      out.back().push_back(ids[s]);
    }
  }
  return out;
}

TEST(Bucketed, EveryBatchIsOneBucketInItsShapeWhateverTheWorkers) {
  auto src = std::make_shared<BucketSource>(301);
  auto plan = plan_of(*src, 4 * 16.0);  // 4 images of 16 pixels, 4 of 15, 5 of 12
  std::vector<std::vector<std::vector<int64_t>>> runs;
  for (int workers : {0, 1, 3}) {
    EngineOptions o;
    o.shuffle = true;
    o.seed = 5;
    o.num_workers = workers;
    o.budget = plan;
    Engine loader(src, o);
    const auto ids = drain(*loader.iterate(1), *src);
    std::multiset<int64_t> all;
    for (const auto& b : ids) {
      EXPECT_LE(b.size(), 5u);
      all.insert(b.begin(), b.end());
    }
    EXPECT_EQ(all.size(), 301u);
    EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 301u);
    runs.push_back(ids);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

TEST(Bucketed, ASkippedSampleIsReplacedFromItsBucket) {
  auto src = std::make_shared<BucketSource>(120, std::set<uint64_t>{4, 50, 99});
  EngineOptions o;
  o.shuffle = true;
  o.num_workers = 2;
  o.on_error = OnError::kSkip;
  o.budget = plan_of(*src, 64);
  Engine loader(src, o);
  for (const auto& b : drain(*loader.iterate(0), *src))
    for (int64_t id : b) EXPECT_TRUE(id != 4 && id != 50 && id != 99);
  EXPECT_EQ(loader.stats().skipped, 3u);
}

TEST(Bucketed, NeedsBatchesPlannedByItsBuckets) {
  auto src = std::make_shared<BucketSource>(30);
  EngineOptions o;
  o.batch_size = 4;
  EXPECT_THROW(Engine(src, o), InvalidArgument) << "batches by count would mix buckets";
  BudgetOptions bo;
  bo.budget = 64;
  o.budget = std::make_shared<const BudgetPlan>(std::vector<double>(30, 16.0), bo);
  Engine mixed(src, o);  // a plan that ignores the buckets: its batches are refused
  auto it = mixed.iterate(0);
  EXPECT_THROW(
      {
        while (it->next()) {
        }
      },
      Error);
}

}  // namespace
}  // namespace stoker
