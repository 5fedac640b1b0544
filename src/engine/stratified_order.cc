#include "stoker/stratified_order.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "stoker/epoch_draws.h"
#include "stoker/errors.h"
#include "stoker/order.h"
#include "stoker/random.h"

namespace stoker {
namespace {

using u128 = unsigned __int128;

constexpr int kRounds = 6;
constexpr double kWeightScale = 4294967296.0;  // weights keep 32 bits relative to the largest

// The seeded streams of this file, one word each, so that no two draw the same numbers.
constexpr uint64_t kPermutationKeys = 0x5747a7000001;
constexpr uint64_t kTailRounding = 0x5747a7000002;
constexpr uint64_t kExtrasRounding = 0x5747a7000003;
constexpr uint64_t kRunOrder = 0x5747a7000004;
constexpr uint64_t kRowShuffle = 0x5747a7000005;

// Uniform in [0, bound) from 64 random bits (multiply-shift; bias below bound / 2^64).
uint64_t below(SampleRng& rng, uint64_t bound) {
  return static_cast<uint64_t>((static_cast<u128>(rng.next_u64()) * bound) >> 64);
}

// `items` in a random order (Fisher-Yates).
void shuffle(std::vector<uint32_t>& items, SampleRng& rng) {
  for (size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[below(rng, i)]);
}

uint64_t floor_div(u128 num, uint64_t den) { return static_cast<uint64_t>(num / den); }
uint64_t ceil_div(u128 num, uint64_t den) { return static_cast<uint64_t>((num + den - 1) / den); }

// Rounds every num[c] / den down or up so that the sum stays exact: class c rounds up with
// probability (num[c] mod den) / den. Systematic sampling: the classes laid end to end in a
// random order, each as long as its remainder, and one uniform offset picks every den-th point.
// REQUIRES: the sum of num is a multiple of den.
std::vector<uint64_t> round_systematically(const std::vector<u128>& num, uint64_t den,
                                           SampleRng& rng) {
  std::vector<uint32_t> order(num.size());
  std::iota(order.begin(), order.end(), 0u);
  shuffle(order, rng);
  std::vector<uint64_t> out(num.size());
  u128 cum = below(rng, den);
  for (uint32_t c : order) {
    const u128 before = cum / den;
    cum += num[c] % den;
    out[c] = floor_div(num[c], den) + static_cast<uint64_t>(cum / den - before);
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

ClassGroups::ClassGroups(std::span<const int64_t> labels) : num_samples_(labels.size()) {
  labels_.assign(labels.begin(), labels.end());
  std::sort(labels_.begin(), labels_.end());
  labels_.erase(std::unique(labels_.begin(), labels_.end()), labels_.end());
  labels_.shrink_to_fit();
  if (labels_.size() >= (uint64_t{1} << 32))
    throw InvalidArgument("a stratified order supports fewer than 2^32 classes");
  // Class of a label: a table over the labels' range when it is small, else a binary search.
  std::vector<uint32_t> table;
  const uint64_t span = labels_.empty() ? 0 : uint64_t(labels_.back()) - uint64_t(labels_.front());
  if (!labels_.empty() && span < 2 * labels.size() + 1024) {
    table.assign(span + 1, 0);
    for (uint32_t c = 0; c < labels_.size(); ++c)
      table[uint64_t(labels_[c]) - uint64_t(labels_.front())] = c;
  }
  const auto class_of = [&](int64_t label) -> uint32_t {
    if (!table.empty()) return table[uint64_t(label) - uint64_t(labels_.front())];
    return static_cast<uint32_t>(std::lower_bound(labels_.begin(), labels_.end(), label) -
                                 labels_.begin());
  };
  starts_.assign(labels_.size() + 1, 0);
  for (int64_t label : labels) ++starts_[class_of(label) + 1];
  std::partial_sum(starts_.begin(), starts_.end(), starts_.begin());
  std::vector<uint64_t> next(starts_.begin(), starts_.end() - 1);
  if (num_samples_ < (uint64_t{1} << 32)) {
    narrow_.resize(num_samples_);
    for (uint64_t i = 0; i < num_samples_; ++i)
      narrow_[next[class_of(labels[i])]++] = static_cast<uint32_t>(i);
  } else {
    wide_.resize(num_samples_);
    for (uint64_t i = 0; i < num_samples_; ++i) wide_[next[class_of(labels[i])]++] = i;
  }
}

uint64_t ClassGroups::memory_bytes() const {
  return sizeof(*this) + labels_.capacity() * sizeof(int64_t) +
         starts_.capacity() * sizeof(uint64_t) + narrow_.capacity() * sizeof(uint32_t) +
         wide_.capacity() * sizeof(uint64_t);
}

// ---------------------------------------------------------------------------------------------

struct StratifiedPlan::Layout {
  std::shared_ptr<const ClassGroups> classes;
  bool weighted = false;
  std::vector<uint64_t> share;  // per class; counts without weights, else scaled weights
  uint64_t total_share = 0;
  uint64_t seed = 0, batch_size = 0, rank = 0, world = 0;
  bool drop_last = false;
  BatchPlan plan;
  uint64_t full_rows = 0;    // rows of batch_size: every batch but the final partial ones
  uint64_t tail_rows = 0;    // the final partial batches (drop_last=false): world rows ...
  uint64_t tail_length = 0;  // ... of this length
  std::vector<uint64_t> full_total, tail_total;  // with weights: each class's slots per block
  std::vector<uint64_t> draws;                   // per class: its stream's advance per epoch
  uint64_t round_keys[kRounds] = {};

  Layout(std::shared_ptr<const ClassGroups> c, uint64_t batch, bool drop, uint64_t r, uint64_t w)
      : classes(std::move(c)),
        batch_size(batch),
        rank(r),
        world(w),
        drop_last(drop),
        plan(classes ? classes->num_samples() : 0, batch, drop, r, w) {}

  uint64_t count(uint32_t c) const { return classes->count(c); }

  // The permutation of class c's cycle k: a keyed Feistel network with EpochOrder's round
  // keys, each folded with tweak(c, k), so that a class's permutation needs no setup of its own.
  // Unlike EpochOrder's it is unbalanced (the halves alternate: the high `bits - bits / 2` bits
  // and the low bits / 2), so its domain is the smallest power of two holding the class and
  // cycle-walking (see StratifiedEpoch::batch) takes fewer than 2 steps on average, also for the
  // many small classes of a long tail.
  static uint64_t class_key(uint64_t first_key, uint32_t c) { return hash_key(first_key, c, 0); }
  static uint64_t tweak(uint64_t class_key, uint64_t cycle) {
    return mix64(class_key + cycle * 0x9e3779b97f4a7c15ULL);
  }
  uint64_t permute(uint64_t x, int bits, uint64_t tweak) const {
    const int low_bits = bits / 2;
    const uint64_t low_mask = (uint64_t{1} << low_bits) - 1;
    const uint64_t high_mask = (uint64_t{1} << (bits - low_bits)) - 1;
    uint64_t high = x >> low_bits, low = x & low_mask;
    for (int r = 0; r < kRounds; r += 2) {
      high ^= mix64(low ^ round_keys[r] ^ tweak) & high_mask;
      low ^= mix64(high ^ round_keys[r + 1] ^ tweak) & low_mask;
    }
    return (high << low_bits) | low;
  }
  static int domain_bits(uint64_t n) {
    return std::max(2, static_cast<int>(std::bit_width(n - 1)));
  }
};

StratifiedPlan::StratifiedPlan(std::shared_ptr<const ClassGroups> classes,
                               std::vector<double> weights, uint64_t seed, uint64_t batch_size,
                               bool drop_last, uint64_t rank, uint64_t world_size) {
  if (!classes) throw InvalidArgument("a stratified order needs the classes of the samples");
  if (batch_size >= (uint64_t{1} << 32))
    throw InvalidArgument("a stratified order needs a batch_size below 2^32");
  auto l = std::make_shared<Layout>(std::move(classes), batch_size, drop_last, rank, world_size);
  const ClassGroups& g = *l->classes;
  const uint32_t C = g.num_classes();
  const uint64_t n = g.num_samples();
  l->seed = seed;
  for (int r = 0; r < kRounds; ++r) l->round_keys[r] = hash_key(seed, kPermutationKeys, r);

  l->weighted = !weights.empty();
  l->share.resize(C);
  if (!l->weighted) {
    for (uint32_t c = 0; c < C; ++c) l->share[c] = g.count(c);
    l->total_share = n;
  } else {
    if (weights.size() != C)
      throw InvalidArgument("class_weights: expected one weight for each of the " +
                            std::to_string(C) + " classes, got " + std::to_string(weights.size()));
    double largest = 0;
    for (uint32_t c = 0; c < C; ++c) {
      if (!std::isfinite(weights[c]) || weights[c] < 0)
        throw InvalidArgument("class_weights must be finite and >= 0; class " +
                              std::to_string(g.label(c)) + " has " + std::to_string(weights[c]));
      largest = std::max(largest, weights[c]);
    }
    if (largest == 0) throw InvalidArgument("class_weights are all 0: no class would be drawn");
    for (uint32_t c = 0; c < C; ++c) {
      if (weights[c] == 0) continue;
      l->share[c] = std::max<uint64_t>(1, std::llround(weights[c] / largest * kWeightScale));
      l->total_share += l->share[c];
    }
  }

  const uint64_t batches = l->plan.num_batches(), W = world_size;
  if (batches > 0) {
    if (drop_last) {
      l->full_rows = batches * W;
    } else {
      l->full_rows = (batches - 1) * W;
      l->tail_rows = W;
      l->tail_length = l->plan.batch_length(batches - 1);
    }
  }

  l->draws.assign(C, 0);
  if (!l->weighted) {
    for (uint32_t c = 0; c < C; ++c) l->draws[c] = g.count(c);
  } else {
    // Each block's slots of a class: floor(length * share) in every row, and the extras of the
    // block rounded once, so that a class's draws are the same every epoch.
    const auto totals = [&](uint64_t rows, uint64_t length, uint64_t block) {
      std::vector<uint64_t> total(C, 0);
      if (rows == 0) return total;
      std::vector<u128> extras(C);
      for (uint32_t c = 0; c < C; ++c)
        extras[c] =
            static_cast<u128>(rows) * ((static_cast<u128>(length) * l->share[c]) % l->total_share);
      SampleRng rng(hash_key(seed, kExtrasRounding, block), 0, 0);
      const std::vector<uint64_t> e = round_systematically(extras, l->total_share, rng);
      for (uint32_t c = 0; c < C; ++c)
        total[c] = rows * floor_div(static_cast<u128>(length) * l->share[c], l->total_share) + e[c];
      return total;
    };
    l->full_total = totals(l->full_rows, batch_size, 0);
    l->tail_total = totals(l->tail_rows, l->tail_length, 1);
    for (uint32_t c = 0; c < C; ++c) l->draws[c] = l->full_total[c] + l->tail_total[c];
  }
  layout_ = std::move(l);
}

StratifiedPlan::~StratifiedPlan() = default;

uint64_t StratifiedPlan::num_batches() const { return layout_->plan.num_batches(); }
uint64_t StratifiedPlan::batch_length(uint64_t b) const { return layout_->plan.batch_length(b); }
const ClassGroups& StratifiedPlan::classes() const { return *layout_->classes; }
uint64_t StratifiedPlan::class_draws(uint32_t c) const { return layout_->draws.at(c); }

StratifiedEpoch StratifiedPlan::epoch(uint64_t epoch) const { return {layout_, epoch}; }

// ---------------------------------------------------------------------------------------------

// The rows of equal length of one epoch: each class's slots per row, and its run of extras.
//
// Entry k of the R x X matrix of extras is in column k / R at offset k mod R. Offsets reach rows
// through a grid of `width` columns that offsets fill column by column and rows read row by row
// (row = grid_row * width + grid_column), so the entries of a run land `width` rows apart
// instead of in consecutive rows: a class's extras spread over the epoch, and a prefix of the
// rows holds its share of them within about 2 sqrt(R). The width is about sqrt(R) and coprime
// with world_size, so that no rank's rows line up with grid columns.
struct StratifiedEpoch::Block {
  // A grid cell: column and row. Columns below `tall` hold `height` + 1 offsets, the others
  // `height`: rows = height * width + tall.
  struct Cell {
    uint32_t column = 0, row = 0;
  };
  // What a row needs of a class, in one 32-byte record.
  struct PerClass {
    uint64_t offset = 0;  // the class's stream position (this epoch) where the block starts
    uint32_t base = 0;    // slots in every row
    Cell start, end;      // its run of extras: the first cell and the one after the last
    bool wraps = false;   // the run goes on at the top of the next matrix column
  };

  uint64_t rows = 0, length = 0, extras_per_row = 0;
  uint64_t width = 1, height = 0, tall = 0;
  std::vector<PerClass> classes;
  std::vector<uint32_t> base_classes;  // the classes with base > 0
  std::vector<uint64_t> run_end;       // runs in matrix order: the entry after each run
  std::vector<uint32_t> run_class;     // runs in matrix order: their class
  // The run holding entry k is the first at or after first_run[k >> bucket_bits] whose end is
  // past k: buckets about half as wide as an average run, so a lookup steps over a run or two.
  std::vector<uint32_t> first_run;
  int bucket_bits = 0;

  Cell cell(uint64_t offset) const {
    const uint64_t in_tall = tall * (height + 1);
    if (offset < in_tall) return {uint32_t(offset / (height + 1)), uint32_t(offset % (height + 1))};
    return {uint32_t(tall + (offset - in_tall) / height), uint32_t((offset - in_tall) % height)};
  }
  // The offset of row i's cell (i = grid_row * width + grid_column): the entry of row i in
  // every matrix column is column * R + this.
  uint64_t offset_of_row(uint64_t grid_row, uint64_t grid_column) const {
    return grid_column * height + std::min(grid_column, tall) + grid_row;
  }
  // Offsets before `at` whose rows are before row i (grid_row, grid_column = divmod(i, width)).
  static uint64_t before(Cell at, uint64_t grid_row, uint64_t grid_column) {
    return at.column * grid_row + std::min<uint64_t>(at.column, grid_column) +
           std::min<uint64_t>(at.row, grid_row + (at.column < grid_column));
  }
  // The stream position of class k's first slot in row i = grid_row * width + grid_column: the
  // block's start, its base slots of the rows before, and its extras in the rows before.
  static uint64_t first_position(const PerClass& k, uint64_t i, uint64_t grid_row,
                                 uint64_t grid_column) {
    const uint64_t start = before(k.start, grid_row, grid_column);
    const uint64_t end = before(k.end, grid_row, grid_column);
    return k.offset + i * k.base + (k.wraps ? i - start + end : end - start);
  }
  // The class whose run holds entry k of the matrix of extras.
  uint32_t class_at(uint64_t k) const {
    size_t at = first_run[k >> bucket_bits];
    while (run_end[at] <= k) ++at;
    return run_class[at];
  }
};

namespace {

using Block = StratifiedEpoch::Block;

uint64_t grid_width(uint64_t rows, uint64_t world) {
  uint64_t width = std::max<uint64_t>(1, static_cast<uint64_t>(std::sqrt(double(rows))));
  while (std::gcd(width, world) != 1) ++width;
  return width <= rows ? width : 1;
}

std::shared_ptr<const Block> make_block(const StratifiedPlan::Layout& l, uint64_t epoch,
                                        uint64_t which, uint64_t rows, uint64_t length,
                                        const std::vector<uint64_t>& total,
                                        const std::vector<uint64_t>& offset) {
  const uint32_t C = l.classes->num_classes();
  auto b = std::make_shared<Block>();
  b->rows = rows;
  b->length = length;
  b->width = grid_width(rows, l.world);
  b->height = rows / b->width;
  b->tall = rows % b->width;
  b->classes.resize(C);
  uint64_t base_slots = 0;
  std::vector<uint32_t> with_extras;
  for (uint32_t c = 0; c < C; ++c) {
    b->classes[c].offset = offset[c];
    b->classes[c].base = static_cast<uint32_t>(total[c] / rows);
    base_slots += b->classes[c].base;
    if (b->classes[c].base > 0) b->base_classes.push_back(c);
    if (total[c] % rows > 0) with_extras.push_back(c);
  }
  if (base_slots > length) throw std::logic_error("stratified order: a row overflows");
  b->extras_per_row = length - base_slots;
  SampleRng rng(hash_key(l.seed, kRunOrder, which), epoch, 0);
  shuffle(with_extras, rng);
  uint64_t k = 0;
  for (uint32_t c : with_extras) {
    const uint64_t start = k % rows, end = start + total[c] % rows;  // a run is shorter than R
    Block::PerClass& r = b->classes[c];
    r.start = b->cell(start);
    r.wraps = end > rows;
    r.end = b->cell(r.wraps ? end - rows : end);
    k += total[c] % rows;
    b->run_end.push_back(k);
    b->run_class.push_back(c);
  }
  if (k != rows * b->extras_per_row)
    throw std::logic_error("stratified order: the extras do not fill the rows");
  if (k > 0) {
    const uint64_t half_run = std::max<uint64_t>(1, k / (2 * b->run_end.size()));
    b->bucket_bits = std::bit_width(half_run) - 1;
    b->first_run.resize(((k - 1) >> b->bucket_bits) + 1);
    size_t at = 0;
    for (uint64_t bucket = 0; bucket < b->first_run.size(); ++bucket) {
      while (b->run_end[at] <= bucket << b->bucket_bits) ++at;
      b->first_run[bucket] = static_cast<uint32_t>(at);
    }
  }
  return b;
}

// Without weights: how many samples of each class the tail takes this epoch (the dropped
// samples under drop_last, else the final partial batches, padding included).
struct TailCounts {
  std::vector<uint64_t> real;    // the class's own samples in the tail
  std::vector<uint64_t> padded;  // the same plus the padding slots it fills
};

TailCounts tail_counts(const StratifiedPlan::Layout& l, uint64_t epoch) {
  const ClassGroups& g = *l.classes;
  const uint32_t C = g.num_classes();
  const uint64_t n = g.num_samples(), B = l.batch_size, K = l.full_rows;
  const uint64_t real = n - K * B;  // samples outside the full rows
  const uint64_t slots = l.drop_last ? real : l.tail_rows * l.tail_length;
  SampleRng rng(hash_key(l.seed, kTailRounding, 0), epoch, 0);
  TailCounts out;
  if (slots == real) {
    // The tail's share of each class, rounded (each row of a block of R rows then holds
    // floor or ceil of its share: see the header).
    std::vector<u128> num(C);
    for (uint32_t c = 0; c < C; ++c) num[c] = static_cast<u128>(real) * g.count(c);
    out.real = round_systematically(num, n, rng);
    out.padded = out.real;
    return out;
  }
  // Padding (world_size does not divide n): pick the tail's real counts t and its counts with
  // padding y so that the full rows and the tail rows each stay within one of the share:
  // t_c in [n_c - K ceil(B n_c/n), n_c - K floor(B n_c/n)], y_c in [W floor(L n_c/n),
  // W ceil(L n_c/n)], t_c <= y_c, sum t = real, sum y = slots. These are the bounds of a flow
  // with a fractional solution (t, y) = (real n_c / n, slots n_c / n), so an integral one exists;
  // the greedy below finds it: it minimizes sum max(t_c, y_lo_c), the least sum of y that t
  // allows, then lifts y to `slots`.
  const uint64_t W = l.tail_rows, L = l.tail_length;
  std::vector<uint64_t> t(C), t_hi(C), y_lo(C), y_hi(C);
  uint64_t sum_t = 0;
  for (uint32_t c = 0; c < C; ++c) {
    const uint64_t nc = g.count(c);
    const uint64_t most_in_full = K * ceil_div(static_cast<u128>(B) * nc, n);
    const uint64_t least_in_full = K * floor_div(static_cast<u128>(B) * nc, n);
    y_lo[c] = W * floor_div(static_cast<u128>(L) * nc, n);
    y_hi[c] = W * ceil_div(static_cast<u128>(L) * nc, n);
    t[c] = nc - std::min(nc, most_in_full);
    t_hi[c] = std::min(nc - least_in_full, y_hi[c]);
    sum_t += t[c];
  }
  std::vector<uint32_t> order(C);
  std::iota(order.begin(), order.end(), 0u);
  shuffle(order, rng);
  uint64_t left = real - sum_t;
  for (int phase = 0; phase < 2; ++phase) {
    for (uint32_t c : order) {
      const uint64_t to = phase == 0 ? std::min(t_hi[c], std::max(t[c], y_lo[c])) : t_hi[c];
      const uint64_t add = std::min(left, to - t[c]);
      t[c] += add;
      left -= add;
    }
  }
  std::vector<uint64_t> y(C);
  uint64_t sum_y = 0;
  for (uint32_t c = 0; c < C; ++c) sum_y += y[c] = std::max(t[c], y_lo[c]);
  if (left != 0 || sum_y > slots)
    throw std::logic_error("stratified order: no tail within the shares (a bug)");
  left = slots - sum_y;
  for (uint32_t c : order) {
    const uint64_t add = std::min(left, y_hi[c] - y[c]);
    y[c] += add;
    left -= add;
  }
  if (left != 0) throw std::logic_error("stratified order: the padding does not fit (a bug)");
  out.real = std::move(t);
  out.padded = std::move(y);
  return out;
}

}  // namespace

namespace {

// One slot of a row being filled: position x of a class's permutation (of n samples, from
// `start` in the grouping) with its cycle's tweak.
struct Slot {
  uint64_t x, n, tweak, start, cycle;
  int bits;
};

// StratifiedEpoch::batch's working space, kept per thread so that a batch allocates nothing.
struct Scratch {
  std::vector<Slot> slots;
  std::vector<uint32_t> classes, walking;
};

Scratch& batch_scratch() {
  thread_local Scratch scratch;
  return scratch;
}

}  // namespace

// Where each class's stream stands at the start of the epoch: position epoch * draws_c.
struct StratifiedEpoch::Stream {
  uint64_t cycle = 0, position = 0;  // divmod(epoch * draws_c, count_c)
  uint64_t key = 0;                  // the class's key
  uint64_t tweak = 0;                // of that cycle's permutation
  uint64_t count = 0, start = 0;     // the class's samples: how many, where in the grouping
};

struct StratifiedEpoch::Data {
  std::shared_ptr<const Block> full;  // the rows of full batches
  std::shared_ptr<const Block> tail;  // the final partial batches (drop_last=false), or null
  std::vector<Stream> streams;        // per class
};

StratifiedEpoch::StratifiedEpoch(std::shared_ptr<const StratifiedPlan::Layout> layout,
                                 uint64_t epoch)
    : layout_(std::move(layout)), epoch_(epoch) {
  const StratifiedPlan::Layout& l = *layout_;
  const uint32_t C = l.classes->num_classes();
  auto data = std::make_shared<Data>();
  std::vector<uint64_t> full_total, tail_total;
  if (l.weighted) {
    full_total = l.full_total;
    tail_total = l.tail_total;
  } else {
    TailCounts tail = tail_counts(l, epoch);
    full_total.resize(C);
    for (uint32_t c = 0; c < C; ++c) full_total[c] = l.classes->count(c) - tail.real[c];
    if (l.tail_rows > 0) tail_total = std::move(tail.padded);
  }
  if (l.full_rows > 0)
    data->full =
        make_block(l, epoch, 0, l.full_rows, l.batch_size, full_total, std::vector<uint64_t>(C, 0));
  if (l.tail_rows > 0)
    data->tail = make_block(l, epoch, 1, l.tail_rows, l.tail_length, tail_total, full_total);
  data->streams.resize(C);
  for (uint32_t c = 0; c < C; ++c) {
    const u128 start = static_cast<u128>(epoch) * l.draws[c];
    Stream& st = data->streams[c];
    st.cycle = static_cast<uint64_t>(start / l.count(c));
    st.position = static_cast<uint64_t>(start % l.count(c));
    st.key = StratifiedPlan::Layout::class_key(l.round_keys[0], c);
    st.tweak = StratifiedPlan::Layout::tweak(st.key, st.cycle);
    st.count = l.count(c);
    st.start = l.classes->start(c);
  }
  data_ = std::move(data);
}

void StratifiedEpoch::batch(uint64_t b, std::span<uint64_t> out, std::span<uint64_t> cycles) const {
  const StratifiedPlan::Layout& l = *layout_;
  check_batch(l.plan, b);
  if (out.size() != l.plan.batch_length(b))
    throw InvalidArgument("StratifiedEpoch::batch: out has the wrong size");
  if (!cycles.empty() && cycles.size() != out.size())
    throw InvalidArgument("StratifiedEpoch::batch: cycles has the wrong size");
  const uint64_t row = b * l.world + l.rank;
  const bool in_full = row < l.full_rows;
  const Block& blk = in_full ? *data_->full : *data_->tail;
  const uint64_t i = in_full ? row : row - l.full_rows;
  const uint64_t grid_row = i / blk.width, grid_column = i % blk.width;

  // The row's slots as (class, position in the class's stream this epoch): the base slots of
  // every class, then one extra per column of the extras matrix.
  Scratch& scratch = batch_scratch();
  std::vector<Slot>& slots = scratch.slots;
  slots.resize(out.size());
  size_t s = 0;
  const auto add = [&](uint32_t c, uint64_t position) {
    const Stream& st = data_->streams[c];
    Slot& slot = slots[s++];
    slot.start = st.start;
    slot.n = st.count;
    slot.x = st.position + position;
    slot.tweak = st.tweak;
    slot.cycle = st.cycle;
    if (slot.x >= slot.n) {  // past the epoch's first cycle (a repeated class, or padding)
      slot.cycle += slot.x / slot.n;
      slot.x %= slot.n;
      slot.tweak = StratifiedPlan::Layout::tweak(st.key, slot.cycle);
    }
    slot.bits = StratifiedPlan::Layout::domain_bits(slot.n);
  };
  for (uint32_t c : blk.base_classes) {
    const Block::PerClass& k = blk.classes[c];
    const uint64_t first = Block::first_position(k, i, grid_row, grid_column);
    for (uint64_t t = 0; t < k.base; ++t) add(c, first + t);
  }
  // Extras: find every slot's class first and ask for its records, so that the cache misses
  // of a long tail's many classes overlap instead of queueing one slot after another.
  const uint64_t at = blk.offset_of_row(grid_row, grid_column);
  std::vector<uint32_t>& extra = scratch.classes;
  extra.resize(blk.extras_per_row);
  for (uint64_t j = 0; j < blk.extras_per_row; ++j) {
    extra[j] = blk.class_at(j * blk.rows + at);
    __builtin_prefetch(&blk.classes[extra[j]]);
    __builtin_prefetch(&data_->streams[extra[j]]);
  }
  for (const uint32_t c : extra) {
    const Block::PerClass& k = blk.classes[c];
    add(c, Block::first_position(k, i, grid_row, grid_column) + k.base);
  }

  // Each slot's permutation, walked side by side as EpochOrder::map walks (the CPU overlaps
  // the chains; no unpredictable branch), then the sample it names.
  std::vector<uint32_t>& walking = scratch.walking;
  walking.resize(slots.size());
  size_t count = 0;
  for (size_t k = 0; k < slots.size(); ++k) {
    Slot& slot = slots[k];
    slot.x = slot.n > 1 ? l.permute(slot.x, slot.bits, slot.tweak) : 0;
    walking[count] = static_cast<uint32_t>(k);
    count += slot.x >= slot.n;
  }
  while (count > 0) {
    size_t still = 0;
    for (size_t w = 0; w < count; ++w) {
      Slot& slot = slots[walking[w]];
      slot.x = l.permute(slot.x, slot.bits, slot.tweak);
      walking[still] = walking[w];
      still += slot.x >= slot.n;
    }
    count = still;
  }
  for (size_t k = 0; k < slots.size(); ++k)
    out[k] = l.classes->grouped(slots[k].start + slots[k].x);
  if (!cycles.empty())
    for (size_t k = 0; k < slots.size(); ++k) cycles[k] = slots[k].cycle;

  // Mix the row (Fisher-Yates, two 32-bit draws from each random word): without it a batch
  // would list its samples class by class.
  SampleRng rng(hash_key(l.seed, kRowShuffle, 0), epoch_, row);
  uint64_t bits = 0;
  for (size_t k = out.size(); k > 1; --k) {
    if (k % 2 == out.size() % 2) bits = rng.next_u64();
    const uint64_t draw = k % 2 == out.size() % 2 ? bits & 0xffffffff : bits >> 32;
    const size_t other = (draw * k) >> 32;
    std::swap(out[k - 1], out[other]);
    if (!cycles.empty()) std::swap(cycles[k - 1], cycles[other]);
  }
}

}  // namespace stoker
