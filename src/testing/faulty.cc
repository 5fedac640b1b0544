#include "stoker/testing/faulty.h"

#include <chrono>
#include <string>
#include <thread>

#include "stoker/errors.h"

namespace stoker {

FaultySource::FaultySource(uint64_t size, int64_t width, std::set<uint64_t> fail, int64_t delay_us,
                           std::vector<uint64_t> shards)
    : size_(size),
      width_(width),
      fail_(std::move(fail)),
      delay_us_(delay_us),
      shards_(std::move(shards)) {
  if (width < 1) throw InvalidArgument("width must be a positive integer");
  uint64_t total = 0;
  for (uint64_t s : shards_) total += s;
  if (!shards_.empty() && total != size)
    throw InvalidArgument("the shards hold " + std::to_string(total) + " samples, not " +
                          std::to_string(size));
  fields_ = {{"value", kInt64, {width}}};
}

void FaultySource::read(const SampleKey& key, std::span<std::byte* const> slots,
                        WorkerState*) const {
  if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
  if (fail_.count(key.index) != 0) throw DecodeError("corrupt data (injected failure)");
  auto* out = reinterpret_cast<int64_t*>(slots[0]);
  for (int64_t i = 0; i < width_; ++i) out[i] = static_cast<int64_t>(key.index);
}

std::string FaultySource::path(uint64_t index) const {
  return "sample-" + std::to_string(index) + ".bin";
}

}  // namespace stoker
