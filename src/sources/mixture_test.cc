#include "stoker/sources/mixture.h"

#include <gtest/gtest.h>

#include <numeric>
#include <string>

#include "stoker/mixture.h"
#include "stoker/testing/faulty.h"
#include "stoker/errors.h"
#include "stoker/engine.h"
#include "stoker/random.h"
#include "stoker/sources/array.h"

namespace stoker {
namespace {

// A source whose sample i is (i, a number drawn from its key's randomness).
class RandomSource final : public Source {
 public:
  explicit RandomSource(uint64_t n) : n_(n), fields_{{"x", kInt64, {2}}} {}
  uint64_t size() const override { return n_; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read(const SampleKey& key, std::span<std::byte* const> slots, WorkerState*) const override {
    SampleRng rng(key.seed, key.epoch, key.index);
    const int64_t v[2] = {static_cast<int64_t>(key.index), static_cast<int64_t>(rng.next_u64())};
    std::memcpy(slots[0], v, sizeof v);
  }

 private:
  uint64_t n_;
  std::vector<FieldSpec> fields_;
};

TEST(MixtureSource, ReadsTheSourceOfEachGlobalSampleWithItsOwnSeed) {
  auto a = std::make_shared<RandomSource>(3), b = std::make_shared<RandomSource>(0),
       c = std::make_shared<RandomSource>(5);
  const MixtureSource mix({a, b, c}, {"a", "empty", "c"});
  ASSERT_EQ(mix.size(), 8u);
  EXPECT_EQ(mix.sizes(), (std::vector<uint64_t>{3, 0, 5}));
  EXPECT_EQ(mix.locate(2), (std::pair<uint64_t, uint64_t>{0, 2}));
  EXPECT_EQ(mix.locate(3), (std::pair<uint64_t, uint64_t>{2, 0}));
  EXPECT_EQ(mix.locate(7), (std::pair<uint64_t, uint64_t>{2, 4}));
  int64_t v[2];
  std::byte* slot[1] = {reinterpret_cast<std::byte*>(v)};
  auto state = mix.make_worker_state();
  for (WorkerState* s : {state.get(), static_cast<WorkerState*>(nullptr)}) {
    mix.read({11, 4, 6}, slot, s);
    EXPECT_EQ(v[0], 3);
    EXPECT_EQ(v[1], static_cast<int64_t>(SampleRng(mixture_source_seed(11, 2), 4, 3).next_u64()));
  }
  EXPECT_EQ(mix.path(4), "c: sample 1");
}

TEST(MixtureSource, NamesTheSourceOfAPath) {
  auto f = std::make_shared<FaultySource>(4, 1, std::set<uint64_t>{});
  const MixtureSource mix({f, f}, {"web", "code"});
  EXPECT_EQ(mix.path(5), "code: " + f->path(1));
}

TEST(MixtureSource, RejectsSourcesWithOtherFields) {
  const auto message = [](std::vector<std::shared_ptr<const Source>> s,
                          std::vector<std::string> names) -> std::string {
    try {
      MixtureSource m(std::move(s), std::move(names));
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  };
  auto narrow = std::make_shared<FaultySource>(4, 1, std::set<uint64_t>{});
  auto wide = std::make_shared<FaultySource>(4, 3, std::set<uint64_t>{});
  auto random = std::make_shared<RandomSource>(4);
  EXPECT_NE(message({narrow, wide}, {"a", "b"}).find("mixture source \"b\" field 0"),
            std::string::npos);
  EXPECT_NE(message({narrow, wide}, {"a", "b"}).find("shape (3,)"), std::string::npos);
  EXPECT_NE(message({narrow, random}, {"a", "b"}).find("is named \"x\""), std::string::npos);
  EXPECT_NE(message({}, {}).find("at least one source"), std::string::npos);
  EXPECT_NE(message({narrow}, {"a", "b"}).find("one name per source"), std::string::npos);
  EXPECT_NE(message({narrow, nullptr}, {"a", "b"}).find("\"b\" is null"), std::string::npos);
}

TEST(MixtureSource, ALoaderDrawsEachSourceInProportion) {
  auto a = std::make_shared<FaultySource>(20, 1, std::set<uint64_t>{});
  auto b = std::make_shared<FaultySource>(50, 1, std::set<uint64_t>{});
  auto mix = std::make_shared<MixtureSource>(std::vector<std::shared_ptr<const Source>>{a, b},
                                             std::vector<std::string>{"a", "b"});
  EngineOptions o;
  o.batch_size = 10;
  o.shuffle = true;
  o.num_workers = 2;
  o.pin_memory = PinMemory::kOff;
  o.memory_budget = 16 << 20;
  o.mixture = std::make_shared<MixtureOrder>(MixtureOrder{mix->sizes(), {{0, {3, 7}}}});
  Engine loader(mix, o);
  auto it = loader.iterate(0);
  while (auto batch = it->next()) EXPECT_EQ(batch->length, 10u);
  const EngineStats s = loader.stats();  // 3 and 7 of each batch of 10
  EXPECT_EQ(s.mixture_samples, (std::vector<uint64_t>{21, 49}));
}

}  // namespace
}  // namespace stoker
