// Per-sample seeding for Python datasets: the sample keys, the writer of the interpreter's global
// generators (GlobalSeeder) and the fetch loop that seeds and calls __getitem__ (SampleFetcher).
// The engine code is in src/pydata/ (global_seeder.h states the private layouts it relies on).
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bindings.h"
#include "pydata/global_seeder.h"
#include "pydata/sample_fetcher.h"
#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker::python {
namespace {

GlobalSeeder::Generator generator_named(std::string_view name) {
  if (name == "random") return GlobalSeeder::kPython;
  if (name == "numpy") return GlobalSeeder::kNumpy;
  if (name == "torch") return GlobalSeeder::kTorch;
  throw InvalidArgument("generator: \"random\", \"numpy\" or \"torch\"");
}

template <typename F>
auto python_errors(F&& f) {
  try {
    return f();
  } catch (const PythonError&) {
    throw nb::python_error();
  }
}

}  // namespace

void register_seeding(nb::module_& m) {
  m.def("hash_key", &hash_key, nb::arg("a"), nb::arg("b"), nb::arg("c"),
        "random.h's hash_key(a, b, c): 64 bits (on_error=\"skip\" draws replacements with it).");
  m.def("sample_key", &sample_key, nb::arg("seed"), nb::arg("epoch"), nb::arg("index"),
        "The 63-bit key of sample `index` of `epoch` (what torch.initial_seed() reports in it).");
  m.def("position_key", &position_key, nb::arg("seed"), nb::arg("epoch"), nb::arg("batch"),
        nb::arg("row"), "The key of a sample fetched by a non-integer index, from its place.");

  m.def(
      "mt19937_state",
      [](uint64_t key, std::string_view generator) {
        std::vector<uint32_t> words(624);
        expand_mt19937_state(GlobalSeeder::generator_key(generator_named(generator), key),
                             words.data());
        return words;
      },
      nb::arg("key"), nb::arg("generator"),
      "The 624-word MT19937 state a sample key gives `generator` (\"random\", \"numpy\" or "
      "\"torch\").");

  nb::class_<GlobalSeeder>(m, "GlobalSeeder",
                           "Writes the global generators' states in place "
                           "(src/pydata/global_seeder.h); made by rng_fields.py only.")
      .def(
          "__init__",
          [](GlobalSeeder* self, uintptr_t py_index, uintptr_t py_state, nb::dict py_dict,
             uintptr_t np_key, uintptr_t np_pos, uintptr_t np_has_gauss, uintptr_t np_gauss,
             uintptr_t torch_mt, uintptr_t torch_float_engaged, uintptr_t torch_double_engaged) {
            GeneratorFields f;
            f.py_index = reinterpret_cast<int*>(py_index);
            f.py_state = reinterpret_cast<uint32_t*>(py_state);
            f.py_dict = py_dict.ptr();
            f.np_key = reinterpret_cast<uint32_t*>(np_key);
            f.np_pos = reinterpret_cast<int*>(np_pos);
            f.np_has_gauss = reinterpret_cast<int*>(np_has_gauss);
            f.np_gauss = reinterpret_cast<double*>(np_gauss);
            f.torch_mt = reinterpret_cast<TorchMt*>(torch_mt);
            f.torch_float_engaged = reinterpret_cast<bool*>(torch_float_engaged);
            f.torch_double_engaged = reinterpret_cast<bool*>(torch_double_engaged);
            python_errors([&] { return new (self) GlobalSeeder(f); });
          },
          nb::arg("py_index"), nb::arg("py_state"), nb::arg("py_dict"), nb::arg("np_key"),
          nb::arg("np_pos"), nb::arg("np_has_gauss"), nb::arg("np_gauss"), nb::arg("torch_mt"),
          nb::arg("torch_float_engaged"), nb::arg("torch_double_engaged"))
      .def(
          "seed",
          [](GlobalSeeder& s, uint64_t key, std::vector<std::string> generators) {
            python_errors([&] {
              for (const auto& g : generators) s.seed_one(generator_named(g), key);
              return 0;
            });
          },
          nb::arg("key"), nb::arg("generators"),
          "Seeds the named generators for the sample of `key`.")
      .def("save",
           [](const GlobalSeeder& s) {
             return nb::steal(python_errors([&] { return s.save(); }).release());
           })
      .def(
          "restore",
          [](GlobalSeeder& s, nb::handle saved) {
            python_errors([&] {
              s.restore(saved.ptr());
              return 0;
            });
          },
          nb::arg("saved"));

  nb::class_<SampleFetcher>(m, "SampleFetcher",
                            "Runs __getitem__ for chunks of samples, each seeded "
                            "(src/pydata/sample_fetcher.h).")
      .def(
          "__init__",
          [](SampleFetcher* self, uint64_t seed, std::string_view seeding,
             std::shared_ptr<GlobalSeeder> seeder, nb::object slow_seed,
             std::array<bool, 3> leave_alone, bool skip, uint64_t size) {
            SampleFetcher::Options o;
            o.seed = seed;
            if (seeding == "off") {
              o.seeding = SampleFetcher::Seeding::kOff;
            } else if (seeding == "adaptive") {
              o.seeding = SampleFetcher::Seeding::kAdaptive;
            } else if (seeding == "always") {
              o.seeding = SampleFetcher::Seeding::kAlways;
            } else {
              throw InvalidArgument("SampleFetcher: seeding must be off, adaptive or always");
            }
            o.seeder = std::move(seeder);
            if (!slow_seed.is_none()) o.slow_seed = PyRef::borrow(slow_seed.ptr());
            o.leave_alone = leave_alone;
            o.skip = skip;
            o.size = size;
            python_errors([&] { return new (self) SampleFetcher(std::move(o)); });
          },
          nb::arg("seed"), nb::arg("seeding"), nb::arg("seeder").none(),
          nb::arg("slow_seed").none(), nb::arg("leave_alone"), nb::arg("skip") = false,
          nb::arg("size") = 0)
      .def(
          "fetch",
          [](SampleFetcher& f, nb::handle dataset, uint64_t epoch, nb::handle indices,
             uint64_t batch, uint64_t first_row, std::optional<std::vector<uint64_t>> cycles) {
            return nb::steal(python_errors([&] {
                               return f.fetch(dataset.ptr(), epoch, indices.ptr(), batch, first_row,
                                              cycles ? std::span<const uint64_t>(*cycles)
                                                     : std::span<const uint64_t>());
                             }).release());
          },
          nb::arg("dataset"), nb::arg("epoch"), nb::arg("indices"), nb::arg("batch") = 0,
          nb::arg("first_row") = 0, nb::arg("cycles").none() = nb::none(),
          "[dataset[i] for i in indices], each with the global generators seeded for its "
          "sample: `indices` are the rows from `first_row` on of batch `batch`; `cycles` (one a "
          "sample) key the draws of a stratified order instead of the epoch.")
      .def("take_skipped",
           [](SampleFetcher& f) {
             return nb::steal(python_errors([&] { return f.take_skipped(); }).release());
           })
      .def_prop_ro("modes", &SampleFetcher::modes);
}

}  // namespace stoker::python
