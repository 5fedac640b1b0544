#include "stoker/budget.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>

#include "stoker/errors.h"
#include "stoker/order.h"
#include "stoker/random.h"

namespace stoker {
namespace {

// Keys of the plan's permutations, hashed apart from the sample order's and each other's.
constexpr uint64_t kSampleSalt = 0x6275646765742d73ULL;  // "budget-s"
constexpr uint64_t kBatchSalt = 0x6275646765742d62ULL;   // "budget-b"
constexpr uint64_t kStepSalt = 0x6275646765742d74ULL;    // "budget-t"

std::string number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// The bounds of at most `k` buckets that each hold about the same total length; fewer where
// equal lengths cannot be split.
std::vector<double> auto_bounds(const std::vector<double>& lengths, uint64_t k) {
  std::vector<double> sorted(lengths);
  std::sort(sorted.begin(), sorted.end());
  std::vector<double> bounds;
  if (k <= 1 || sorted.empty()) return bounds;
  const double total = std::accumulate(sorted.begin(), sorted.end(), 0.0);
  double cum = 0;
  uint64_t next = 1;  // the bucket boundary sought: cum >= total * next / k
  for (size_t i = 0; i < sorted.size() && next < k; ++i) {
    cum += total > 0 ? sorted[i] : 1.0;
    const double target = (total > 0 ? total : static_cast<double>(sorted.size())) *
                          static_cast<double>(next) / static_cast<double>(k);
    if (cum < target) continue;
    // Cut after sorted[i]: the bound is the next greater length (equal lengths share a bucket).
    const auto above = std::upper_bound(sorted.begin(), sorted.end(), sorted[i]);
    if (above == sorted.end()) break;
    if (bounds.empty() || *above > bounds.back()) bounds.push_back(*above);
    while (next < k && cum >= (total > 0 ? total : static_cast<double>(sorted.size())) *
                                  static_cast<double>(next) / static_cast<double>(k))
      ++next;
  }
  return bounds;
}

// A counter-based stream for the step shuffle.
uint64_t below(uint64_t key, uint64_t i, uint64_t n) {
  const unsigned __int128 m =
      static_cast<unsigned __int128>(mix64(key + i * 0x9e3779b97f4a7c15ULL)) * n;
  return static_cast<uint64_t>(m >> 64);
}

}  // namespace

BudgetPlan::BudgetPlan(std::vector<double> lengths, BudgetOptions options)
    : lengths_(std::move(lengths)), options_(std::move(options)) {
  const BudgetOptions& o = options_;
  if (!(o.budget > 0) || !std::isfinite(o.budget))
    throw InvalidArgument("the budget must be a positive number, got " + number(o.budget));
  if (!(o.quadratic_length >= 0) || !std::isfinite(o.quadratic_length))
    throw InvalidArgument(
        "quadratic_length must be a positive number (0: the longest sample), got " +
        number(o.quadratic_length));
  for (size_t b = 0; b < o.bucket_bounds.size(); ++b) {
    const double x = o.bucket_bounds[b];
    if (!(x > 0) || !std::isfinite(x) || (b > 0 && !(x > o.bucket_bounds[b - 1])))
      throw InvalidArgument("bucket bounds must be positive and increasing, got " + number(x) +
                            " at " + std::to_string(b));
  }
  double longest = 0;
  for (uint64_t i = 0; i < lengths_.size(); ++i) {
    const double l = lengths_[i];
    if (!(l >= 0) || !std::isfinite(l))
      throw InvalidArgument("sample " + std::to_string(i) +
                            "'s length must be a finite number >= 0, got " + number(l));
    longest = std::max(longest, l);
  }
  if (o.cost == BudgetCost::kQuadratic && options_.quadratic_length == 0)
    options_.quadratic_length = longest > 0 ? longest : 1.0;
  const bool given = !o.bucket_of.empty();
  if (given) {
    if (o.bucket_of.size() != lengths_.size())
      throw InvalidArgument("bucket_of gives " + std::to_string(o.bucket_of.size()) +
                            " buckets for " + std::to_string(lengths_.size()) + " samples");
    if (!o.bucket_bounds.empty())
      throw InvalidArgument("the buckets are given (bucket_of): no bucket bounds with them");
    buckets_.resize(*std::max_element(o.bucket_of.begin(), o.bucket_of.end()) + uint64_t{1});
  } else {
    bounds_ = o.bucket_bounds.empty()
                  ? auto_bounds(lengths_, std::clamp<uint64_t>(lengths_.size() / kSortWindow, 1,
                                                               kAutoBuckets))
                  : o.bucket_bounds;
    buckets_.resize(bounds_.size() + 1);
  }
  for (uint64_t i = 0; i < lengths_.size(); ++i) {
    const double l = lengths_[i];
    if (cost(1, l, l) > o.budget) {
      oversized_.push_back(i);
      continue;
    }
    const uint64_t j = given
                           ? o.bucket_of[i]
                           : std::upper_bound(bounds_.begin(), bounds_.end(), l) - bounds_.begin();
    buckets_[j].push_back(i);
  }
  // The most samples a batch can hold: the shortest ones of a bucket, as many as fit.
  for (const auto& bucket : buckets_) {
    std::vector<double> sorted;
    sorted.reserve(bucket.size());
    for (uint64_t i : bucket) sorted.push_back(lengths_[i]);
    std::sort(sorted.begin(), sorted.end());
    double sum = 0;
    uint64_t fit = 0;
    for (double l : sorted) {
      if (o.max_batch_size && fit == o.max_batch_size) break;
      if (cost(fit + 1, sum + l, l) > o.budget) break;
      sum += l;
      ++fit;
    }
    max_batch_size_ = std::max(max_batch_size_, fit);
  }
}

double BudgetPlan::cost(uint64_t count, double sum, double max) const {
  const double n = static_cast<double>(count);
  switch (options_.cost) {
    case BudgetCost::kSum:
      return sum;
    case BudgetCost::kQuadratic:
      return n * (max + max * max / options_.quadratic_length);
    case BudgetCost::kPadded:
      break;
  }
  return n * max;
}

uint64_t BudgetPlan::max_padded_elements(std::span<const uint64_t> element_lengths,
                                         uint64_t multiple) const {
  if (element_lengths.size() != lengths_.size())
    throw InvalidArgument("max_padded_elements needs one element length a sample");
  if (multiple == 0) throw InvalidArgument("pad_to_multiple_of must be >= 1");
  uint64_t most = 0;
  for (const auto& bucket : buckets_) {
    std::vector<uint64_t> by_length(bucket.begin(), bucket.end());
    std::sort(by_length.begin(), by_length.end(), [&](uint64_t a, uint64_t b) {
      return lengths_[a] < lengths_[b] || (lengths_[a] == lengths_[b] && a < b);
    });
    // A batch whose longest (by the plan's length) is sample m holds at most the samples as long
    // as m or shorter; its count is bounded by the cost of the shortest of them with m.
    std::vector<double> prefix(by_length.size() + 1, 0.0);
    for (size_t k = 0; k < by_length.size(); ++k)
      prefix[k + 1] = prefix[k] + lengths_[by_length[k]];
    uint64_t widest = 0;  // the longest element length among samples up to m's length group
    for (size_t m = 0; m < by_length.size();) {
      size_t group_end = m;  // samples of m's plan length: [m, group_end)
      while (group_end < by_length.size() &&
             lengths_[by_length[group_end]] == lengths_[by_length[m]])
        widest = std::max(widest, element_lengths[by_length[group_end++]]);
      const double l = lengths_[by_length[m]];
      // The largest count c <= group_end whose c shortest (with the longest at l) fit.
      uint64_t lo = 1, hi = group_end;
      if (options_.max_batch_size) hi = std::min<uint64_t>(hi, options_.max_batch_size);
      while (lo < hi) {
        const uint64_t c = (lo + hi + 1) / 2;
        if (cost(c, prefix[c - 1] + l, l) <= options_.budget)
          lo = c;
        else
          hi = c - 1;
      }
      const uint64_t padded = (widest + multiple - 1) / multiple * multiple;
      most = std::max(most, lo * padded);
      m = group_end;
    }
  }
  return most;
}

std::shared_ptr<const BudgetEpoch> BudgetPlan::epoch(uint64_t seed, uint64_t epoch, bool shuffle,
                                                     uint64_t rank, uint64_t world_size,
                                                     std::vector<uint64_t> consumed) const {
  if (world_size == 0 || rank >= world_size)
    throw InvalidArgument("rank " + std::to_string(rank) + " of world_size " +
                          std::to_string(world_size) + ": need rank < world_size");
  if (!consumed.empty() && consumed.size() != buckets_.size())
    throw InvalidArgument("consumed counts: " + std::to_string(consumed.size()) +
                          " given, the plan has " + std::to_string(buckets_.size()) + " buckets");
  consumed.resize(buckets_.size(), 0);
  auto out = std::shared_ptr<BudgetEpoch>(new BudgetEpoch());
  BudgetEpoch& e = *out;
  e.epoch_ = epoch;
  e.rank_ = rank;
  e.world_size_ = world_size;
  e.buckets_.resize(buckets_.size());
  const double budget = options_.budget;
  for (uint64_t j = 0; j < buckets_.size(); ++j) {
    const std::vector<uint64_t>& samples = buckets_[j];
    const uint64_t n = samples.size();
    std::vector<uint64_t> order(n);
    const EpochOrder perm(n, shuffle, hash_key(seed, j, kSampleSalt), epoch);
    for (uint64_t p = 0; p < n; ++p) order[p] = samples[perm[p]];
    // Windows sorted up and down in turn: lengths change smoothly across a window's end too,
    // so no batch joins one window's longest to the next one's shortest.
    for (uint64_t w = 0; w < n; w += kSortWindow) {
      const bool down = (w / kSortWindow) % 2 == 1;
      std::sort(order.begin() + w, order.begin() + std::min(n, w + kSortWindow),
                [&](uint64_t a, uint64_t b) {
                  const bool less =
                      lengths_[a] < lengths_[b] || (lengths_[a] == lengths_[b] && a < b);
                  return down ? !less && a != b : less;
                });
    }
    // Greedy batches in that order.
    std::vector<uint64_t> starts{0};
    uint64_t count = 0;
    double sum = 0, longest = 0;
    for (uint64_t p = 0; p < n; ++p) {
      const double l = lengths_[order[p]];
      const bool full = options_.max_batch_size && count == options_.max_batch_size;
      if (count > 0 && (full || cost(count + 1, sum + l, std::max(longest, l)) > budget)) {
        starts.push_back(p);
        count = 0;
        sum = longest = 0;
      }
      ++count;
      sum += l;
      longest = std::max(longest, l);
    }
    if (n > 0)
      starts.push_back(n);
    else
      starts.clear();
    // The bucket's batches, runs of kBatchRun neighbours (in length) in a permuted order: a
    // step's ranks take consecutive batches, of about the same length and cost.
    BudgetEpoch::BucketBatches& bb = e.buckets_[j];
    const uint64_t nb = starts.empty() ? 0 : starts.size() - 1;
    // The run holding the bucket's last batch, the one partly filled, stays last: it is then
    // the batch a remainder drops, or the last step's, not a step among full batches.
    const uint64_t runs = (nb + kBatchRun - 1) / kBatchRun;
    const EpochOrder run_perm(runs > 0 ? runs - 1 : 0, shuffle, hash_key(seed, j, kBatchSalt),
                              epoch);
    bb.order.reserve(n);
    bb.starts.reserve(nb + 1);
    bb.starts.push_back(0);
    for (uint64_t r = 0; r < runs; ++r) {
      const uint64_t run = r + 1 < runs ? run_perm[r] : runs - 1;
      const uint64_t first = run * kBatchRun, last = std::min(nb, first + kBatchRun);
      for (uint64_t src = first; src < last; ++src) {
        bb.order.insert(bb.order.end(), order.begin() + starts[src],
                        order.begin() + starts[src + 1]);
        bb.starts.push_back(bb.order.size());
      }
    }
    if (nb == 0) bb.starts.clear();
  }
  // Steps: each bucket's whole steps (and its remainder by the rule), interleaved.
  std::vector<uint64_t> labels;
  uint64_t key = hash_key(seed, epoch, kStepSalt);
  key = hash_key(key, world_size, buckets_.size());
  for (uint64_t j = 0; j < buckets_.size(); ++j) {
    const uint64_t nb = e.buckets_[j].size();
    consumed[j] = std::min(consumed[j], nb);
    key = hash_key(key, j, consumed[j]);
    const uint64_t left = nb - consumed[j];
    const uint64_t whole = left / world_size, rest = left % world_size;
    uint64_t steps = whole;
    if (rest && options_.remainder == BudgetRemainder::kRepeat) {
      ++steps;
      if (rank >= rest) ++e.repeated_;  // this rank's batch of the last step wraps around
    } else if (rest) {
      e.dropped_ += rest;
      const BudgetEpoch::BucketBatches& bb = e.buckets_[j];
      e.dropped_samples_ += bb.starts[nb] - bb.starts[nb - rest];
    }
    labels.insert(labels.end(), steps, j);
  }
  e.consumed_ = consumed;
  if (shuffle) {
    for (uint64_t i = labels.size(); i > 1; --i) std::swap(labels[i - 1], labels[below(key, i, i)]);
  }
  std::vector<uint64_t> next(consumed);
  e.steps_.reserve(labels.size());
  for (uint64_t j : labels) {
    e.steps_.push_back({j, next[j]});
    next[j] += world_size;
  }
  // Figures: this rank's padding, every step's spread of costs across the ranks.
  for (uint64_t s = 0; s < e.steps_.size(); ++s) {
    double least = 0, most = 0;
    for (uint64_t r = 0; r < world_size; ++r) {
      const std::span<const uint64_t> batch =
          e.bucket_batch(e.steps_[s].bucket, e.steps_[s].first + r);
      double sum = 0, longest = 0;
      for (uint64_t i : batch) {
        sum += lengths_[i];
        longest = std::max(longest, lengths_[i]);
      }
      const double c = cost(batch.size(), sum, longest);
      least = r == 0 ? c : std::min(least, c);
      most = std::max(most, c);
      if (r == rank) {
        e.real_ += sum;
        e.padded_ += longest * static_cast<double>(batch.size());
      }
    }
    const double spread = most > 0 ? (most - least) / most : 0;
    e.spread_mean_ += spread;
    e.spread_max_ = std::max(e.spread_max_, spread);
  }
  if (!e.steps_.empty()) e.spread_mean_ /= static_cast<double>(e.steps_.size());
  return out;
}

std::span<const uint64_t> BudgetEpoch::bucket_batch(uint64_t bucket, uint64_t k) const {
  const BucketBatches& bb = buckets_[bucket];
  const uint64_t nb = bb.size();
  if (k >= nb) k = (k - nb) % nb;  // kRepeat: the bucket's first batches again
  return {bb.order.data() + bb.starts[k], bb.starts[k + 1] - bb.starts[k]};
}

std::span<const uint64_t> BudgetEpoch::batch(uint64_t b) const {
  if (b >= steps_.size())
    throw InvalidArgument("batch " + std::to_string(b) + " of an epoch of " +
                          std::to_string(steps_.size()));
  return bucket_batch(steps_[b].bucket, steps_[b].first + rank_);
}

uint64_t BudgetEpoch::bucket_of(uint64_t b) const {
  if (b >= steps_.size())
    throw InvalidArgument("batch " + std::to_string(b) + " of an epoch of " +
                          std::to_string(steps_.size()));
  return steps_[b].bucket;
}

std::vector<std::span<const uint64_t>> BudgetEpoch::step(uint64_t b) const {
  if (b >= steps_.size())
    throw InvalidArgument("step " + std::to_string(b) + " of an epoch of " +
                          std::to_string(steps_.size()));
  std::vector<std::span<const uint64_t>> out;
  out.reserve(world_size_);
  for (uint64_t r = 0; r < world_size_; ++r)
    out.push_back(bucket_batch(steps_[b].bucket, steps_[b].first + r));
  return out;
}

std::vector<uint64_t> BudgetEpoch::consumed_after(uint64_t steps) const {
  if (steps > steps_.size())
    throw InvalidArgument("step " + std::to_string(steps) + " of an epoch of " +
                          std::to_string(steps_.size()));
  std::vector<uint64_t> out(consumed_);
  for (uint64_t s = 0; s < steps; ++s) {
    const uint64_t j = steps_[s].bucket;
    out[j] = std::min(out[j] + world_size_, buckets_[j].size());
  }
  return out;
}

}  // namespace stoker
