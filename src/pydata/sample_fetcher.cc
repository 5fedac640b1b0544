#include "stoker/pydata/sample_fetcher.h"

#include <string>
#include <utility>

#include "engine/skip_policy.h"
#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker::python {
namespace {

constexpr uint64_t kPositionDomain = 0x243f6a8885a308d3ULL;

// The type of Python functions (types.FunctionType: PyFunction_Type is outside the limited API).
PyObject* function_type() {
  static PyObject* const type = [] {
    const PyRef types = check(PyRef::steal(PyImport_ImportModule("types")));
    return check(PyRef::steal(PyObject_GetAttrString(types.get(), "FunctionType"))).release();
  }();
  return type;
}

// type(dataset).__getitem__ when it is a Python function (called directly: ~50 ns less than
// PyObject_GetItem's slot for a Python class), else an empty reference.
PyRef python_getitem(PyObject* dataset) {
  PyRef f = PyRef::steal(
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(dataset)), "__getitem__"));
  if (!f) {
    PyErr_Clear();
    return {};
  }
  if (reinterpret_cast<PyObject*>(Py_TYPE(f.get())) != function_type()) return {};
  return f;
}

PyObject* call(PyObject* getitem, PyObject* dataset, PyObject* index) {
  if (getitem == nullptr) return PyObject_GetItem(dataset, index);
  PyObject* args[2] = {dataset, index};
  return PyObject_Vectorcall(getitem, args, 2, nullptr);
}

// The pending exception, with `_stoker_index` = index, raised again.
[[noreturn]] void raise_with_index(PyObject* index) {
  PyRef error = fetch_error();
  if (error && PyObject_SetAttrString(error.get(), "_stoker_index", index) != 0) PyErr_Clear();
  restore_error(std::move(error));
  throw PythonError{};
}

// "Type: message" of the pending exception, which it clears.
PyRef pending_error_text() {
  const PyRef error = fetch_error();
  if (!error) return check(PyRef::steal(PyUnicode_FromString("(no exception)")));
  PyRef name = PyRef::steal(
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(error.get())), "__qualname__"));
  PyRef text = PyRef::steal(PyObject_Str(error.get()));
  if (!name || !text) {
    PyErr_Clear();
    return check(PyRef::steal(PyUnicode_FromString("(an exception that cannot be printed)")));
  }
  return check(PyRef::steal(PyUnicode_FromFormat("%U: %U", name.get(), text.get())));
}

// The index as an integer modulo 2**64, or false when it is not one (a list, a string).
bool integer_index(PyObject* index, uint64_t& value) {
  PyObject* as_int = PyNumber_Index(index);
  if (as_int == nullptr) {
    PyErr_Clear();
    return false;
  }
  value = PyLong_AsUnsignedLongLongMask(as_int);
  Py_DECREF(as_int);
  if (value == static_cast<uint64_t>(-1) && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  return true;
}

}  // namespace

uint64_t sample_key(uint64_t seed, uint64_t epoch, uint64_t index) {
  return hash_key(seed, epoch, index) >> 1;
}

uint64_t position_key(uint64_t seed, uint64_t epoch, uint64_t batch, uint64_t row) {
  return hash_key(seed ^ kPositionDomain, epoch, batch << 24 ^ row) >> 1;
}

SampleFetcher::SampleFetcher(Options options)
    : o_(std::move(options)),
      seeding_(o_.seeding != Seeding::kOff),
      skipped_(check(PyRef::steal(PyList_New(0)))) {
  if (seeding_ && !o_.seeder && !o_.slow_seed)
    throw InvalidArgument("SampleFetcher: a seeder or slow_seed is needed to seed samples");
  for (int g = 0; g < G::kGenerators; ++g) {
    modes_[g] = o_.leave_alone[g]                ? Mode::kOff
                : o_.seeding == Seeding::kAlways ? Mode::kSeeded
                                                 : Mode::kProbe;
    probes_left_[g] = kProbeSamples;
  }
}

PyRef SampleFetcher::fetch(PyObject* dataset, uint64_t epoch, PyObject* indices, uint64_t batch,
                           uint64_t first_row, std::span<const uint64_t> cycles) {
  const PyRef list = check(PyRef::steal(PySequence_List(indices)));
  if (!cycles.empty() && cycles.size() != static_cast<size_t>(PyList_Size(list.get())))
    throw InvalidArgument("SampleFetcher::fetch: " + std::to_string(cycles.size()) +
                          " cycles for " + std::to_string(PyList_Size(list.get())) +
                          " samples");
  const Rows rows{batch, first_row, cycles};
  while (true) {
    const PyRef out = check(PyRef::steal(PyList_New(0)));
    const PyRef skipped = check(PyRef::steal(PyList_New(0)));
    if (run(dataset, epoch, list.get(), rows, out.get(), skipped.get())) {
      const Py_ssize_t n = PyList_Size(skipped.get());
      for (Py_ssize_t k = 0; k < n; ++k)
        if (PyList_Append(skipped_.get(), PyList_GetItem(skipped.get(), k)) != 0)
          throw PythonError{};
      return out;
    }
  }
}

PyRef SampleFetcher::take_skipped() {
  return std::exchange(skipped_, check(PyRef::steal(PyList_New(0))));
}

std::vector<std::string> SampleFetcher::modes() const {
  std::vector<std::string> out;
  for (const Mode m : modes_)
    out.emplace_back(m == Mode::kProbe    ? "probe"
                     : m == Mode::kLazy   ? "lazy"
                     : m == Mode::kSeeded ? "seeded"
                                          : "off");
  return out;
}

// Fetches the samples of `list` into `out` (and what on_error="skip" replaced into `skipped`).
// False when a lazy generator changed on the way: it is seeded from then on and the chunk must
// run again. (Checked once a chunk, not a sample: ~0.1 us a sample less, and __getitem__ runs
// twice for at most three chunks a producer.)
bool SampleFetcher::run(PyObject* dataset, uint64_t epoch, PyObject* list, const Rows& rows,
                        PyObject* out, PyObject* skipped) {
  Prints lazy{};  // the lazy generators' prints when the chunk started, or when they turned lazy
  for (int g = 0; g < G::kGenerators; ++g)
    if (modes_[g] == Mode::kLazy) lazy[g] = o_.seeder->print(static_cast<G>(g));
  const PyRef getitem = python_getitem(dataset);
  const Py_ssize_t n = PyList_Size(list);
  for (Py_ssize_t k = 0; k < n; ++k) {
    PyObject* index = PyList_GetItem(list, k);
    const uint64_t key_epoch = rows.cycles.empty() ? epoch : rows.cycles[k];
    uint64_t i = 0;
    const uint64_t key =
        integer_index(index, i)
            ? sample_key(o_.seed, key_epoch, i)
            : position_key(o_.seed, epoch, rows.batch, rows.first_row + static_cast<uint64_t>(k));
    PyRef got = PyRef::steal(attempt(getitem.get(), dataset, index, key, lazy));
    if (!got) {
      if (!PyErr_ExceptionMatches(PyExc_Exception)) raise_with_index(index);
      if (!o_.skip) {
        if (lazy_changed(lazy)) {  // a failure after a draw from an unseeded state: run again
          PyErr_Clear();
          return false;
        }
        raise_with_index(index);
      }
      const PyRef text = pending_error_text();
      const PyRef record = check(PyRef::steal(PyTuple_Pack(2, index, text.get())));
      if (PyList_Append(skipped, record.get()) != 0) throw PythonError{};
      got = PyRef::steal(replacement(getitem.get(), dataset, key_epoch, index, lazy));
      if (!got) raise_with_index(index);
    }
    if (PyList_Append(out, got.get()) != 0) throw PythonError{};
  }
  return !lazy_changed(lazy);
}

// dataset[index] with the generators seeded for `key`: a new reference, or nullptr with the
// error set.
PyObject* SampleFetcher::attempt(PyObject* getitem, PyObject* dataset, PyObject* index,
                                 uint64_t key, Prints& lazy) {
  if (!seeding_) return call(getitem, dataset, index);
  if (!o_.seeder) {
    const PyRef k = check(PyRef::steal(PyLong_FromUnsignedLongLong(key)));
    check(PyRef::steal(PyObject_CallFunctionObjArgs(o_.slow_seed.get(), k.get(), nullptr)));
    return call(getitem, dataset, index);
  }
  Prints seeded{};
  bool probing = false;
  for (int g = 0; g < G::kGenerators; ++g) {
    if (modes_[g] == Mode::kLazy || modes_[g] == Mode::kOff) continue;
    o_.seeder->seed_one(static_cast<G>(g), key);
    if (modes_[g] == Mode::kProbe) {
      seeded[g] = o_.seeder->print(static_cast<G>(g));
      probing = true;
    }
  }
  if (modes_[G::kTorch] != Mode::kOff) o_.seeder->set_torch_initial_seed(key);
  PyObject* got = call(getitem, dataset, index);
  for (int g = 0; g < G::kGenerators && probing; ++g) {
    if (modes_[g] != Mode::kProbe) continue;
    const GlobalSeeder::Print now = o_.seeder->print(static_cast<G>(g));
    if (!(now == seeded[g])) {
      modes_[g] = Mode::kSeeded;  // it drew from its seeded state: keep seeding it
    } else if (--probes_left_[g] == 0) {
      modes_[g] = Mode::kLazy;
      lazy[g] = now;
    }
  }
  return got;
}

// on_error="skip": the replacement of failed sample `index` by the rule of src/engine/skip_policy.h;
// nullptr with the error set when none loads (or a candidate raised a BaseException).
PyObject* SampleFetcher::replacement(PyObject* getitem, PyObject* dataset, uint64_t epoch,
                                     PyObject* index, Prints& lazy) {
  uint64_t i = 0;
  if (!integer_index(index, i)) {
    PyErr_Format(PyExc_TypeError, "on_error=\"skip\" replaces samples by integer index, got %R",
                 index);
    return nullptr;
  }
  PyObject* got = nullptr;
  const bool found = find_replacement(o_.seed, epoch, i, o_.size, [&](uint64_t other) {
    const PyRef candidate = check(PyRef::steal(PyLong_FromUnsignedLongLong(other)));
    got = attempt(getitem, dataset, candidate.get(), sample_key(o_.seed, epoch, other), lazy);
    if (got != nullptr || !PyErr_ExceptionMatches(PyExc_Exception)) return true;  // read, or stop
    PyErr_Clear();
    return false;
  }).has_value();
  if (found) return got;
  PyErr_SetString(PyExc_RuntimeError, no_replacement_message().c_str());
  return nullptr;
}

// Whether a lazy generator's print differs from `prints`; those are seeded from now on.
bool SampleFetcher::lazy_changed(const Prints& prints) {
  bool changed = false;
  for (int g = 0; g < G::kGenerators; ++g) {
    if (modes_[g] == Mode::kLazy && !(o_.seeder->print(static_cast<G>(g)) == prints[g])) {
      modes_[g] = Mode::kSeeded;
      changed = true;
    }
  }
  return changed;
}

}  // namespace stoker::python
