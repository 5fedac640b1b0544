// on_error="skip": the one rule by which a failed sample is replaced and remembered. The native
// loader (engine.cc), the GPU JPEG decoder (src/gpu/batch_decoder.cc) and the
// Python-dataset engine (src/pydata/sample_fetcher.cc) all follow it through this header.
//
// The rule:
// - A sample that fails is replaced by the first of its candidates that reads. The candidates of
//   sample `index` of `epoch` are skip_candidate(seed, epoch, index, attempt, num_samples) for
//   attempt = 1 .. kSkipAttempts (include/stoker/engine.h), in that order; one equal to `index`
//   is passed over, and a source of one sample has none. They depend only on (seed, epoch, index),
//   so a stage after the workers replaces a sample exactly as the loader would.
// - The failed sample is recorded once: counted, and its description ("sample I (path): message")
//   kept among the newest kSkippedListed. A candidate that fails too is not recorded: it is when
//   its own turn in the epoch comes, so the count is the number of the epoch's samples that were
//   replaced, not of failed attempts.
// - When no candidate reads, the failed sample's error is "on_error=\"skip\": no readable
//   replacement found after 16 attempts" (no_replacement_message()).
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "stoker/errors.h"
#include "stoker/engine.h"

namespace stoker {

// The error text when none of a failed sample's candidates reads.
std::string no_replacement_message();

// The first of the candidates of sample `index` of `epoch` for which try_read(candidate) returns
// true; nullopt when none does. try_read returns false for a candidate that could not be read (not
// to be recorded, see above); it may return true to stop at a failure the caller propagates itself
// (the Python engine's BaseException).
template <class TryRead>
std::optional<uint64_t> find_replacement(uint64_t seed, uint64_t epoch, uint64_t index,
                                         uint64_t num_samples, TryRead&& try_read) {
  for (int attempt = 1; attempt <= kSkipAttempts && num_samples > 1; ++attempt) {
    const uint64_t other = skip_candidate(seed, epoch, index, attempt, num_samples);
    if (other == index) continue;
    if (try_read(other)) return other;
  }
  return std::nullopt;
}

// find_replacement for a reader that throws when it cannot read: read(candidate) for each
// candidate until one returns normally; the one read, or else a SampleError for `index` (with
// `path`) whose cause is no_replacement_message().
template <class Read>
uint64_t read_replacement(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t num_samples,
                          const std::string& path, Read&& read) {
  const std::optional<uint64_t> got =
      find_replacement(seed, epoch, index, num_samples, [&](uint64_t other) {
        try {
          read(other);
          return true;
        } catch (...) {
          return false;  // not recorded: see the header
        }
      });
  if (got) return *got;
  throw SampleError(index, path, std::make_exception_ptr(Error(no_replacement_message())));
}

// The record of the samples skipped so far: their count and the descriptions of the newest
// kSkippedListed. The two change together, under one lock, so a reader that takes the newest
// records by the count's growth (the Ray offload actors do) never gets one twice or misses one.
// Thread-safe.
class SkippedSamples {
 public:
  // Records failed sample `index` (with `path`, empty if none) and the cause of its failure.
  void record(uint64_t index, std::string path, const std::exception_ptr& cause);
  // The count and the listed descriptions, oldest first, read together.
  void read(uint64_t* count, std::vector<std::string>* listed) const;

 private:
  mutable std::mutex mu_;
  uint64_t count_ = 0;             // guarded by mu_
  std::deque<std::string> listed_;  // guarded by mu_; at most kSkippedListed
};

}  // namespace stoker
