// TEST-ONLY (built into stoker_testing, with the C++ tests or STOKER_TESTING; never in a wheel).
//
// FaultySource: a synthetic source for tests and demos of failure handling and slow stages.
//
// Sample i has one int64 field of `width` values, all equal to i, so a batch shows exactly which
// samples it holds. Samples listed in `fail` throw DecodeError (their path is "sample-<i>.bin");
// every read sleeps `delay_us` microseconds, to model a slow stage. Given `shards` (sizes summing
// to `size`), it says its samples live in those shards (Source::shards), as a remote source does.
//
// Thread safety: immutable; read() is safe from any number of threads.
#pragma once

#include <set>
#include <vector>

#include "stoker/source.h"

namespace stoker {

class FaultySource final : public Source {
 public:
  // REQUIRES: width >= 1; shards empty or summing to size (InvalidArgument otherwise).
  FaultySource(uint64_t size, int64_t width, std::set<uint64_t> fail, int64_t delay_us = 0,
               std::vector<uint64_t> shards = {});

  uint64_t size() const override { return size_; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  std::string path(uint64_t index) const override;
  std::vector<uint64_t> shards() const override { return shards_; }

 private:
  uint64_t size_;
  int64_t width_;
  std::set<uint64_t> fail_;
  int64_t delay_us_;
  std::vector<uint64_t> shards_;
  std::vector<FieldSpec> fields_;
};

}  // namespace stoker
