#include "stoker/pydata/global_seeder.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>

#include "pydata/testing.h"
#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker::python {
namespace {

using testing::FakeGenerators;
using testing::repr;

std::array<uint32_t, 624> expected_words(GlobalSeeder::Generator g, uint64_t key) {
  std::array<uint32_t, 624> w{};
  expand_mt19937_state(GlobalSeeder::generator_key(g, key), w.data());
  return w;
}

TEST(GlobalSeeder, SeedsEachGeneratorWithItsOwnStateAndClearsCachedNormals) {
  FakeGenerators fake;
  GlobalSeeder seeder(fake.fields());
  const uint64_t key = 0x1234'5678'9abc'def0ULL >> 1;
  for (int g = 0; g < GlobalSeeder::kGenerators; ++g)
    seeder.seed_one(static_cast<GlobalSeeder::Generator>(g), key);
  const auto py = expected_words(GlobalSeeder::kPython, key);
  const auto np = expected_words(GlobalSeeder::kNumpy, key);
  const auto th = expected_words(GlobalSeeder::kTorch, key);
  EXPECT_EQ(std::memcmp(fake.py.state, py.data(), sizeof py), 0);
  EXPECT_EQ(std::memcmp(fake.np.key, np.data(), sizeof np), 0);
  EXPECT_EQ(std::memcmp(fake.torch.mt.state, th.data(), sizeof th), 0);
  EXPECT_NE(py, np);
  EXPECT_NE(np, th);
  EXPECT_EQ(fake.py.index, 624);  // the next draw regenerates the state, as setstate() leaves it
  EXPECT_EQ(PyDict_GetItemString(fake.dict.get(), "gauss_next"), Py_None);
  EXPECT_EQ(fake.np.pos, 624);
  EXPECT_EQ(fake.np_has_gauss, 0);
  EXPECT_EQ(fake.torch.mt.seed, key);  // torch.initial_seed()
  EXPECT_EQ(fake.torch.mt.left, 1);
  EXPECT_TRUE(fake.torch.mt.seeded);
  EXPECT_FALSE(fake.torch.f.has_value());
  EXPECT_FALSE(fake.torch.d.has_value());
}

TEST(GlobalSeeder, PrintChangesWithADrawASeedOrACachedNormal) {
  FakeGenerators fake;
  GlobalSeeder seeder(fake.fields());
  for (int g = 0; g < GlobalSeeder::kGenerators; ++g)
    seeder.seed_one(static_cast<GlobalSeeder::Generator>(g), 7);
  const auto before = [&](int g) { return seeder.print(static_cast<GlobalSeeder::Generator>(g)); };
  const auto py = before(0), np = before(1), th = before(2);
  fake.py.index = 1;  // a draw
  EXPECT_FALSE(seeder.print(GlobalSeeder::kPython) == py);
  fake.np.key[623] ^= 1;  // a regenerated state
  EXPECT_FALSE(seeder.print(GlobalSeeder::kNumpy) == np);
  fake.torch.d = 0.5;  // a cached normal
  EXPECT_FALSE(seeder.print(GlobalSeeder::kTorch) == th);
  fake.torch.d.reset();
  EXPECT_TRUE(seeder.print(GlobalSeeder::kTorch) == th);
}

TEST(GlobalSeeder, RestorePutsBackWhatSaveTook) {
  FakeGenerators fake;
  GlobalSeeder seeder(fake.fields());
  const FakeGenerators original;
  const PyRef saved = seeder.save();
  for (int g = 0; g < GlobalSeeder::kGenerators; ++g)
    seeder.seed_one(static_cast<GlobalSeeder::Generator>(g), 99);
  seeder.restore(saved.get());
  EXPECT_EQ(fake.py.index, 17);
  EXPECT_EQ(fake.np.pos, 5);
  EXPECT_EQ(fake.np_has_gauss, 1);
  EXPECT_EQ(fake.np_gauss, 0.25);
  EXPECT_EQ(fake.torch.mt.left, 9);
  EXPECT_EQ(fake.torch.mt.next, 3u);
  EXPECT_EQ(fake.torch.f, 1.5f);
  EXPECT_EQ(fake.torch.d, -2.5);
  EXPECT_EQ(std::memcmp(fake.py.state, original.py.state, sizeof fake.py.state), 0);
  EXPECT_EQ(repr(PyDict_GetItemString(fake.dict.get(), "gauss_next")), "0.5");
  const PyRef wrong = check(PyRef::steal(Py_BuildValue("(yO)", "short", Py_None)));
  EXPECT_THROW(seeder.restore(wrong.get()), InvalidArgument);
}

TEST(GlobalSeeder, RefusesMissingFields) {
  FakeGenerators fake;
  GeneratorFields f = fake.fields();
  f.np_pos = nullptr;
  EXPECT_THROW(GlobalSeeder{f}, InvalidArgument);
}

}  // namespace
}  // namespace stoker::python
