// The Python-dataset wing (stoker._native.pydata): what the Python-dataset front (python/stoker/)
// needs from the engine code in src/pydata/: the column check of a batch's samples, the batch
// buffers in shared memory, LEAF_ALIGNMENT, and per-sample seeding: the sample keys, the writer
// of the interpreter's global generators (GlobalSeeder) and the fetch loop that seeds and calls
// __getitem__ (SampleFetcher); global_seeder.h states the private layouts it relies on.
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bindings.h"
#include "stoker/shared_arena.h"
#include "stoker/pydata/column_gatherer.h"
#include "stoker/pydata/global_seeder.h"
#include "stoker/pydata/sample_fetcher.h"
#include "stoker/pydata/shared_pool.h"
#include "stoker/errors.h"
#include "stoker/engine.h"
#include "stoker/random.h"

namespace stoker::python {
namespace {

// One uint8 array over `bytes` at `data`, owned by `owner` (a capsule keeping the memory alive).
nb::object byte_array(std::byte* data, size_t bytes, nb::handle owner, bool torch) {
  size_t shape[1] = {bytes};
  auto* p = reinterpret_cast<uint8_t*>(data);
  if (torch) return nb::ndarray<nb::pytorch, uint8_t>(p, 1, shape, owner).cast();
  return nb::ndarray<nb::numpy, uint8_t>(p, 1, shape, owner).cast();
}

// One uint8 array per (offset, nbytes) region of the lease's buffer; all share one owner that
// returns the buffer to the pool when the last of them dies.
nb::list lease_views(const SharedPool& pool, const Lease& lease,
                     const std::vector<std::pair<size_t, size_t>>& regions, bool torch) {
  for (const auto& [offset, bytes] : regions)
    if (offset > pool.pool().buffer_bytes() || bytes > pool.pool().buffer_bytes() - offset)
      throw InvalidArgument("region outside the batch buffer");
  // The owner of the views: when the last of them dies, a pinned buffer is fenced on the streams
  // that may still copy from it (gpu.cc) before it can return to the pool.
  struct Owner {
    Buffer buffer;
    std::shared_ptr<BatchPool> pool;
  };
  nb::capsule owner(new Owner{lease.buffer, pool.shared_pool()}, [](void* p) noexcept {
    auto* o = static_cast<Owner*>(p);
    fence_released_buffer(*o->pool, o->buffer.get());
    delete o;
  });
  nb::list out;
  for (const auto& [offset, bytes] : regions)
    out.append(byte_array(lease.buffer.get() + offset, bytes, owner, torch));
  return out;
}

// The whole arena as one writable uint8 array (what a worker writes batches into).
nb::object arena_array(const std::shared_ptr<SharedArena>& arena, bool torch) {
  nb::capsule owner(new std::shared_ptr<SharedArena>(arena),
                    [](void* p) noexcept { delete static_cast<std::shared_ptr<SharedArena>*>(p); });
  return byte_array(arena->base(), arena->size(), owner, torch);
}

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

void register_pydata(nb::module_& m) {
  m.attr("LEAF_ALIGNMENT") = kLeafAlignment;

  m.def(
      "gather_columns",
      [](nb::handle structure, nb::handle samples, nb::handle array_types, nb::handle object_types,
         nb::handle np_dtypes) -> nb::object {
        try {
          return nb::steal(gather_columns(structure.ptr(), samples.ptr(), array_types.ptr(),
                                          object_types.ptr(), np_dtypes.ptr())
                               .release());
        } catch (const PythonError&) {
          throw nb::python_error();
        }
      },
      nb::arg("structure"), nb::arg("samples"), nb::arg("array_types"), nb::arg("object_types"),
      nb::arg("np_dtypes"),
      "(array columns, object columns) of a batch whose samples all have `structure` "
      "(batch_structure.flatten's tree of sample 0) with leaves of the same types, else None "
      "(stoker/pydata/column_gatherer.h).");

  nb::class_<SharedArena>(m, "SharedArena",
                          "Shared memory for batches: one memfd (stoker/shared_arena.h).")
      .def_static(
          "attach", [](int fd) { return SharedArena::attach(fd); }, nb::arg("fd"),
          "Maps the arena of another process's memfd `fd` (this arena owns and closes it).")
      .def_prop_ro("fd", &SharedArena::fd)
      .def_prop_ro("size", &SharedArena::size)
      .def(
          "array",
          [](const std::shared_ptr<SharedArena>& a, bool torch) { return arena_array(a, torch); },
          nb::arg("torch"), "The whole arena as one writable uint8 tensor (or NumPy array).")
      .def("drop_pages", &SharedArena::drop_pages, nb::arg("offset"), nb::arg("bytes"),
           "Drops this process's mapping of the whole pages in [offset, offset + bytes).");

  nb::class_<Lease>(m, "Lease").def_ro("offset", &Lease::offset);

  nb::class_<SharedPool>(m, "SharedPool",
                         "Batch buffers carved from a SharedArena (stoker/pydata/shared_pool.h).")
      .def(nb::init<size_t, size_t, bool>(), nb::arg("buffer_bytes"), nb::arg("budget_bytes"),
           nb::arg("pinned") = false)
      .def(
          "acquire",
          [](SharedPool& p, int64_t timeout_ms) {
            return p.acquire(std::chrono::milliseconds(timeout_ms));
          },
          nb::arg("timeout_ms"), nb::call_guard<nb::gil_scoped_release>(),
          "A free buffer, or None after timeout_ms milliseconds.")
      .def(
          "view",
          [](const SharedPool& p, const Lease& lease,
             const std::vector<std::pair<size_t, size_t>>& regions,
             bool torch) { return lease_views(p, lease, regions, torch); },
          nb::arg("lease"), nb::arg("regions"), nb::arg("torch"),
          "uint8 arrays over (offset, nbytes) regions of the lease's buffer, without a copy; "
          "the buffer returns to the pool when the last of them (and the lease) dies.")
      .def_prop_ro("arena", [](const SharedPool& p) { return p.arena(); })
      .def_prop_ro("buffer_bytes", [](const SharedPool& p) { return p.pool().buffer_bytes(); })
      .def_prop_ro("capacity", [](const SharedPool& p) { return p.pool().capacity(); })
      .def_prop_ro("bytes_allocated",
                   [](const SharedPool& p) { return p.pool().bytes_allocated(); })
      .def_prop_ro("peak_bytes_allocated",
                   [](const SharedPool& p) { return p.pool().peak_bytes_allocated(); })
      .def_prop_ro("pinned", &SharedPool::pinned)
      .def_prop_ro("pinned_bytes", [](const SharedPool& p) { return p.pool().pinned_bytes(); })
      .def_prop_ro("fenced_buffers",
                   [](const SharedPool& p) { return p.pool().fenced_buffers(); });

  m.def("sample_key", &sample_key, nb::arg("seed"), nb::arg("epoch"), nb::arg("index"),
        "The 63-bit key of sample `index` of `epoch` (what torch.initial_seed() reports in it).");
  // Sample keys and worker seeds are 63-bit: torch.initial_seed() reports them in an int64.
  m.attr("SEED_MASK") = kSeedMask;
  // prefetch_factor="auto": the depth it starts at, and 1 for batches above SMALL_BATCH_BYTES.
  m.attr("DEFAULT_PREFETCH_FACTOR") = kDefaultPrefetchFactor;
  m.attr("SMALL_BATCH_BYTES") = kSmallBatchBytes;
  // The batch tree's tags by name (stoker/pydata/column_gatherer.h defines the tree).
  nb::dict tree_tags;
  for (const auto& [name, tag] : tree_tag::kAll) tree_tags[name] = nb::str(&tag, 1);
  m.attr("TREE_TAGS") = tree_tags;

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
                           "(stoker/pydata/global_seeder.h); made by rng_fields.py only.")
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
                            "(stoker/pydata/sample_fetcher.h).")
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
