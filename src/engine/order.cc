#include "stoker/order.h"

#include <algorithm>
#include <bit>
#include <string>
#include <vector>

#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker {

EpochOrder::EpochOrder(uint64_t n, bool shuffle, uint64_t seed, uint64_t epoch)
    : n_(n), shuffle_(shuffle && n > 1) {
  if (!shuffle_) return;
  // Smallest even bit count whose domain holds n; cycle-walking then takes < 4 steps on average.
  const int bits = std::max(2, static_cast<int>(std::bit_width(n - 1)));
  half_bits_ = (bits + 1) / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  for (int r = 0; r < kRounds; ++r) round_keys_[r] = hash_key(seed, epoch, 0x5eed0000 + r);
}

uint64_t EpochOrder::permute(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (int r = 0; r < kRounds; ++r) {
    const uint64_t f = mix64(right ^ round_keys_[r]) & half_mask_;
    const uint64_t next_right = left ^ f;
    left = right;
    right = next_right;
  }
  return (left << half_bits_) | right;
}

uint64_t EpochOrder::operator[](uint64_t position) const {
  if (!shuffle_) return position;
  // Cycle-walking: a bijection on the power-of-two domain restricted to [0, n) stays a bijection.
  uint64_t x = permute(position);
  while (x >= n_) x = permute(x);
  return x;
}

void EpochOrder::map(std::span<const uint64_t> positions, std::span<uint64_t> out) const {
  if (out.size() != positions.size())
    throw InvalidArgument("EpochOrder::map: out and positions differ in size");
  if (!shuffle_) {
    if (out.data() != positions.data()) std::copy(positions.begin(), positions.end(), out.begin());
    return;
  }
  // The same walk as operator[], one step for every element at a time: independent chains of
  // multiplies, which the CPU pipelines, and no unpredictable branch (the list of elements
  // still outside [0, n) grows by a comparison's 0 or 1).
  std::vector<size_t> walking(out.size());
  size_t count = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = permute(positions[i]);
    walking[count] = i;
    count += out[i] >= n_;
  }
  while (count > 0) {
    size_t still = 0;
    for (size_t k = 0; k < count; ++k) {
      const size_t i = walking[k];
      out[i] = permute(out[i]);
      walking[still] = i;
      still += out[i] >= n_;
    }
    count = still;
  }
}

BatchPlan::BatchPlan(uint64_t num_samples, uint64_t batch_size, bool drop_last, uint64_t rank,
                     uint64_t world_size, uint64_t start)
    : n_(num_samples),
      batch_size_(batch_size),
      rank_(rank),
      world_size_(world_size),
      start_(start) {
  if (batch_size == 0) throw InvalidArgument("batch_size must be a positive integer, got 0");
  if (world_size == 0) throw InvalidArgument("world_size must be a positive integer, got 0");
  if (rank >= world_size)
    throw InvalidArgument("rank must be in [0, world_size): got rank " + std::to_string(rank) +
                          " with world_size " + std::to_string(world_size));
  if (start > num_samples)
    throw InvalidArgument("the plan's start position " + std::to_string(start) +
                          " is past the epoch's " + std::to_string(num_samples) + " samples");
  const uint64_t left = n_ - start_;
  per_rank_ = drop_last ? left / world_size_ : (left + world_size_ - 1) / world_size_;
  all_batches_ = drop_last ? per_rank_ / batch_size_ : (per_rank_ + batch_size_ - 1) / batch_size_;
  num_batches_ = all_batches_;
  samples_ = std::min(per_rank_, all_batches_ * batch_size_);
}

uint64_t BatchPlan::batch_length(uint64_t b) const {
  const uint64_t begin = (first_ + b * step_) * batch_size_;
  return std::min(batch_size_, per_rank_ - begin);
}

uint64_t BatchPlan::global_position(uint64_t k) const {
  const uint64_t b = first_ + k / batch_size_ * step_;
  const uint64_t j = b * batch_size_ + k % batch_size_;  // the sample's place in the rank's share
  return (start_ + rank_ + j * world_size_) % n_;
}

uint64_t BatchPlan::position_after(uint64_t batches) const {
  if (is_strided()) throw InvalidArgument("position_after: a strided plan covers no prefix");
  if (batches > num_batches_)
    throw InvalidArgument("position_after: " + std::to_string(batches) + " batches of a plan of " +
                          std::to_string(num_batches_));
  if (batches == num_batches_) return n_;
  return start_ + batches * batch_size_ * world_size_;
}

BatchPlan BatchPlan::strided(uint64_t first, uint64_t step) const {
  if (step == 0) throw InvalidArgument("strided: step must be a positive integer, got 0");
  BatchPlan view = *this;
  view.first_ = first_ + first * step_;
  view.step_ = step_ * step;
  view.num_batches_ = first >= num_batches_ ? 0 : (num_batches_ - first + step - 1) / step;
  view.samples_ = 0;
  if (view.num_batches_ > 0) {
    // Every batch of the view is full but possibly the last, which may be the plan's short one.
    view.samples_ =
        (view.num_batches_ - 1) * batch_size_ + view.batch_length(view.num_batches_ - 1);
  }
  return view;
}

}  // namespace stoker
