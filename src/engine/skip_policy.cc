#include "engine/skip_policy.h"

#include <utility>

#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker {

uint64_t skip_candidate(uint64_t seed, uint64_t epoch, uint64_t index, int attempt,
                        uint64_t num_samples) {
  return hash_key(seed, epoch, index * kSkipAttempts + attempt) % num_samples;
}

std::string no_replacement_message() {
  return "on_error=\"skip\": no readable replacement found after " + std::to_string(kSkipAttempts) +
         " attempts";
}

void SkippedSamples::record(uint64_t index, std::string path, const std::exception_ptr& cause) {
  SampleError described(index, std::move(path), cause);
  std::lock_guard lock(mu_);
  ++count_;
  listed_.emplace_back(described.what());
  if (listed_.size() > kSkippedListed) listed_.pop_front();
}

void SkippedSamples::read(uint64_t* count, std::vector<std::string>* listed) const {
  std::lock_guard lock(mu_);
  *count = count_;
  listed->assign(listed_.begin(), listed_.end());
}

}  // namespace stoker
