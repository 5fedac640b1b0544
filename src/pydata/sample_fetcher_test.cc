#include "stoker/pydata/sample_fetcher.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "pydata/testing.h"
#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker::python {
namespace {

using testing::eval;
using testing::FakeGenerators;
using testing::repr;
using testing::run;
using testing::take_error;

// A dataset whose samples in `draws` "draw" from the fake NumPy generator (they move its position,
// as a draw does) and report the key torch.initial_seed() would give them; `calls` counts
// __getitem__ per index; `bad` samples raise.
std::string dataset_code(const FakeGenerators& fake) {
  return "import ctypes, collections\n"
         "NP_POS = " +
         std::to_string(reinterpret_cast<uintptr_t>(&fake.np.pos)) + "\n" +
         "TORCH_SEED = " + std::to_string(reinterpret_cast<uintptr_t>(&fake.torch.mt.seed)) + "\n" +
         R"py(
calls = collections.Counter()
class Data:
    def __init__(self, draws=(), bad=()):
        self.draws, self.bad = set(draws), set(bad)
    def __len__(self): return 1000
    def __getitem__(self, i):
        key = i if isinstance(i, int) else tuple(i)
        calls[key] += 1
        if key in self.bad:
            raise OSError(f"cannot read {i}")
        pos = ctypes.c_int.from_address(NP_POS)
        was = pos.value
        if key in self.draws:
            pos.value = 3
        return (key, was, ctypes.c_uint64.from_address(TORCH_SEED).value)
)py";
}

struct Fixture {
  FakeGenerators fake;
  std::shared_ptr<GlobalSeeder> seeder = std::make_shared<GlobalSeeder>(fake.fields());
  PyRef ns = run(dataset_code(fake));

  SampleFetcher fetcher(SampleFetcher::Seeding seeding, bool skip = false) {
    SampleFetcher::Options o;
    o.seed = 5;
    o.seeding = seeding;
    o.seeder = seeder;
    o.skip = skip;
    o.size = 1000;
    return SampleFetcher(o);
  }
  PyRef fetch(SampleFetcher& f, const char* dataset, const char* indices, uint64_t batch = 0,
              uint64_t first_row = 0) {
    return f.fetch(eval(ns, dataset).get(), 2, eval(ns, indices).get(), batch, first_row);
  }
  long calls(const char* key) {
    return PyLong_AsLong(eval(ns, std::string("calls[") + key + "]").get());
  }
};

TEST(SampleKey, FitsIn63BitsAndDependsOnSeedEpochAndIndex) {
  uint64_t high = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    const uint64_t k = sample_key(1, 2, i);
    EXPECT_LT(k, uint64_t{1} << 63);
    high |= k;
    EXPECT_EQ(k, hash_key(1, 2, i) >> 1);
  }
  EXPECT_NE(high >> 62, 0u);  // the 63 bits are used
  EXPECT_NE(sample_key(1, 2, 3), sample_key(1, 3, 3));
  EXPECT_NE(position_key(1, 2, 3, 0), position_key(1, 2, 3, 1));
  EXPECT_LT(position_key(7, 8, 9, 10), uint64_t{1} << 63);
}

TEST(SampleFetcher, EverySampleSeesItsOwnKeyAndTheSeededState) {
  Fixture t;
  SampleFetcher f = t.fetcher(SampleFetcher::Seeding::kAlways);
  const PyRef got = t.fetch(f, "Data()", "[3, 1, 4]");
  // Each sample saw the position seeding leaves (624) and its key as torch's initial seed.
  EXPECT_EQ(repr(got.get()), "[(3, 624, " + std::to_string(sample_key(5, 2, 3)) + "), (1, 624, " +
                                 std::to_string(sample_key(5, 2, 1)) + "), (4, 624, " +
                                 std::to_string(sample_key(5, 2, 4)) + ")]");
}

TEST(SampleFetcher, AdaptiveChecksGeneratorsNoSampleDrawsFromAndRerunsAChunkThatDid) {
  Fixture t;
  SampleFetcher f = t.fetcher(SampleFetcher::Seeding::kAdaptive);
  t.fetch(f, "Data()", "list(range(64))");
  EXPECT_EQ(f.modes(), (std::vector<std::string>{"lazy", "lazy", "lazy"}));
  // Sample 70 draws from NumPy's generator while it is only checked: its chunk runs again with
  // the generator seeded, so that sample 70 draws from its own seeded state (position 624).
  const PyRef got = t.fetch(f, "Data(draws={70})", "[68, 69, 70, 71]");
  EXPECT_EQ(f.modes(), (std::vector<std::string>{"lazy", "seeded", "lazy"}));
  PyDict_SetItemString(t.ns.get(), "got", got.get());
  EXPECT_EQ(repr(eval(t.ns, "[s[1] for s in got]").get()), "[624, 624, 624, 624]");
  EXPECT_EQ(t.calls("68"), 2);
  EXPECT_EQ(t.calls("70"), 2);
  EXPECT_EQ(t.calls("72"), 0);
  t.fetch(f, "Data(draws={72})", "[72, 73]");  // seeded now: no second run
  EXPECT_EQ(t.calls("72"), 1);
}

TEST(SampleFetcher, GeneratorsLeftAloneAreNeverWrittenNorTheirInitialSeed) {
  Fixture t;
  SampleFetcher::Options o;
  o.seed = 5;
  o.seeding = SampleFetcher::Seeding::kAlways;
  o.seeder = t.seeder;
  o.leave_alone = {false, true, true};  // a worker_init_fn seeded numpy and torch itself
  SampleFetcher f(o);
  t.fake.torch.mt.seed = 12345;
  const PyRef got = t.fetch(f, "Data()", "[1, 2]");
  EXPECT_EQ(repr(got.get()), "[(1, 5, 12345), (2, 5, 12345)]");
  EXPECT_EQ(f.modes(), (std::vector<std::string>{"seeded", "off", "off"}));
  EXPECT_EQ(t.fake.py.index, 624);  // random is still seeded per sample
}

TEST(SampleFetcher, ANonIntegerIndexIsSeededFromItsPlaceInTheEpoch) {
  Fixture t;
  SampleFetcher f = t.fetcher(SampleFetcher::Seeding::kAlways);
  // Samples (0, 1) and (2, 3) with the keys of rows `first` and `first` + 1 of batch 7.
  auto keyed = [](uint64_t first) {
    return "[((0, 1), 624, " + std::to_string(position_key(5, 2, 7, first)) + "), ((2, 3), 624, " +
           std::to_string(position_key(5, 2, 7, first + 1)) + ")]";
  };
  EXPECT_EQ(repr(t.fetch(f, "Data()", "[[0, 1], [2, 3]]", 7).get()), keyed(0));
  // The same samples as rows 2 and 3, a part of the batch fetched alone: those rows' keys.
  EXPECT_EQ(repr(t.fetch(f, "Data()", "[[0, 1], [2, 3]]", 7, 2).get()), keyed(2));
}

TEST(SampleFetcher, StratifiedDrawsAreKeyedByTheirCycles) {
  Fixture t;
  SampleFetcher f = t.fetcher(SampleFetcher::Seeding::kAlways);
  // Sample 3 drawn three times in one epoch (an oversampled class): three cycles, three keys.
  const std::vector<uint64_t> cycles{4, 5, 6};
  const PyRef got =
      f.fetch(eval(t.ns, "Data()").get(), 2, eval(t.ns, "[3, 3, 3]").get(), 0, 0, cycles);
  EXPECT_EQ(repr(got.get()), "[(3, 624, " + std::to_string(sample_key(5, 4, 3)) + "), (3, 624, " +
                                 std::to_string(sample_key(5, 5, 3)) + "), (3, 624, " +
                                 std::to_string(sample_key(5, 6, 3)) + ")]");
  const std::vector<uint64_t> short_cycles{4};
  EXPECT_THROW(
      f.fetch(eval(t.ns, "Data()").get(), 2, eval(t.ns, "[3, 3]").get(), 0, 0, short_cycles),
      InvalidArgument);
}

TEST(SampleFetcher, AnErrorCarriesItsSampleIndex) {
  Fixture t;
  SampleFetcher f = t.fetcher(SampleFetcher::Seeding::kAdaptive);
  EXPECT_THROW(t.fetch(f, "Data(bad={4})", "[3, 4, 5]"), PythonError);
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  const PyRef v = PyRef::steal(value), ty = PyRef::steal(type), b = PyRef::steal(tb);
  EXPECT_EQ(repr(v.get()), "OSError('cannot read 4')");
  EXPECT_EQ(repr(PyRef::steal(PyObject_GetAttrString(v.get(), "_stoker_index")).get()), "4");
  EXPECT_EQ(t.calls("5"), 0);
}

TEST(SampleFetcher, SkipReplacesAFailedSampleByTheNativeLoadersRule) {
  Fixture t;
  SampleFetcher f = t.fetcher(SampleFetcher::Seeding::kAlways, /*skip=*/true);
  const uint64_t first = hash_key(5, 2, 4 * SampleFetcher::kSkipAttempts + 1) % 1000;
  const PyRef got = t.fetch(f, "Data(bad={4})", "[3, 4]");
  PyDict_SetItemString(t.ns.get(), "got", got.get());
  EXPECT_EQ(repr(eval(t.ns, "[s[0] for s in got]").get()), "[3, " + std::to_string(first) + "]");
  // ... seeded as itself
  EXPECT_EQ(repr(eval(t.ns, "got[1][2]").get()), std::to_string(sample_key(5, 2, first)));
  EXPECT_EQ(repr(f.take_skipped().get()), "[(4, 'OSError: cannot read 4')]");
  EXPECT_EQ(repr(f.take_skipped().get()), "[]");
}

TEST(SampleFetcher, SkipNamesTheSampleWhenNothingLoads) {
  Fixture t;
  SampleFetcher f = t.fetcher(SampleFetcher::Seeding::kOff, /*skip=*/true);
  EXPECT_THROW(t.fetch(f, "Data(bad=range(1000))", "[0]"), PythonError);
  EXPECT_EQ(take_error(),
            "RuntimeError: on_error=\"skip\": no readable replacement found after 16 attempts");
}

TEST(SampleFetcher, NeedsASeederToSeed) {
  SampleFetcher::Options o;
  o.seeding = SampleFetcher::Seeding::kAdaptive;
  EXPECT_THROW(SampleFetcher{o}, InvalidArgument);
  o.seeding = SampleFetcher::Seeding::kOff;
  EXPECT_NO_THROW(SampleFetcher{o});
}

}  // namespace
}  // namespace stoker::python
