#include "stoker/mixture.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "stoker/epoch_draws.h"
#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker {
namespace {

using u128 = unsigned __int128;

constexpr uint64_t kMaxSources = uint64_t{1} << 20;  // keeps deficits (< 2 * 2^52) in int64
constexpr double kWeightScale = 4294967296.0;        // weights keep 32 bits relative to the largest

// The seeded streams of this file, one word each, so that no two draw the same numbers.
constexpr uint64_t kSourceSeeds = 0x6d1c7e000001;
constexpr uint64_t kTieOrder = 0x6d1c7e000002;
constexpr uint64_t kRowShuffle = 0x6d1c7e000003;

// Uniform in [0, bound) from 64 random bits (multiply-shift; bias below bound / 2^64).
uint64_t below(SampleRng& rng, uint64_t bound) {
  return static_cast<uint64_t>((static_cast<u128>(rng.next_u64()) * bound) >> 64);
}

std::string at_step(uint64_t step) { return "the mixture weights at step " + std::to_string(step); }

}  // namespace

uint64_t mixture_source_seed(uint64_t seed, uint64_t source) {
  return hash_key(seed, kSourceSeeds, source);
}

// A phase with its weights quantized: q[c] / total is source c's share.
struct MixturePlan::Phase {
  uint64_t first_step = 0;
  std::vector<double> weights;
  std::vector<uint64_t> q;
  uint64_t total = 0;
};

// The state before row `row`: each source's draws since the plan's start, and its deficit
// (target - allocated since the latest reset, in units of 1 / the phase's total).
struct MixturePlan::Cursor {
  uint64_t row = 0;
  std::vector<uint64_t> draws;
  std::vector<int64_t> deficits;
  std::vector<uint32_t> candidates;  // scratch
};

MixturePlan::MixturePlan(MixtureOrder order, uint64_t seed, bool shuffle, uint64_t epoch,
                         uint64_t batch_size, bool drop_last, uint64_t rank, uint64_t world_size,
                         MixtureStart start)
    : order_(std::move(order)),
      seed_(seed),
      epoch_(epoch),
      shuffle_(shuffle),
      rank_(rank),
      world_(world_size),
      start_(std::move(start)),
      plan_(std::accumulate(order_.sizes.begin(), order_.sizes.end(), uint64_t{0}), batch_size,
            drop_last, rank, world_size, start_.position) {
  const uint64_t C = order_.sizes.size();
  if (C == 0) throw InvalidArgument("a mixture needs at least one source");
  if (C >= kMaxSources)
    throw InvalidArgument("a mixture supports fewer than " + std::to_string(kMaxSources) +
                          " sources, got " + std::to_string(C));
  if (start_.bases.empty()) start_.bases.assign(C, 0);
  if (start_.bases.size() != C)
    throw InvalidArgument(
        "a mixture plan's start needs one stream position per source: " + std::to_string(C) +
        " sources, " + std::to_string(start_.bases.size()) + " positions");
  if (order_.schedule.empty()) throw InvalidArgument("a mixture needs weights (a schedule)");
  for (size_t p = 0; p < order_.schedule.size(); ++p) {
    const MixturePhase& given = order_.schedule[p];
    const std::string where = at_step(given.first_step);
    if (p > 0 && given.first_step <= order_.schedule[p - 1].first_step)
      throw InvalidArgument("the mixture schedule's phases must start at increasing steps: step " +
                            std::to_string(given.first_step) + " follows step " +
                            std::to_string(order_.schedule[p - 1].first_step));
    if (given.weights.size() != C)
      throw InvalidArgument(where + " are " + std::to_string(given.weights.size()) +
                            " numbers for " + std::to_string(C) + " sources");
    double largest = 0;
    for (uint64_t c = 0; c < C; ++c) {
      const double w = given.weights[c];
      if (!std::isfinite(w) || w < 0)
        throw InvalidArgument(where + ": source " + std::to_string(c) + " has weight " +
                              std::to_string(w) + "; weights must be finite and >= 0");
      if (w > 0 && order_.sizes[c] == 0)
        throw InvalidArgument(where + ": source " + std::to_string(c) +
                              " has no samples but a positive weight");
      largest = std::max(largest, w);
    }
    if (largest == 0)
      throw InvalidArgument(where + " sum to 0; at least one source needs a positive weight");
    auto phase = std::make_shared<Phase>();
    phase->first_step = given.first_step;
    phase->weights = given.weights;
    phase->q.resize(C);
    for (uint64_t c = 0; c < C; ++c) {
      const double w = given.weights[c];
      phase->q[c] = w > 0 ? std::max<uint64_t>(
                                1, static_cast<uint64_t>(std::llround(w / largest * kWeightScale)))
                          : 0;
      phase->total += phase->q[c];
    }
    phases_.push_back(std::move(phase));
  }
  rows_ = plan_.num_batches() * world_;
  offsets_.resize(C);
  stream_seeds_.resize(C);
  for (uint64_t c = 0, at = 0; c < C; ++c) {
    offsets_[c] = at;
    at += order_.sizes[c];
    stream_seeds_[c] = mixture_source_seed(seed_, c);
  }
  std::vector<uint32_t> ties(C);
  std::iota(ties.begin(), ties.end(), 0u);
  if (shuffle_) {
    SampleRng rng(hash_key(seed_, kTieOrder, start_.position), epoch_, 0);
    for (size_t i = C; i > 1; --i) std::swap(ties[i - 1], ties[below(rng, i)]);
  }
  tie_rank_.resize(C);
  for (uint32_t i = 0; i < C; ++i) tie_rank_[ties[i]] = i;
  // Checkpoint 0: the plan's start.
  checkpoint_draws_.assign(C, 0);
  checkpoint_deficits_.assign(C, 0);
}

MixtureStart MixturePlan::epoch_start(const MixtureOrder& order, uint64_t seed, bool shuffle,
                                      uint64_t epoch, uint64_t batch_size, bool drop_last,
                                      uint64_t world_size) {
  MixtureStart start;
  start.bases.assign(order.sizes.size(), 0);
  for (uint64_t e = 0; e < epoch; ++e) {
    const MixturePlan plan(order, seed, shuffle, e, batch_size, drop_last, 0, world_size, start);
    start.bases = plan.epoch_end();
    start.first_step += plan.num_batches();
  }
  return start;
}

const std::vector<double>& MixturePlan::weights_at(uint64_t step) const {
  auto it = std::upper_bound(phases_.begin(), phases_.end(), step,
                             [](uint64_t s, const auto& p) { return s < p->first_step; });
  return (it == phases_.begin() ? *it : *(it - 1))->weights;
}

size_t MixturePlan::phase_at(uint64_t row) const {
  const uint64_t step = start_.first_step + row / world_;
  auto it = std::upper_bound(phases_.begin(), phases_.end(), step,
                             [](uint64_t s, const auto& p) { return s < p->first_step; });
  return it == phases_.begin() ? 0 : static_cast<size_t>(it - phases_.begin() - 1);
}

void MixturePlan::advance(Cursor& cur, std::vector<uint64_t>& counts) const {
  const uint64_t C = num_sources();
  const uint64_t g = cur.row;
  const uint64_t length = plan_.batch_length(g / world_);
  const size_t p = phase_at(g);
  if (g == 0 || phase_at(g - 1) != p) std::fill(cur.deficits.begin(), cur.deficits.end(), 0);
  const Phase& phase = *phases_[p];
  counts.assign(C, 0);
  cur.candidates.clear();
  uint64_t given = 0;
  for (uint32_t c = 0; c < C; ++c) {
    const u128 target = static_cast<u128>(length) * phase.q[c];
    counts[c] = static_cast<uint64_t>(target / phase.total);
    const auto fraction = static_cast<int64_t>(target % phase.total);
    given += counts[c];
    cur.deficits[c] += fraction;
    if (fraction > 0) cur.candidates.push_back(c);
  }
  // The extras: one each to the `extra` largest deficits (there are more candidates than extras:
  // their fractions sum to extra * total, each below total).
  const uint64_t extra = length - given;
  if (extra > 0) {
    const auto before = [&](uint32_t a, uint32_t b) {
      const int64_t da = cur.deficits[a], db = cur.deficits[b];
      return da != db ? da > db : tie_rank_[a] < tie_rank_[b];
    };
    std::nth_element(cur.candidates.begin(), cur.candidates.begin() + (extra - 1),
                     cur.candidates.end(), before);
    for (uint64_t i = 0; i < extra; ++i) {
      const uint32_t c = cur.candidates[i];
      ++counts[c];
      cur.deficits[c] -= static_cast<int64_t>(phase.total);
    }
  }
  for (uint64_t c = 0; c < C; ++c) cur.draws[c] += counts[c];
  ++cur.row;
}

MixturePlan::Cursor MixturePlan::cursor_at(uint64_t row) const {
  const uint64_t C = num_sources();
  const uint64_t k = row / kCheckpointRows;
  Cursor cur;
  std::vector<uint64_t> counts;
  {
    std::lock_guard lock(mu_);
    uint64_t have = checkpoint_draws_.size() / C;
    if (have <= k) {
      cur.row = (have - 1) * kCheckpointRows;
      cur.draws.assign(checkpoint_draws_.end() - C, checkpoint_draws_.end());
      cur.deficits.assign(checkpoint_deficits_.end() - C, checkpoint_deficits_.end());
      for (; have <= k; ++have) {
        while (cur.row < have * kCheckpointRows) advance(cur, counts);
        checkpoint_draws_.insert(checkpoint_draws_.end(), cur.draws.begin(), cur.draws.end());
        checkpoint_deficits_.insert(checkpoint_deficits_.end(), cur.deficits.begin(),
                                    cur.deficits.end());
      }
    }
    cur.row = k * kCheckpointRows;
    cur.draws.assign(checkpoint_draws_.begin() + k * C, checkpoint_draws_.begin() + (k + 1) * C);
    cur.deficits.assign(checkpoint_deficits_.begin() + k * C,
                        checkpoint_deficits_.begin() + (k + 1) * C);
  }
  while (cur.row < row) advance(cur, counts);
  return cur;
}

std::vector<uint64_t> MixturePlan::batch_counts(uint64_t b) const {
  check_batch(plan_, b);
  Cursor cur = cursor_at(b * world_ + rank_);
  std::vector<uint64_t> counts;
  advance(cur, counts);
  return counts;
}

std::vector<uint64_t> MixturePlan::draws_after(uint64_t batches) const {
  if (batches > num_batches())
    throw InvalidArgument("batch " + std::to_string(batches) + " is past the plan's " +
                          std::to_string(num_batches()) + " batches");
  Cursor cur = cursor_at(batches * world_);
  for (uint64_t c = 0; c < num_sources(); ++c) cur.draws[c] += start_.bases[c];
  return std::move(cur.draws);
}

void MixturePlan::batch(uint64_t b, std::span<uint64_t> out, std::span<uint64_t> cycles) const {
  if (b >= num_batches() || out.size() != plan_.batch_length(b) ||
      (!cycles.empty() && cycles.size() != out.size()))
    throw InvalidArgument("MixturePlan::batch: batch " + std::to_string(b) + " of " +
                          std::to_string(num_batches()) + " with " + std::to_string(out.size()) +
                          " slots and " + std::to_string(cycles.size()) + " cycles");
  const uint64_t row = b * world_ + rank_;
  Cursor cur = cursor_at(row);
  std::vector<uint64_t> counts;
  advance(cur, counts);
  size_t s = 0;
  for (uint64_t c = 0; c < num_sources(); ++c) {
    const uint64_t n = order_.sizes[c];
    uint64_t p = start_.bases[c] + cur.draws[c] - counts[c];  // the row's first draw of c
    for (uint64_t left = counts[c]; left > 0;) {
      const uint64_t k = p / n, j = p % n, take = std::min(left, n - j);
      const std::span<uint64_t> run = out.subspan(s, take);
      for (uint64_t t = 0; t < take; ++t) run[t] = j + t;
      EpochOrder(n, shuffle_, stream_seeds_[c], k).map(run, run);
      for (uint64_t& x : run) x += offsets_[c];
      if (!cycles.empty()) std::fill_n(cycles.begin() + s, take, k);
      s += take;
      p += take;
      left -= take;
    }
  }
  if (!shuffle_) return;
  // Mix the row: without it a batch would list its samples source by source.
  SampleRng rng(hash_key(seed_, kRowShuffle, start_.position), epoch_, row);
  for (size_t i = out.size(); i > 1; --i) {
    const size_t other = below(rng, i);
    std::swap(out[i - 1], out[other]);
    if (!cycles.empty()) std::swap(cycles[i - 1], cycles[other]);
  }
}

}  // namespace stoker
