#include "stoker/block_order.h"

#include <algorithm>
#include <string>

#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker {

BlockOrder::BlockOrder(std::span<const uint64_t> block_sizes, uint64_t window, uint64_t seed,
                       uint64_t epoch) {
  if (window < 1) throw InvalidArgument("a block order needs a window of at least one block");
  const uint64_t blocks = block_sizes.size();
  block_first_.reserve(blocks);
  uint64_t n = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    if (block_sizes[b] == 0)
      throw InvalidArgument("block " + std::to_string(b) + " of a block order has no samples");
    block_first_.push_back(n);
    n += block_sizes[b];
  }
  // The blocks' permutation is keyed apart from the windows' (and from EpochOrder's over the
  // samples), so that equal sizes never give equal permutations.
  const EpochOrder blocks_order(blocks, true, hash_key(seed, 0xb10c, 0), epoch);
  slot_block_.resize(blocks);
  slot_start_.resize(blocks + 1);
  for (uint64_t k = 0; k < blocks; ++k) {
    slot_block_[k] = blocks_order[k];
    slot_start_[k + 1] = slot_start_[k] + block_sizes[slot_block_[k]];
  }
  for (uint64_t k = 0; k < blocks; k += window) {
    const uint64_t end = std::min(blocks, k + window);
    window_slot_.push_back(k);
    window_perm_.emplace_back(slot_start_[end] - slot_start_[k], true,
                              hash_key(seed, 0xb10c, window_perm_.size() + 1), epoch);
  }
  window_slot_.push_back(blocks);
}

uint64_t BlockOrder::operator[](uint64_t position) const {
  // The window holding `position`: the last whose first position is <= it.
  const auto w = static_cast<uint64_t>(
      std::upper_bound(window_slot_.begin() + 1, window_slot_.end() - 1, position,
                       [&](uint64_t p, uint64_t slot) { return p < slot_start_[slot]; }) -
      (window_slot_.begin() + 1));
  const uint64_t first = slot_start_[window_slot_[w]];
  const uint64_t j = first + window_perm_[w][position - first];
  const auto begin = slot_start_.begin() + static_cast<std::ptrdiff_t>(window_slot_[w]);
  const auto end = slot_start_.begin() + static_cast<std::ptrdiff_t>(window_slot_[w + 1]);
  const auto k = static_cast<uint64_t>(std::upper_bound(begin, end, j) - slot_start_.begin() - 1);
  return block_first_[slot_block_[k]] + (j - slot_start_[k]);
}

void BlockOrder::map(std::span<const uint64_t> positions, std::span<uint64_t> out) const {
  if (positions.size() != out.size())
    throw InvalidArgument("BlockOrder::map needs as many outputs as positions");
  for (size_t i = 0; i < positions.size(); ++i) out[i] = (*this)[positions[i]];
}

}  // namespace stoker
