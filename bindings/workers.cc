// What the Python-dataset front (python/stoker/workers.py) needs from the engine: the epoch order
// (so a Python dataset visits samples exactly as a native one does), per-sample seeding of the
// interpreter's global generators, the check that a batch's samples share one structure (and
// their leaves as columns), and a pool of batch buffers in shared memory, with claim counters,
// that worker processes and the consumer write and the consumer exports without a copy.
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <sys/mman.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "bindings.h"
#include "stoker/batch_pool.h"
#include "stoker/errors.h"
#include "stoker/order.h"
#include "stoker/random.h"
#include "stoker/shared_arena.h"

namespace stoker::python {
namespace {

// One buffer of a SharedPool, held by the consumer while a worker fills it.
struct Lease {
  Buffer buffer;
  size_t offset = 0;
};

class SharedPool {
 public:
  static constexpr size_t kControlBytes = 65536;

  SharedPool(size_t buffer_bytes, size_t budget_bytes)
      : arena_(SharedArena::create(kControlBytes + budget_bytes / buffer_bytes *
                                                       ((buffer_bytes + 4095) / 4096) * 4096)),
        control_(reinterpret_cast<uint64_t*>(arena_->carve(kControlBytes))),
        pool_(BatchPool::create_shared(buffer_bytes, budget_bytes, arena_)) {}

  // Counters in the shared control pages that every process forked after the pool sees: the
  // consumer resets counter c for a batch, then it and a worker claim the batch's samples with
  // claim(c, count): each call returns the first of `count` numbers no one else got.
  static constexpr size_t kCounters = kControlBytes / sizeof(uint64_t);
  void reset_claims(size_t c) { std::atomic_ref<uint64_t>(control_[counter(c)]).store(0); }
  uint64_t claim(size_t c, uint64_t count) {
    return std::atomic_ref<uint64_t>(control_[counter(c)]).fetch_add(count);
  }

  // Drops this process's mapping of the whole pages in arena bytes [offset, offset + bytes) (the
  // data stays in the shared memory for the other processes): a worker calls it after writing a
  // chunk of a batch, so the pages do not count in every worker that ever wrote the buffer.
  void unmap_pages(size_t offset, size_t bytes) const {
    if (offset + bytes <= arena_->size()) drop_pages(arena_->base() + offset, bytes);
  }

  // A buffer for the consumer. When its last owner here dies (the lease and every array
  // viewing it), this process drops its mapping of the buffer's pages, then the buffer returns
  // to the pool: its pages count in the consumer's RSS only while a batch in it is alive.
  std::shared_ptr<Lease> acquire(int64_t timeout_ms) {
    Buffer b = pool_->acquire_for(std::stop_token(), std::chrono::milliseconds(timeout_ms));
    if (!b) return nullptr;
    auto lease = std::make_shared<Lease>();
    lease->offset = arena_->offset_of(b.get());
    std::byte* data = b.get();
    lease->buffer = Buffer(data, [inner = std::move(b), bytes = pool_->buffer_bytes()](
                                     std::byte* p) { drop_pages(p, bytes); });
    return lease;
  }

  // One uint8 array per (offset, nbytes) region of the lease's buffer; all share one owner that
  // returns the buffer to the pool when the last of them dies.
  nb::list view(const Lease& lease, const std::vector<std::pair<size_t, size_t>>& regions,
                bool torch) const {
    for (const auto& [offset, bytes] : regions)
      if (offset + bytes > pool_->buffer_bytes())
        throw InvalidArgument("region outside the batch buffer");
    nb::capsule owner(new Buffer(lease.buffer),
                      [](void* p) noexcept { delete static_cast<Buffer*>(p); });
    nb::list out;
    for (const auto& [offset, bytes] : regions) {
      size_t shape[1] = {bytes};
      std::byte* data = lease.buffer.get() + offset;
      if (torch)
        out.append(nb::ndarray<nb::pytorch, uint8_t>(data, 1, shape, owner).cast());
      else
        out.append(nb::ndarray<nb::numpy, uint8_t>(data, 1, shape, owner).cast());
    }
    return out;
  }

  // The whole arena as one writable uint8 array (for worker processes, which inherit the mapping).
  nb::object arena_array(bool torch) const {
    size_t shape[1] = {arena_->size()};
    nb::capsule owner(new std::shared_ptr<SharedArena>(arena_), [](void* p) noexcept {
      delete static_cast<std::shared_ptr<SharedArena>*>(p);
    });
    if (torch) return nb::ndarray<nb::pytorch, uint8_t>(arena_->base(), 1, shape, owner).cast();
    return nb::ndarray<nb::numpy, uint8_t>(arena_->base(), 1, shape, owner).cast();
  }

  const BatchPool& pool() const { return *pool_; }

 private:
  static size_t counter(size_t c) {
    if (c >= kCounters) throw InvalidArgument("claim counter out of range");
    return c;
  }

  // Drops this process's mapping of the whole pages inside [p, p + bytes).
  static void drop_pages(std::byte* p, size_t bytes) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    const uintptr_t start = (at + 4095) / 4096 * 4096;
    const uintptr_t end = (at + bytes) / 4096 * 4096;
    if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED);
  }

  std::shared_ptr<SharedArena> arena_;
  uint64_t* control_;
  std::shared_ptr<BatchPool> pool_;
};

// Seeds the interpreter's global generators for one sample by writing their states in place:
// Python's `random`, NumPy's legacy `np.random` and torch's default CPU generator (all MT19937)
// get states expanded from keys derived from the sample key. The setstate()/set_state() calls
// that do the same cost ~8 us a sample, torch's manual_seed alone ~1.1 us; this ~0.6 us. The
// field addresses come from workers.py, which locates them once and checks them against
// getstate()/get_state(); it falls back to those calls when they cannot be verified.
class GlobalSeeder {
 public:
  // torch's at::mt19937_data_pod (ATen/core/MT19937RNGEngine.h), the engine of CPUGeneratorImpl.
  struct TorchMt {
    uint64_t seed;
    int32_t left;
    bool seeded;
    uint32_t next;
    uint32_t state[624];
  };
  static_assert(offsetof(TorchMt, left) == 8 && offsetof(TorchMt, next) == 16 &&
                offsetof(TorchMt, state) == 20);

  GlobalSeeder(uintptr_t py_index, uintptr_t py_state, nb::object py_instance, uintptr_t np_key,
               uintptr_t np_pos, uintptr_t np_has_gauss, uintptr_t np_gauss, uintptr_t torch_mt,
               uintptr_t torch_float_engaged, uintptr_t torch_double_engaged)
      : py_index_(reinterpret_cast<int*>(py_index)),
        py_state_(reinterpret_cast<uint32_t*>(py_state)),
        py_instance_(std::move(py_instance)),
        np_key_(reinterpret_cast<uint32_t*>(np_key)),
        np_pos_(reinterpret_cast<int*>(np_pos)),
        np_has_gauss_(reinterpret_cast<int*>(np_has_gauss)),
        np_gauss_(reinterpret_cast<double*>(np_gauss)),
        torch_mt_(reinterpret_cast<TorchMt*>(torch_mt)),
        torch_float_engaged_(reinterpret_cast<bool*>(torch_float_engaged)),
        torch_double_engaged_(reinterpret_cast<bool*>(torch_double_engaged)),
        fields_{{{py_index_, sizeof(int)},
                 {py_state_, 624 * 4},
                 {np_key_, 624 * 4},
                 {np_pos_, sizeof(int)},
                 {np_has_gauss_, sizeof(int)},
                 {np_gauss_, sizeof(double)},
                 {torch_mt_, sizeof(TorchMt)},
                 // std::optional<float> / <double>: the value, then the engaged flag
                 {torch_float_engaged_ - sizeof(float), sizeof(float) + 1},
                 {torch_double_engaged_ - sizeof(double), sizeof(double) + 1}}} {}

  // The keys each generator's state derives from: distinct, so the streams differ.
  static uint64_t python_key(uint64_t key) { return mix64(key ^ 0x5851f42d4c957f2dULL); }
  static uint64_t numpy_key(uint64_t key) { return mix64(key ^ 0x14057b7ef767814fULL); }
  static uint64_t torch_key(uint64_t key) { return mix64(key ^ 0x2545f4914f6cdd1dULL); }

  // Seeds for sample `index` of `epoch`: key = hash_key(seed, epoch, index). torch's generator
  // reports `key` as its initial_seed(); its state is not manual_seed(key)'s (that chains 624
  // dependent multiplies) but expanded like the others, with no cached normals.
  // REQUIRES: the GIL (the generators are the interpreter's; torch's lock is not taken, as no
  // other thread may draw from a generator while a sample is seeded).
  void seed(uint64_t seed, uint64_t epoch, uint64_t index) {
    const uint64_t key = hash_key(seed, epoch, index);
    expand_mt19937_state(python_key(key), py_state_);
    *py_index_ = 624;  // the next draw regenerates the whole state
    py_instance_.attr("gauss_next") = nb::none();
    expand_mt19937_state(numpy_key(key), np_key_);
    *np_pos_ = 624;
    *np_has_gauss_ = 0;
    *np_gauss_ = 0.0;
    expand_mt19937_state(torch_key(key), torch_mt_->state);
    torch_mt_->seed = key;
    torch_mt_->left = 1;  // the next draw regenerates the whole state
    torch_mt_->seeded = true;
    torch_mt_->next = 0;
    *torch_float_engaged_ = false;
    *torch_double_engaged_ = false;
  }

  // The three generators' states, for restore(): the fields seed() writes, as bytes, and
  // `random`'s cached gauss_next. ~1 us; getstate()/setstate() of the three ~70 us.
  // REQUIRES: the GIL.
  nb::tuple save() const {
    std::string blob;
    for (const auto& [at, bytes] : fields_) blob.append(static_cast<const char*>(at), bytes);
    return nb::make_tuple(nb::bytes(blob.data(), blob.size()), py_instance_.attr("gauss_next"));
  }

  // Puts back the states save() took. REQUIRES: the GIL; `saved` from this seeder's save().
  void restore(const nb::tuple& saved) {
    const nb::bytes blob = nb::cast<nb::bytes>(saved[0]);
    size_t total = 0;
    for (const auto& field : fields_) total += field.second;
    if (blob.size() != total) throw InvalidArgument("not a state from this seeder's save()");
    const char* from = blob.c_str();
    for (const auto& [at, bytes] : fields_) {
      std::memcpy(at, from, bytes);
      from += bytes;
    }
    py_instance_.attr("gauss_next") = saved[1];
  }

 private:
  int* py_index_;
  uint32_t* py_state_;
  nb::object py_instance_;
  uint32_t* np_key_;
  int* np_pos_;
  int* np_has_gauss_;
  double* np_gauss_;
  TorchMt* torch_mt_;
  bool* torch_float_engaged_;
  bool* torch_double_engaged_;
  std::array<std::pair<void*, size_t>, 9> fields_;  // what save() and restore() copy
};

// Checks that `obj` has the structure `node` (a node of workers.flatten's tree, built from sample
// 0 of a batch) and appends its leaves to the columns: array leaf k to array_cols[k], object leaf
// k to object_cols[k]. Types must match sample 0's exactly (array leaves: `array_types[k]`, and
// the same dtype for NumPy arrays; shapes are left to torch.stack/np.stack, which raise exactly
// as default_collate would). False at the first difference; the columns are then partial.
bool gather(nb::handle node, nb::handle obj, const nb::tuple& array_types,
            const nb::tuple& object_types, const nb::list& array_cols, const nb::list& object_cols,
            const nb::tuple& np_dtypes) {
  const nb::tuple n = nb::borrow<nb::tuple>(node);
  const std::string_view tag = nb::cast<std::string_view>(n[0]);
  const nb::handle type = obj.type();
  switch (tag[0]) {
    case 'L':
    case 'A': {
      const size_t k = nb::cast<size_t>(n[1]);
      if (!type.is(array_types[k])) return false;
      if (tag[0] == 'A' && !obj.attr("dtype").equal(np_dtypes[k])) return false;
      nb::borrow<nb::list>(array_cols[k]).append(obj);
      return true;
    }
    case 'O': {
      const size_t k = nb::cast<size_t>(n[1]);
      if (!type.is(object_types[k])) return false;
      nb::borrow<nb::list>(object_cols[k]).append(obj);
      return true;
    }
    case 'M': {  // ("M", type, keys, children)
      if (!type.is(n[1])) return false;
      const nb::tuple keys = nb::borrow<nb::tuple>(n[2]);
      const nb::tuple children = nb::borrow<nb::tuple>(n[3]);
      if (nb::len(obj) != keys.size()) return false;
      size_t i = 0;
      for (nb::handle key : obj.attr("keys")()) {
        if (i >= keys.size() || !key.equal(keys[i])) return false;
        ++i;
      }
      for (i = 0; i < keys.size(); ++i)
        if (!gather(children[i], obj[keys[i]], array_types, object_types, array_cols, object_cols,
                    np_dtypes))
          return false;
      return true;
    }
    case 'N':    // ("N", type, children)
    case 'S':    // ("S", type, children)
    case 'T': {  // ("T", children)
      const bool typed = tag[0] != 'T';
      if (typed ? !type.is(n[1]) : !type.is(reinterpret_cast<PyObject*>(&PyTuple_Type)))
        return false;
      const nb::tuple children = nb::borrow<nb::tuple>(n[typed ? 2 : 1]);
      if (nb::len(obj) != children.size()) return false;
      for (size_t i = 0; i < children.size(); ++i)
        if (!gather(children[i], obj[i], array_types, object_types, array_cols, object_cols,
                    np_dtypes))
          return false;
      return true;
    }
    default:
      throw InvalidArgument("gather_columns: unknown structure tag");
  }
}

}  // namespace

void register_workers(nb::module_& m) {
  m.def("sample_seed", &hash_key, nb::arg("seed"), nb::arg("epoch"), nb::arg("index"),
        "The per-sample key of (seed, epoch, index): random.h's hash_key.");

  m.def(
      "gather_columns",
      [](nb::handle structure, const nb::sequence& samples, const nb::tuple& array_types,
         const nb::tuple& object_types, const nb::tuple& np_dtypes) -> nb::object {
        nb::list array_cols, object_cols;
        for (size_t k = 0; k < array_types.size(); ++k) array_cols.append(nb::list());
        for (size_t k = 0; k < object_types.size(); ++k) object_cols.append(nb::list());
        for (nb::handle sample : samples)
          if (!gather(structure, sample, array_types, object_types, array_cols, object_cols,
                      np_dtypes))
            return nb::none();
        return nb::make_tuple(array_cols, object_cols);
      },
      nb::arg("structure"), nb::arg("samples"), nb::arg("array_types"), nb::arg("object_types"),
      nb::arg("np_dtypes"),
      "The batch's leaves as columns (array columns, object columns) when every sample has "
      "`structure` (workers.flatten's tree of sample 0) with leaves of the same types, else "
      "None. np_dtypes[k]: the dtype NumPy leaf k must have (None for tensors).");

  m.def(
      "mt19937_state",
      [](uint64_t key, const std::string& generator) {
        uint64_t k = generator == "random"  ? GlobalSeeder::python_key(key)
                     : generator == "numpy" ? GlobalSeeder::numpy_key(key)
                     : generator == "torch"
                         ? GlobalSeeder::torch_key(key)
                         : throw InvalidArgument("generator: random, numpy or torch");
        std::vector<uint32_t> words(624);
        expand_mt19937_state(k, words.data());
        return words;
      },
      nb::arg("key"), nb::arg("generator"),
      "The 624-word MT19937 state GlobalSeeder gives `generator` (\"random\", \"numpy\" or "
      "\"torch\") for a sample key.");

  nb::class_<GlobalSeeder>(m, "GlobalSeeder")
      .def(nb::init<uintptr_t, uintptr_t, nb::object, uintptr_t, uintptr_t, uintptr_t, uintptr_t,
                    uintptr_t, uintptr_t, uintptr_t>(),
           nb::arg("py_index"), nb::arg("py_state"), nb::arg("py_instance"), nb::arg("np_key"),
           nb::arg("np_pos"), nb::arg("np_has_gauss"), nb::arg("np_gauss"), nb::arg("torch_mt"),
           nb::arg("torch_float_engaged"), nb::arg("torch_double_engaged"))
      .def("seed", &GlobalSeeder::seed, nb::arg("seed"), nb::arg("epoch"), nb::arg("index"))
      .def("save", &GlobalSeeder::save)
      .def("restore", &GlobalSeeder::restore, nb::arg("saved"));

  m.def(
      "plan_num_batches",
      [](uint64_t n, uint64_t batch_size, bool drop_last, uint64_t rank, uint64_t world_size) {
        return BatchPlan(n, batch_size, drop_last, rank, world_size).num_batches();
      },
      nb::arg("n"), nb::arg("batch_size"), nb::arg("drop_last"), nb::arg("rank"),
      nb::arg("world_size"));

  m.def(
      "batch_indices",
      [](uint64_t n, uint64_t batch_size, bool shuffle, uint64_t seed, uint64_t epoch,
         bool drop_last, uint64_t rank, uint64_t world_size, uint64_t batch) {
        const BatchPlan plan(n, batch_size, drop_last, rank, world_size);
        if (batch >= plan.num_batches()) throw InvalidArgument("batch number out of range");
        const EpochOrder order(n, shuffle, seed, epoch);
        std::vector<uint64_t> out;
        const uint64_t first = batch * batch_size;
        for (uint64_t k = first; k < first + plan.batch_length(batch); ++k)
          out.push_back(order[plan.global_position(k)]);
        return out;
      },
      nb::arg("n"), nb::arg("batch_size"), nb::arg("shuffle"), nb::arg("seed"), nb::arg("epoch"),
      nb::arg("drop_last"), nb::arg("rank"), nb::arg("world_size"), nb::arg("batch"),
      "The sample indices of batch `batch` of an epoch, exactly as the native loader visits them.");

  nb::class_<Lease>(m, "Lease").def_ro("offset", &Lease::offset);

  nb::class_<SharedPool>(m, "SharedPool")
      .def(nb::init<size_t, size_t>(), nb::arg("buffer_bytes"), nb::arg("budget_bytes"))
      .def("acquire", &SharedPool::acquire, nb::arg("timeout_ms"),
           nb::call_guard<nb::gil_scoped_release>(),
           "A free buffer, or None after timeout_ms milliseconds.")
      .def("reset_claims", &SharedPool::reset_claims, nb::arg("counter"))
      .def("claim", &SharedPool::claim, nb::arg("counter"), nb::arg("count"),
           "The first of the next `count` unclaimed numbers of `counter` since its reset.")
      .def_prop_ro_static("counters", [](nb::handle) { return SharedPool::kCounters; })
      .def("unmap_pages", &SharedPool::unmap_pages, nb::arg("offset"), nb::arg("bytes"))
      .def("view", &SharedPool::view, nb::arg("lease"), nb::arg("regions"), nb::arg("torch"))
      .def("arena_array", &SharedPool::arena_array, nb::arg("torch"))
      .def_prop_ro("buffer_bytes", [](const SharedPool& p) { return p.pool().buffer_bytes(); })
      .def_prop_ro("capacity", [](const SharedPool& p) { return p.pool().capacity(); })
      .def_prop_ro("bytes_allocated",
                   [](const SharedPool& p) { return p.pool().bytes_allocated(); })
      .def_prop_ro("peak_bytes_allocated",
                   [](const SharedPool& p) { return p.pool().peak_bytes_allocated(); });
}

}  // namespace stoker::python
