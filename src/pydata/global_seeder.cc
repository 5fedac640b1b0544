#include "stoker/pydata/global_seeder.h"

#include <cstring>

#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker::python {

GlobalSeeder::GlobalSeeder(const GeneratorFields& fields)
    : fields_(fields),
      gauss_next_(check(PyRef::steal(PyUnicode_InternFromString("gauss_next")))),
      regions_{{{fields.py_index, sizeof(int)},
                {fields.py_state, 624 * 4},
                {fields.np_key, 624 * 4},
                {fields.np_pos, sizeof(int)},
                {fields.np_has_gauss, sizeof(int)},
                {fields.np_gauss, sizeof(double)},
                {fields.torch_mt, sizeof(TorchMt)},
                // std::optional<float> / <double>: the value, then the engaged flag
                {fields.torch_float_engaged - sizeof(float), sizeof(float) + 1},
                {fields.torch_double_engaged - sizeof(double), sizeof(double) + 1}}} {
  for (const auto& [at, bytes] : regions_)
    if (at == nullptr) throw InvalidArgument("GlobalSeeder: a field address is missing");
  if (fields.py_dict == nullptr || !PyDict_Check(fields.py_dict))
    throw InvalidArgument("GlobalSeeder: py_dict must be the random instance's __dict__");
  Py_INCREF(fields_.py_dict);
}

GlobalSeeder::~GlobalSeeder() { Py_DECREF(fields_.py_dict); }

uint64_t GlobalSeeder::generator_key(Generator g, uint64_t key) {
  switch (g) {
    case kPython:
      return mix64(key ^ 0x5851f42d4c957f2dULL);
    case kNumpy:
      return mix64(key ^ 0x14057b7ef767814fULL);
    default:
      return mix64(key ^ 0x2545f4914f6cdd1dULL);
  }
}

void GlobalSeeder::seed_one(Generator g, uint64_t key) {
  switch (g) {
    case kPython:
      expand_mt19937_state(generator_key(g, key), fields_.py_state);
      *fields_.py_index = 624;
      if (PyDict_SetItem(fields_.py_dict, gauss_next_.get(), Py_None) != 0) throw PythonError{};
      return;
    case kNumpy:
      expand_mt19937_state(generator_key(g, key), fields_.np_key);
      *fields_.np_pos = 624;
      *fields_.np_has_gauss = 0;
      *fields_.np_gauss = 0.0;
      return;
    default:
      expand_mt19937_state(generator_key(g, key), fields_.torch_mt->state);
      fields_.torch_mt->left = 1;  // the next draw regenerates the whole state
      fields_.torch_mt->seeded = true;
      fields_.torch_mt->next = 0;
      *fields_.torch_float_engaged = false;
      *fields_.torch_double_engaged = false;
      set_torch_initial_seed(key);
  }
}

GlobalSeeder::Print GlobalSeeder::print(Generator g) const {
  switch (g) {
    case kPython:
      return {*fields_.py_index, fields_.py_state[0] | uint64_t{fields_.py_state[1]} << 32,
              reinterpret_cast<uintptr_t>(PyDict_GetItem(fields_.py_dict, gauss_next_.get()))};
    case kNumpy:
      return {*fields_.np_pos, fields_.np_key[622] | uint64_t{fields_.np_key[623]} << 32,
              static_cast<uintptr_t>(*fields_.np_has_gauss)};
    default: {
      const TorchMt& mt = *fields_.torch_mt;
      return {
          int64_t{mt.left} << 32 | mt.next, mt.state[0] | uint64_t{mt.state[1]} << 32,
          uintptr_t{*fields_.torch_float_engaged} | uintptr_t{*fields_.torch_double_engaged} << 1};
    }
  }
}

PyRef GlobalSeeder::save() const {
  std::string blob;
  for (const auto& [at, bytes] : regions_) blob.append(static_cast<const char*>(at), bytes);
  PyObject* gauss = PyDict_GetItem(fields_.py_dict, gauss_next_.get());
  const PyRef bytes = check(
      PyRef::steal(PyBytes_FromStringAndSize(blob.data(), static_cast<Py_ssize_t>(blob.size()))));
  return check(PyRef::steal(PyTuple_Pack(2, bytes.get(), gauss != nullptr ? gauss : Py_None)));
}

void GlobalSeeder::restore(PyObject* saved) {
  size_t total = 0;
  for (const auto& region : regions_) total += region.second;
  if (!PyTuple_Check(saved) || PyTuple_Size(saved) != 2 ||
      !PyBytes_Check(PyTuple_GetItem(saved, 0)) ||
      static_cast<size_t>(PyBytes_Size(PyTuple_GetItem(saved, 0))) != total)
    throw InvalidArgument("GlobalSeeder.restore: not a state from this seeder's save()");
  const char* from = PyBytes_AsString(PyTuple_GetItem(saved, 0));
  for (const auto& [at, bytes] : regions_) {
    std::memcpy(at, from, bytes);
    from += bytes;
  }
  if (PyDict_SetItem(fields_.py_dict, gauss_next_.get(), PyTuple_GetItem(saved, 1)) != 0)
    throw PythonError{};
}

}  // namespace stoker::python
