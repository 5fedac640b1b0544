#include "stoker/block_order.h"

#include <algorithm>
#include <string>

#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker {
namespace {

// The key of group g of window w. Group 0's is the unstriped order's window key, so that
// stripes = 1 gives the order of releases before stripes; the others are keyed apart from it.
uint64_t group_key(uint64_t seed, uint64_t w, uint64_t g) {
  const uint64_t window_key = hash_key(seed, 0xb10c, w + 1);
  return g == 0 ? window_key : hash_key(window_key, 0x57121be, g);
}

uint64_t pool_key(uint64_t seed, uint64_t w) {
  return hash_key(hash_key(seed, 0xb10c, w + 1), 0x9001, 0);
}

// Positions p in [first, first + count) with p % stripes == c.
uint64_t positions_of_class(uint64_t first, uint64_t count, uint64_t stripes, uint64_t c) {
  const uint64_t at = first + (c + stripes - first % stripes) % stripes;
  return at >= first + count ? 0 : (first + count - 1 - at) / stripes + 1;
}

}  // namespace

BlockOrder::BlockOrder(std::span<const uint64_t> block_sizes, uint64_t window, uint64_t stripes,
                       uint64_t seed, uint64_t epoch)
    : window_(window), stripes_(stripes) {
  if (window < 1) throw InvalidArgument("a block order needs a window of at least one block");
  if (stripes < 1) throw InvalidArgument("a block order needs at least one stripe");
  const uint64_t blocks = block_sizes.size();
  block_first_.reserve(blocks);
  uint64_t n = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    if (block_sizes[b] == 0)
      throw InvalidArgument("block " + std::to_string(b) + " of a block order has no samples");
    block_first_.push_back(n);
    n += block_sizes[b];
  }
  // The blocks' permutation is keyed apart from the groups' (and from EpochOrder's over the
  // samples), so that equal sizes never give equal permutations.
  const EpochOrder blocks_order(blocks, true, hash_key(seed, 0xb10c, 0), epoch);
  slot_block_.resize(blocks);
  slot_start_.resize(blocks + 1);
  for (uint64_t k = 0; k < blocks; ++k) {
    slot_block_[k] = blocks_order[k];
    slot_start_[k + 1] = slot_start_[k] + block_sizes[slot_block_[k]];
  }
  // A window of window * stripes blocks, saturated: a huge window is one window.
  const uint64_t span = window > blocks / stripes ? blocks + 1 : window * stripes;
  for (uint64_t k = 0; k < blocks; k += span) window_slot_.push_back(k);
  window_slot_.push_back(blocks);
  const uint64_t windows = window_slot_.size() - 1;
  group_perm_.reserve(windows * stripes);
  if (stripes > 1) {
    deficit_before_.reserve(windows * (stripes + 1));
    excess_before_.reserve(windows * (stripes + 1));
    pool_perm_.reserve(windows);
  }
  for (uint64_t w = 0; w < windows; ++w) {
    const uint64_t first = slot_start_[window_slot_[w]];
    const uint64_t count = slot_start_[window_slot_[w + 1]] - first;
    uint64_t deficit = 0, excess = 0;
    for (uint64_t g = 0; g < stripes; ++g) {
      const uint64_t m =
          slot_start_[group_first_slot(w, g + 1)] - slot_start_[group_first_slot(w, g)];
      group_perm_.emplace_back(m, true, group_key(seed, w, g), epoch);
      if (stripes == 1) continue;
      const uint64_t n_c = positions_of_class(first, count, stripes, g);
      deficit_before_.push_back(deficit);
      excess_before_.push_back(excess);
      deficit += n_c > m ? n_c - m : 0;
      excess += m > n_c ? m - n_c : 0;
    }
    if (stripes == 1) continue;
    deficit_before_.push_back(deficit);  // == excess: the classes and groups hold the window
    excess_before_.push_back(excess);
    pool_perm_.emplace_back(excess, true, pool_key(seed, w), epoch);
  }
}

uint64_t BlockOrder::group_first_slot(uint64_t w, uint64_t g) const {
  const uint64_t first = window_slot_[w], end = window_slot_[w + 1];
  return g >= (end - first - 1) / window_ + 1 ? end : first + g * window_;  // past the last: end
}

uint64_t BlockOrder::class_size(uint64_t w, uint64_t c) const {
  const uint64_t first = slot_start_[window_slot_[w]];
  return positions_of_class(first, slot_start_[window_slot_[w + 1]] - first, stripes_, c);
}

BlockOrder::Slot BlockOrder::group_sample(uint64_t w, uint64_t g, uint64_t i) const {
  const auto begin = slot_start_.begin() + static_cast<std::ptrdiff_t>(group_first_slot(w, g));
  const auto end = slot_start_.begin() + static_cast<std::ptrdiff_t>(group_first_slot(w, g + 1));
  const uint64_t j = *begin + i;
  const auto k = static_cast<uint64_t>(std::upper_bound(begin, end, j) - slot_start_.begin() - 1);
  return {k, j - slot_start_[k]};
}

BlockOrder::Slot BlockOrder::locate(uint64_t position) const {
  // The window holding `position`: the last whose first position is <= it.
  const auto w = static_cast<uint64_t>(
      std::upper_bound(window_slot_.begin() + 1, window_slot_.end() - 1, position,
                       [&](uint64_t p, uint64_t slot) { return p < slot_start_[slot]; }) -
      (window_slot_.begin() + 1));
  const uint64_t S = stripes_;
  if (S == 1) return group_sample(w, 0, group_perm_[w][position - slot_start_[window_slot_[w]]]);
  // Class c's j-th position in the window.
  const uint64_t first = slot_start_[window_slot_[w]];
  const uint64_t c = position % S;
  const uint64_t j = (position - (first + (c + S - first % S) % S)) / S;
  const EpochOrder& own = group_perm_[w * S + c];
  if (j < own.size()) return group_sample(w, c, own[j]);  // j < n_c always: j is class c's
  // A deficit position: the pool's element q, which belongs to the group whose excess holds it.
  const auto deficits = deficit_before_.begin() + static_cast<std::ptrdiff_t>(w * (S + 1));
  const uint64_t q = pool_perm_[w][deficits[c] + (j - own.size())];
  const auto excess = excess_before_.begin() + static_cast<std::ptrdiff_t>(w * (S + 1));
  const auto g = static_cast<uint64_t>(std::upper_bound(excess, excess + S + 1, q) - excess - 1);
  const EpochOrder& theirs = group_perm_[w * S + g];
  return group_sample(w, g, theirs[class_size(w, g) + (q - excess[g])]);
}

uint64_t BlockOrder::operator[](uint64_t position) const {
  const Slot s = locate(position);
  return block_first_[slot_block_[s.slot]] + s.offset;
}

uint64_t BlockOrder::block_at(uint64_t position) const {
  return slot_block_[locate(position).slot];
}

uint64_t BlockOrder::block_of_sample(uint64_t sample) const {
  return static_cast<uint64_t>(std::upper_bound(block_first_.begin(), block_first_.end(), sample) -
                               block_first_.begin() - 1);
}

void BlockOrder::map(std::span<const uint64_t> positions, std::span<uint64_t> out) const {
  if (positions.size() != out.size())
    throw InvalidArgument("BlockOrder::map needs as many outputs as positions");
  for (size_t i = 0; i < positions.size(); ++i) out[i] = (*this)[positions[i]];
}

std::vector<uint64_t> BlockOrder::blocks_in_order(uint64_t start, uint64_t rank,
                                                  uint64_t world_size) const {
  if (world_size < 1) throw InvalidArgument("blocks_in_order needs a world size of at least 1");
  std::vector<uint64_t> out;
  std::vector<bool> seen(num_blocks());
  for (uint64_t p = start + rank; p < size(); p += world_size) {
    const uint64_t b = block_at(p);
    if (seen[b]) continue;
    seen[b] = true;
    out.push_back(b);
    if (out.size() == seen.size()) break;  // every block seen: nothing new can follow
  }
  return out;
}

}  // namespace stoker
