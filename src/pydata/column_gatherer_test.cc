#include "stoker/pydata/column_gatherer.h"

#include <gtest/gtest.h>

#include "pydata/testing.h"

namespace stoker::python {
namespace {

using testing::eval;
using testing::repr;
using testing::run;
using testing::take_error;

// Samples {"x": Leaf(i), "pair": (i, "s<i>")}: one array leaf (type Leaf) and two object leaves;
// the structure as batch_structure.flatten describes sample 0.
constexpr const char* kSetup = R"py(
import collections
class Leaf:
    def __init__(self, v): self.v = v
    def __repr__(self): return f"Leaf({self.v})"
P = collections.namedtuple("P", "a b")
samples = [{"x": Leaf(i), "pair": (i, f"s{i}")} for i in range(3)]
structure = ("M", dict, ("x", "pair"), (("L", 0, None, ()), ("T", (("O", 0, int), ("O", 1, str)))))
array_types, object_types, np_dtypes = (Leaf,), (int, str), (None,)
)py";

PyRef gather(const PyRef& ns, const char* samples, const char* structure = "structure") {
  return gather_columns(eval(ns, structure).get(), eval(ns, samples).get(),
                        eval(ns, "array_types").get(), eval(ns, "object_types").get(),
                        eval(ns, "np_dtypes").get());
}

TEST(GatherColumns, GivesEachLeafAsAColumnInSampleOrder) {
  const PyRef ns = run(kSetup);
  const PyRef got = gather(ns, "samples");
  EXPECT_EQ(repr(got.get()), "([[Leaf(0), Leaf(1), Leaf(2)]], [[0, 1, 2], ['s0', 's1', 's2']])");
}

TEST(GatherColumns, NamedTuplesListsAndNestingKeepTheirOrder) {
  const PyRef ns = run(std::string(kSetup) + R"py(
nested = [P(Leaf(i), [i, (i * 2,)]) for i in range(2)]
nested_structure = ("N", P, (("L", 0, None, ()), ("S", list, (("O", 0, int), ("T", (("O", 1, int),))))))
object_types = (int, int)
)py");
  const PyRef got = gather(ns, "nested", "nested_structure");
  EXPECT_EQ(repr(got.get()), "([[Leaf(0), Leaf(1)]], [[0, 1], [0, 2]])");
}

TEST(GatherColumns, NoneWhenASampleDiffersInStructureTypeKeysOrLength) {
  const PyRef ns = run(kSetup);
  for (const char* other : {
           "samples + [{'x': Leaf(3), 'pair': (3.5, 's3')}]",   // a leaf of another type
           "samples + [{'x': Leaf(3), 'pair': [3, 's3']}]",     // a list where a tuple was
           "samples + [{'x': Leaf(3), 'pair': (3, 's3', 0)}]",  // a longer tuple
           "samples + [{'pair': (3, 's3'), 'x': Leaf(3)}]",     // the keys in another order
           "samples + [{'x': Leaf(3), 'other': (3, 's3')}]",    // another key
           "samples + [{'x': Leaf(3)}]",                        // a key missing
       }) {
    const PyRef got = gather(ns, other);
    EXPECT_EQ(got.get(), Py_None) << other;
  }
}

TEST(GatherColumns, ChecksNumpyLeavesDtype) {
  // An "A" leaf must also have sample 0's dtype (here any object with a dtype attribute).
  const PyRef ns = run(R"py(
class Arr:
    def __init__(self, dtype): self.dtype = dtype
    def __repr__(self): return f"Arr({self.dtype})"
structure = ("A", 0, "<f4", ())
array_types, object_types, np_dtypes = (Arr,), (), ("<f4",)
same, mixed = [Arr("<f4"), Arr("<f4")], [Arr("<f4"), Arr("<f8")]
)py");
  EXPECT_EQ(repr(gather(ns, "same").get()), "([[Arr(<f4), Arr(<f4)]], [])");
  EXPECT_EQ(gather(ns, "mixed").get(), Py_None);
}

TEST(GatherColumns, AMalformedStructureIsATypeError) {
  const PyRef ns = run(kSetup);
  EXPECT_THROW(gather(ns, "samples", "('Q', 0)"), PythonError);
  EXPECT_EQ(take_error(), "TypeError: gather_columns: malformed structure (an unknown tag)");
  EXPECT_THROW(gather(ns, "samples", "('L', 5, None, ())"), PythonError);
  EXPECT_EQ(take_error(), "TypeError: gather_columns: malformed structure (a leaf number)");
}

TEST(GatherColumns, AnExceptionFromASampleMappingPropagates) {
  const PyRef ns = run(std::string(kSetup) + R"py(
class Broken(dict):
    def __getitem__(self, k): raise KeyError("broken " + k)
broken = samples + [Broken({"x": Leaf(9), "pair": (9, "s9")})]
structure = ("M", Broken, ("x", "pair"), structure[3])
samples = [Broken(s) for s in samples]
)py");
  EXPECT_THROW(gather(ns, "samples"), PythonError);
  EXPECT_EQ(take_error(), "KeyError: 'broken x'");
}

}  // namespace
}  // namespace stoker::python
