// Per-sample seeding of the interpreter's global generators (GlobalSeeder) and the loop that
// runs a Python dataset's __getitem__ for a chunk of samples with them seeded (SampleFetcher,
// used by python/stoker/workers.py's Producer): both run once a sample, so both are native.
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "bindings.h"
#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker::python {
namespace {

// Seeds the interpreter's global generators for one sample by writing their states in place:
// Python's `random`, NumPy's legacy `np.random` and torch's default CPU generator (all MT19937)
// get states expanded from keys derived from the sample key. The setstate()/set_state() calls
// that do the same cost ~8 us a sample, torch's manual_seed alone ~1.1 us; this ~0.5 us. The
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
        py_dict_(py_instance_.attr("__dict__")),
        gauss_next_(nb::str("gauss_next")),
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

  enum Generator : int { kPython, kNumpy, kTorch, kGenerators };

  // Seeds for sample `index` of `epoch`: key = hash_key(seed, epoch, index). torch's generator
  // reports `key` as its initial_seed(); its state is not manual_seed(key)'s (that chains 624
  // dependent multiplies) but expanded like the others, with no cached normals.
  // REQUIRES: the GIL (the generators are the interpreter's; torch's lock is not taken, as no
  // other thread may draw from a generator while a sample is seeded).
  void seed(uint64_t seed, uint64_t epoch, uint64_t index) {
    const uint64_t key = hash_key(seed, epoch, index);
    for (int g = 0; g < kGenerators; ++g) seed_one(static_cast<Generator>(g), key);
  }

  // Seeds generator g for the sample of `key`. REQUIRES: the GIL.
  void seed_one(Generator g, uint64_t key) {
    switch (g) {
      case kPython:
        expand_mt19937_state(python_key(key), py_state_);
        *py_index_ = 624;  // the next draw regenerates the whole state
        if (PyDict_SetItem(py_dict_.ptr(), gauss_next_.ptr(), Py_None) != 0)
          throw nb::python_error();
        return;
      case kNumpy:
        expand_mt19937_state(numpy_key(key), np_key_);
        *np_pos_ = 624;
        *np_has_gauss_ = 0;
        *np_gauss_ = 0.0;
        return;
      default:
        expand_mt19937_state(torch_key(key), torch_mt_->state);
        torch_mt_->left = 1;  // the next draw regenerates the whole state
        torch_mt_->seeded = true;
        torch_mt_->next = 0;
        *torch_float_engaged_ = false;
        *torch_double_engaged_ = false;
        set_torch_initial_seed(key);
    }
  }

  // What torch.initial_seed() reports, without touching the generator's state.
  void set_torch_initial_seed(uint64_t key) { torch_mt_->seed = key; }

  // What a draw, a seed or a setstate() changes in generator g: its position in the state, two
  // state words next to it (a draw past the end regenerates all 624; these two are then equal
  // with odds of 2^-64) and its cached normal. ~30 ns for the three.
  struct Print {
    int64_t position;
    uint64_t words;
    uintptr_t cached;
    bool operator==(const Print&) const = default;
  };
  // REQUIRES: the GIL.
  Print print(Generator g) const {
    switch (g) {
      case kPython:  // the index is just before the state words
        return {*py_index_, py_state_[0] | uint64_t{py_state_[1]} << 32,
                reinterpret_cast<uintptr_t>(
                    PyDict_GetItemWithError(py_dict_.ptr(), gauss_next_.ptr()))};
      case kNumpy:  // the position is just after them
        return {*np_pos_, np_key_[622] | uint64_t{np_key_[623]} << 32,
                static_cast<uintptr_t>(*np_has_gauss_)};
      default:
        return {int64_t{torch_mt_->left} << 32 | torch_mt_->next,
                torch_mt_->state[0] | uint64_t{torch_mt_->state[1]} << 32,
                uintptr_t{*torch_float_engaged_} | uintptr_t{*torch_double_engaged_} << 1};
    }
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
  nb::object py_dict_;  // py_instance_.__dict__, which holds `random`'s cached gauss_next
  nb::str gauss_next_;
  uint32_t* np_key_;
  int* np_pos_;
  int* np_has_gauss_;
  double* np_gauss_;
  TorchMt* torch_mt_;
  bool* torch_float_engaged_;
  bool* torch_double_engaged_;
  std::array<std::pair<void*, size_t>, 9> fields_;  // what save() and restore() copy
};

// Runs dataset[index] for the indices of a chunk, each with the global generators seeded for
// its sample by `seeder` (or by calling slow_seed(seed, epoch, index) where the generators'
// fields could not be located). Modes:
// - "always": every generator is seeded before every sample.
// - "adaptive": every generator is seeded before each of the first kProbeSamples samples. One that
//   none of those drew from is then no longer written (~0.2 us a generator and sample), but
//   checked at the end of each chunk: when a sample's __getitem__ changed it (a draw, a seed, a
//   setstate()), the chunk runs again with it seeded, and it is seeded from then on. A sample
//   that draws from a generator thus always draws from its seeded state. Unseen, so left to
//   "always": a dataset that reads a state without changing it (getstate(), or a draw undone by
//   setstate() as in torch.random.fork_rng()). torch's initial_seed() is the sample key in both
//   modes.
// - "off": no seeding.
// Not thread-safe: one per producer; REQUIRES the GIL.
class SampleFetcher {
 public:
  static constexpr int kProbeSamples = 64;
  static constexpr uint64_t kSkipAttempts = 16;  // as the native loader's

  // The dataset is an argument of fetch(), not held: a reference from here would be out of
  // sight of the garbage collector, and the dataset's module could hold this fetcher.
  // skip: on_error="skip" (a failed sample is replaced, see replacement()); size: the dataset's
  // length, the range replacements come from.
  SampleFetcher(uint64_t seed, std::string_view mode, nb::object seeder, nb::object slow_seed,
                bool skip, uint64_t size)
      : seed_(seed), slow_seed_(std::move(slow_seed)), skip_(skip), size_(size) {
    if (mode == "off") {
      seeding_ = false;
    } else if (mode == "always" || mode == "adaptive") {
      if (mode == "always") modes_.fill(Mode::kSeeded);
      if (!seeder.is_none()) {
        seeder_obj_ = std::move(seeder);
        seeder_ = nb::cast<GlobalSeeder*>(seeder_obj_);
      } else if (slow_seed_.is_none()) {
        throw InvalidArgument("SampleFetcher: a seeder or slow_seed is needed to seed samples");
      }
    } else {
      throw InvalidArgument("SampleFetcher: mode must be \"always\", \"adaptive\" or \"off\"");
    }
    probes_left_.fill(kProbeSamples);
  }

  // [dataset[i] for i in indices], each seeded for (seed, epoch, i). An exception from
  // __getitem__ propagates with the sample's index as its `_stoker_index` attribute.
  nb::list fetch(nb::handle dataset, uint64_t epoch, nb::handle indices) {
    const nb::object list = PyList_Check(indices.ptr()) ? nb::borrow(indices)
                                                        : nb::steal(PySequence_List(indices.ptr()));
    if (!list.is_valid()) throw nb::python_error();
    while (true) {
      nb::list out, skipped;
      if (run(dataset, epoch, list, out, skipped)) {
        for (nb::handle record : skipped) skipped_.append(record);
        return out;
      }
    }
  }

  // The (index, "Type: message") of the samples on_error="skip" replaced since the last call.
  nb::list take_skipped() {
    nb::list out = std::move(skipped_);
    skipped_ = nb::list();
    return out;
  }

  // Each generator's mode ("probe", "lazy" or "seeded"), in the order random, numpy, torch.
  std::vector<std::string> modes() const {
    std::vector<std::string> out;
    for (const Mode m : modes_)
      out.emplace_back(m == Mode::kProbe ? "probe" : m == Mode::kLazy ? "lazy" : "seeded");
    return out;
  }

 private:
  enum class Mode { kProbe, kLazy, kSeeded };
  using G = GlobalSeeder::Generator;
  using Prints = std::array<GlobalSeeder::Print, G::kGenerators>;

  // Fetches the samples of `list` into `out` (and what on_error="skip" replaced into
  // `skipped`). False when a generator left unseeded changed on the way: it is seeded from then
  // on, and the chunk must run again. (Checked once a chunk, not a sample: ~0.1 us a sample
  // less, and __getitem__ runs twice for at most three chunks.)
  bool run(nb::handle dataset, uint64_t epoch, const nb::object& list, nb::list& out,
           nb::list& skipped) {
    Prints lazy{};  // the lazy generators' prints when the chunk started, or when they turned lazy
    for (int g = 0; g < G::kGenerators; ++g)
      if (modes_[g] == Mode::kLazy) lazy[g] = seeder_->print(static_cast<G>(g));
    const nb::object getitem = python_getitem(dataset);
    const Py_ssize_t n = PyList_Size(list.ptr());
    for (Py_ssize_t k = 0; k < n; ++k) {
      const nb::object index = nb::borrow(PyList_GetItem(list.ptr(), k));
      PyObject* got = attempt(getitem, dataset, epoch, index, lazy);
      if (got == nullptr) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) raise_with_index(index);
        if (!skip_) {
          // A failure after a draw from an unseeded state may differ seeded: run again.
          if (lazy_changed(lazy)) {
            PyErr_Clear();
            return false;
          }
          raise_with_index(index);
        }
        skipped.append(nb::make_tuple(index, pending_error_text()));
        got = replacement(getitem, dataset, epoch, index, lazy);
        if (got == nullptr) raise_with_index(index);
      }
      out.append(nb::steal(got));
    }
    return !lazy_changed(lazy);
  }

  // dataset[index] with the generators seeded for the sample; a new reference, or nullptr with
  // the error set.
  PyObject* attempt(const nb::object& getitem, nb::handle dataset, uint64_t epoch,
                    const nb::object& index, Prints& lazy) {
    if (!seeding_) return call(getitem, dataset, index);
    const uint64_t i = index_value(index);
    if (seeder_ == nullptr) {
      slow_seed_(seed_, epoch, i);
      return call(getitem, dataset, index);
    }
    const uint64_t key = hash_key(seed_, epoch, i);
    Prints seeded{};
    bool probing = false;
    for (int g = 0; g < G::kGenerators; ++g) {
      if (modes_[g] == Mode::kLazy) continue;
      seeder_->seed_one(static_cast<G>(g), key);
      if (modes_[g] == Mode::kProbe) {
        seeded[g] = seeder_->print(static_cast<G>(g));
        probing = true;
      }
    }
    seeder_->set_torch_initial_seed(key);
    PyObject* got = call(getitem, dataset, index);
    for (int g = 0; g < G::kGenerators && probing; ++g) {
      if (modes_[g] != Mode::kProbe) continue;
      const GlobalSeeder::Print now = seeder_->print(static_cast<G>(g));
      if (!(now == seeded[g])) {
        modes_[g] = Mode::kSeeded;  // it drew from its seeded state: keep seeding it
      } else if (--probes_left_[g] == 0) {
        modes_[g] = Mode::kLazy;
        lazy[g] = now;
      }
    }
    return got;
  }

  // on_error="skip": the replacement of failed sample `index`, the first of kSkipAttempts
  // candidates hash_key(seed, epoch, index * kSkipAttempts + attempt) % size that loads (as the
  // native loader picks them, src/loader.cc), seeded as itself. nullptr with the error set when
  // none loads. A candidate's failure is not recorded: it is when its own turn comes.
  PyObject* replacement(const nb::object& getitem, nb::handle dataset, uint64_t epoch,
                        const nb::object& index, Prints& lazy) {
    PyObject* as_int = PyNumber_Index(index.ptr());
    if (as_int == nullptr) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError, "on_error=\"skip\" replaces samples by integer index, got %R",
                   index.ptr());
      return nullptr;
    }
    const uint64_t i = PyLong_AsUnsignedLongLongMask(as_int);
    Py_DECREF(as_int);
    for (uint64_t a = 1; a <= kSkipAttempts && size_ > 1; ++a) {
      const uint64_t other = hash_key(seed_, epoch, i * kSkipAttempts + a) % size_;
      if (other == i) continue;
      PyObject* got = attempt(getitem, dataset, epoch, nb::int_(other), lazy);
      if (got != nullptr || !PyErr_ExceptionMatches(PyExc_Exception)) return got;
      PyErr_Clear();
    }
    PyErr_Format(PyExc_RuntimeError,
                 "on_error=\"skip\": no readable replacement found after %d attempts",
                 static_cast<int>(kSkipAttempts));
    return nullptr;
  }

  // "Type: message" of the pending exception, which it clears.
  static std::string pending_error_text() {
    const nb::python_error error;
    try {
      return nb::cast<std::string>(nb::str(error.type().attr("__qualname__"))) + ": " +
             nb::cast<std::string>(nb::str(error.value()));
    } catch (const nb::python_error&) {
      return "(an exception that cannot be printed)";
    }
  }

  // Whether a lazy generator's print differs from `prints`; those are seeded from now on.
  bool lazy_changed(const Prints& prints) {
    bool changed = false;
    for (int g = 0; g < G::kGenerators; ++g) {
      if (modes_[g] == Mode::kLazy && !(seeder_->print(static_cast<G>(g)) == prints[g])) {
        modes_[g] = Mode::kSeeded;
        changed = true;
      }
    }
    return changed;
  }

  // dataset[index] through type(dataset).__getitem__ called directly: ~50 ns less than
  // PyObject_GetItem's slot for a Python class (the interpreter's own subscript is specialized).
  static PyObject* call(const nb::object& getitem, nb::handle dataset, const nb::object& index) {
    if (!getitem.is_valid()) return PyObject_GetItem(dataset.ptr(), index.ptr());
    PyObject* args[2] = {dataset.ptr(), index.ptr()};
    return PyObject_Vectorcall(getitem.ptr(), args, 2, nullptr);
  }

  // type(dataset).__getitem__ when it is a Python function, else an invalid object.
  static nb::object python_getitem(nb::handle dataset) {
    PyObject* f =
        PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(dataset.ptr())), "__getitem__");
    if (f == nullptr) {
      PyErr_Clear();
      return {};
    }
    if (!PyFunction_Check(f)) {
      Py_DECREF(f);
      return {};
    }
    return nb::steal(f);
  }

  // The sample index as seeding takes it (an int, or anything with __index__), modulo 2**64.
  static uint64_t index_value(const nb::object& index) {
    PyObject* as_int = PyNumber_Index(index.ptr());
    if (as_int == nullptr) {
      PyErr_Clear();
      PyErr_Format(PyExc_TypeError,
                   "seed_samples needs integer sample indices, got %R; pass seed_samples=False "
                   "to use other keys",
                   index.ptr());
      raise_with_index(index);
    }
    const uint64_t value = PyLong_AsUnsignedLongLongMask(as_int);
    Py_DECREF(as_int);
    return value;
  }

  // Re-raises the pending exception with `_stoker_index` = index.
  [[noreturn]] static void raise_with_index(const nb::object& index) {
#if PY_VERSION_HEX >= 0x030C0000
    PyObject* exc = PyErr_GetRaisedException();
    if (PyObject_SetAttrString(exc, "_stoker_index", index.ptr()) != 0) PyErr_Clear();
    PyErr_SetRaisedException(exc);
#else
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != nullptr) PyException_SetTraceback(value, traceback);
    if (PyObject_SetAttrString(value, "_stoker_index", index.ptr()) != 0) PyErr_Clear();
    PyErr_Restore(type, value, traceback);
#endif
    throw nb::python_error();
  }

  uint64_t seed_;
  nb::object slow_seed_;
  nb::object seeder_obj_;
  GlobalSeeder* seeder_ = nullptr;
  bool seeding_ = true;
  bool skip_;
  uint64_t size_;
  nb::list skipped_;
  std::array<Mode, GlobalSeeder::kGenerators> modes_{Mode::kProbe, Mode::kProbe, Mode::kProbe};
  std::array<int, GlobalSeeder::kGenerators> probes_left_{};
};

}  // namespace

void register_seeding(nb::module_& m) {
  m.def("sample_seed", &hash_key, nb::arg("seed"), nb::arg("epoch"), nb::arg("index"),
        "The per-sample key of (seed, epoch, index): random.h's hash_key.");

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

  nb::class_<SampleFetcher>(m, "SampleFetcher")
      .def(nb::init<uint64_t, std::string_view, nb::object, nb::object, bool, uint64_t>(),
           nb::arg("seed"), nb::arg("mode"), nb::arg("seeder").none(), nb::arg("slow_seed").none(),
           nb::arg("skip") = false, nb::arg("size") = 0)
      .def("fetch", &SampleFetcher::fetch, nb::arg("dataset"), nb::arg("epoch"), nb::arg("indices"),
           "[dataset[i] for i in indices], each with the global generators seeded for "
           "(seed, epoch, i).")
      .def("take_skipped", &SampleFetcher::take_skipped,
           "(index, \"Type: message\") of the samples on_error=\"skip\" replaced since the "
           "last call.")
      .def_prop_ro("modes", &SampleFetcher::modes);
}

}  // namespace stoker::python
