// The loop that runs a Python dataset's __getitem__ for a chunk of samples, each with the global
// generators seeded for that sample (the Python-dataset wing's API, for Stoker's own bindings).
//
// Keys: sample i of an epoch gets key = hash_key(seed, epoch, i) >> 1 (63 bits, so that
// torch.initial_seed(), which reports it, fits in an int64 tensor). In a stratified order a draw
// is keyed by its cycle through its class instead of the epoch (as the native loader keys it), so
// the repeats of an oversampled sample draw their own randomness. A sample fetched by a key that
// is not an integer (a list from a bulk-loading sampler, a string) gets the key of its place in the
// epoch instead, position_key(seed, epoch, batch, row): still the same whichever worker runs it,
// and whichever part of the batch it is fetched with.
//
// Seeding modes:
// - kAlways: every generator is seeded before every sample.
// - kAdaptive: every generator is seeded before each of the first kProbeSamples samples. One that
//   none of those drew from is then no longer written but checked at the end of each chunk: when
//   a sample changed it (a draw, a seed, a setstate()), the chunk runs again with it seeded, and it
//   is seeded from then on, so a sample that draws always draws from its seeded state. Unseen, so
//   left to kAlways: a dataset that reads a state without changing it (getstate(), or a draw undone
//   by torch.random.fork_rng()). torch's initial_seed() is the sample key in both modes.
// - kOff: no seeding.
// Generators in `leave_alone` (those a worker_init_fn seeded itself) are never written, and
// torch's initial_seed() is left to that seeding too when torch's generator is among them.
//
// on_error="skip": a failing sample (an Exception from __getitem__) is replaced by the rule of
// src/engine/skip_policy.h, as the native loader replaces it, the replacement seeded as itself. Its
// (index, "Type: message") is kept for take_skipped(); the Python front keeps the newest
// kSkippedListed of them (exported as _native.engine.SKIPPED_LISTED).
//
// Thread safety: not thread-safe: one per producer. REQUIRES the GIL.
#pragma once

#include <Python.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/pydata/global_seeder.h"
#include "stoker/pydata/py_ref.h"
#include "stoker/engine.h"

namespace stoker::python {

// Sample keys and worker seeds are 63-bit, so that torch.initial_seed(), which reports them, fits
// in an int64 tensor: every key is within this mask (exported as _native.pydata.SEED_MASK).
inline constexpr uint64_t kSeedMask = ~uint64_t{0} >> 1;

// The key of sample `index` of `epoch`: what torch.initial_seed() reports while it runs.
uint64_t sample_key(uint64_t seed, uint64_t epoch, uint64_t index);
// The key of the sample at `row` of batch `batch` (for samples with a non-integer index).
uint64_t position_key(uint64_t seed, uint64_t epoch, uint64_t batch, uint64_t row);

class SampleFetcher {
 public:
  enum class Seeding { kOff, kAdaptive, kAlways };
  static constexpr int kProbeSamples = 64;
  static constexpr uint64_t kSkipAttempts = stoker::kSkipAttempts;  // src/engine/skip_policy.h

  struct Options {
    uint64_t seed = 0;
    Seeding seeding = Seeding::kAdaptive;
    // Writes the generators in place; null: `slow_seed(key)` (a Python callable seeding through
    // the public calls) is called before every sample instead.
    std::shared_ptr<GlobalSeeder> seeder;
    PyRef slow_seed;
    std::array<bool, GlobalSeeder::kGenerators> leave_alone{};
    bool skip = false;  // on_error="skip"
    uint64_t size = 0;  // skip: the dataset's length, the range replacements come from
  };
  // REQUIRES: with seeding, a seeder or a slow_seed (InvalidArgument otherwise).
  explicit SampleFetcher(Options options);

  // [dataset[i] for i in indices], each seeded for its sample: `indices` are the rows from
  // `first_row` on of batch `batch` of `epoch`; `cycles` (empty, or one a sample) key the draws of
  // a stratified order. The dataset is an argument, not held: a reference from here would be out
  // of sight of the garbage collector. An exception from __getitem__ propagates (PythonError) with
  // the sample's index as its `_stoker_index` attribute. REQUIRES: cycles empty or as long as
  // indices (InvalidArgument).
  PyRef fetch(PyObject* dataset, uint64_t epoch, PyObject* indices, uint64_t batch,
              uint64_t first_row = 0, std::span<const uint64_t> cycles = {});

  // (index, "Type: message") of the samples on_error="skip" replaced since the last call.
  PyRef take_skipped();

  // Each generator's mode ("probe", "lazy", "seeded" or "off"), as random, numpy, torch.
  std::vector<std::string> modes() const;

 private:
  enum class Mode { kProbe, kLazy, kSeeded, kOff };
  using G = GlobalSeeder::Generator;
  using Prints = std::array<GlobalSeeder::Print, G::kGenerators>;

  struct Rows {  // where a fetched list sits: its batch, first row, and the draws' cycles
    uint64_t batch, first_row;
    std::span<const uint64_t> cycles;
  };
  bool run(PyObject* dataset, uint64_t epoch, PyObject* list, const Rows& rows, PyObject* out,
           PyObject* skipped);
  PyObject* attempt(PyObject* getitem, PyObject* dataset, PyObject* index, uint64_t key,
                    Prints& lazy);
  PyObject* replacement(PyObject* getitem, PyObject* dataset, uint64_t epoch, PyObject* index,
                        Prints& lazy);
  bool lazy_changed(const Prints& prints);

  Options o_;
  bool seeding_;
  PyRef skipped_;
  std::array<Mode, G::kGenerators> modes_{};
  std::array<int, G::kGenerators> probes_left_{};
};

}  // namespace stoker::python
