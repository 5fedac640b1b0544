// Per-sample seeding of the interpreter's three global generators by writing their states in
// place (the Python-dataset wing's API, for Stoker's own bindings). This file and
// python/stoker/pydata/rng_fields.py are the only code that touches other libraries' private
// memory; rng_fields.py locates the fields below in this process, verifies them against the
// public getstate()/get_state(), and falls back to the public setstate()/set_state() calls when
// anything does not match.
//
// Layouts relied on (each located and verified at start-up, never assumed):
// - Python's `random` module instance (CPython Modules/_randommodule.c RandomObject):
//   `int index; uint32_t state[624];` right after PyObject_HEAD, and the cached `gauss_next`
//   in the instance's __dict__ (random.Random is a Python subclass).
// - NumPy's legacy generator (np.random.mtrand._rand, a RandomState over MT19937):
//   mt19937_state `uint32_t key[624]; int pos;` at the bit generator's state_address, and the
//   RandomState's aug_bitgen_t `bitgen_t* bit_generator; int has_gauss; double gauss;`.
// - torch's default CPU generator (ATen CPUGeneratorImpl): at::mt19937_data_pod (TorchMt below),
//   then `std::optional<float>` and `std::optional<double>` cached normals (value, engaged flag).
//
// Why write in place (bench/seed_cost.py, one process, this 2-core machine while busy): the
// public calls for the three generators (random.setstate with a 625-tuple, np.random.set_state,
// torch's Generator.set_state) took ~230 us a sample, this writer ~1.9 us (~120x less), and the
// adaptive SampleFetcher costs what no seeding costs (~0.035 us a sample) for a dataset that draws
// from no generator. A light dataset (~1.5 us a sample) would run many times slower seeded
// through the public calls.
//
// Thread safety: not thread-safe; REQUIRES the GIL (the generators are the interpreter's).
#pragma once

#include <Python.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "stoker/pydata/py_ref.h"

namespace stoker::python {

// torch's at::mt19937_data_pod (ATen/core/MT19937RNGEngine.h), the engine of CPUGeneratorImpl.
struct TorchMt {
  uint64_t seed;
  int32_t left;
  bool seeded;
  uint32_t next;
  uint32_t state[624];
};
static_assert(offsetof(TorchMt, left) == 8 && offsetof(TorchMt, next) == 16 &&
              offsetof(TorchMt, state) == 20 && sizeof(TorchMt) == 2520);

// Where the three generators keep their state in this process (see the layouts above).
struct GeneratorFields {
  int* py_index = nullptr;               // random: position in the state (624: regenerate)
  uint32_t* py_state = nullptr;          // random: the 624 words
  PyObject* py_dict = nullptr;           // random: the instance's __dict__ (gauss_next); borrowed
  uint32_t* np_key = nullptr;            // numpy: the 624 words
  int* np_pos = nullptr;                 // numpy: position
  int* np_has_gauss = nullptr;           // numpy: cached normal?
  double* np_gauss = nullptr;            // numpy: the cached normal
  TorchMt* torch_mt = nullptr;           // torch: the engine
  bool* torch_float_engaged = nullptr;   // torch: optional<float> cached normal's flag
  bool* torch_double_engaged = nullptr;  // torch: optional<double> cached normal's flag
};

class GlobalSeeder {
 public:
  enum Generator : int { kPython, kNumpy, kTorch, kGenerators };

  // REQUIRES: every field points at live memory of that layout for the seeder's lifetime; the
  // dict is referenced here (a new reference is taken).
  explicit GlobalSeeder(const GeneratorFields& fields);
  ~GlobalSeeder();
  GlobalSeeder(const GlobalSeeder&) = delete;
  GlobalSeeder& operator=(const GlobalSeeder&) = delete;

  // The key generator g's MT19937 state is expanded from, for a sample key: distinct per
  // generator, so the three streams differ.
  static uint64_t generator_key(Generator g, uint64_t key);

  // Gives generator g the state of sample `key`: the 624 words expand_mt19937_state(
  // generator_key(g, key)), positioned so that the next draw regenerates them all (as
  // setstate(words + (624,)) does), no cached normal. torch's initial_seed() becomes `key`.
  void seed_one(Generator g, uint64_t key);
  // What torch.initial_seed() reports, without touching the generator's state.
  void set_torch_initial_seed(uint64_t key) { fields_.torch_mt->seed = key; }

  // What a draw, a seed or a setstate() changes in generator g: its position in the state, two
  // state words (a draw past the end regenerates all 624; both staying equal has odds 2^-64) and
  // its cached normal. ~30 ns for the three.
  struct Print {
    int64_t position;
    uint64_t words;
    uintptr_t cached;
    bool operator==(const Print&) const = default;
  };
  Print print(Generator g) const;

  // The three generators' states (the fields seed_one writes, and random's gauss_next), as a
  // (bytes, gauss_next) tuple, and back. ~1 us; getstate()/setstate() of the three ~70 us.
  PyRef save() const;
  // REQUIRES: `saved` from this seeder's save() (InvalidArgument otherwise).
  void restore(PyObject* saved);

 private:
  GeneratorFields fields_;
  PyRef gauss_next_;                                 // the interned key "gauss_next"
  std::array<std::pair<void*, size_t>, 9> regions_;  // what save() and restore() copy
};

}  // namespace stoker::python
