#include "stoker/block_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "stoker/testing/faulty.h"
#include "stoker/errors.h"
#include "stoker/engine.h"

namespace stoker {
namespace {

std::vector<uint64_t> materialize(const BlockOrder& o) {
  std::vector<uint64_t> v(o.size());
  for (uint64_t i = 0; i < o.size(); ++i) v[i] = o[i];
  return v;
}

// The block of each sample, from the sizes.
std::vector<uint64_t> block_of(const std::vector<uint64_t>& sizes) {
  std::vector<uint64_t> out;
  for (uint64_t b = 0; b < sizes.size(); ++b) out.insert(out.end(), sizes[b], b);
  return out;
}

std::vector<uint64_t> random_sizes(std::mt19937_64& rng, size_t blocks, uint64_t max) {
  std::vector<uint64_t> sizes(blocks);
  for (auto& s : sizes) s = 1 + rng() % max;
  return sizes;
}

TEST(BlockOrder, VisitsEverySampleOnceForAnySizesAndWindow) {
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    const auto sizes = random_sizes(rng, 1 + rng() % 40, 1 + rng() % 50);
    const uint64_t window = 1 + rng() % 8;
    auto v = materialize(BlockOrder(sizes, window, rng(), trial));
    std::sort(v.begin(), v.end());
    for (uint64_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], i) << "trial " << trial;
  }
}

// Each window's positions hold exactly its blocks' samples: the blocks of window w are read in
// positions [start_w, start_w+1) and nowhere else.
TEST(BlockOrder, EachBlockIsReadWithinOneWindow) {
  std::mt19937_64 rng(9);
  for (int trial = 0; trial < 100; ++trial) {
    const auto sizes = random_sizes(rng, 2 + rng() % 30, 1 + rng() % 40);
    const uint64_t window = 1 + rng() % 5;
    const auto blocks = block_of(sizes);
    const BlockOrder o(sizes, window, 3, trial);
    // Walk the positions; a new block may only appear when the previous window's blocks are
    // all finished, and at most `window` blocks are open at once.
    std::vector<uint64_t> left(sizes);
    std::vector<uint64_t> open;
    for (uint64_t p = 0; p < o.size(); ++p) {
      const uint64_t b = blocks[o[p]];
      if (std::find(open.begin(), open.end(), b) == open.end()) {
        if (open.size() == window) {
          for (uint64_t x : open) ASSERT_EQ(left[x], 0u) << "a block opened before its window";
          open.clear();
        }
        open.push_back(b);
      }
      ASSERT_GT(left[b], 0u);
      --left[b];
    }
  }
}

TEST(BlockOrder, DependsOnlyOnSeedEpochSizesAndWindow) {
  const std::vector<uint64_t> sizes{100, 100, 37, 100, 64};
  EXPECT_EQ(materialize(BlockOrder(sizes, 2, 7, 1)), materialize(BlockOrder(sizes, 2, 7, 1)));
  EXPECT_NE(materialize(BlockOrder(sizes, 2, 7, 1)), materialize(BlockOrder(sizes, 2, 7, 2)));
  EXPECT_NE(materialize(BlockOrder(sizes, 2, 7, 1)), materialize(BlockOrder(sizes, 2, 8, 1)));
  EXPECT_NE(materialize(BlockOrder(sizes, 2, 7, 1)), materialize(BlockOrder(sizes, 3, 7, 1)));
}

// Windows of equal sizes are permuted differently, and the blocks' own order changes.
TEST(BlockOrder, EqualWindowsArePermutedApart) {
  const std::vector<uint64_t> sizes(8, 50);
  const auto v = materialize(BlockOrder(sizes, 1, 1, 0));
  std::vector<std::vector<uint64_t>> offsets;
  for (uint64_t w = 0; w < 8; ++w) {
    std::vector<uint64_t> in_block;
    for (uint64_t k = 0; k < 50; ++k) in_block.push_back(v[w * 50 + k] % 50);
    offsets.push_back(in_block);
  }
  for (uint64_t w = 1; w < 8; ++w) EXPECT_NE(offsets[w], offsets[0]);
  std::vector<uint64_t> first_blocks;
  for (uint64_t w = 0; w < 8; ++w) first_blocks.push_back(v[w * 50] / 50);
  EXPECT_FALSE(std::is_sorted(first_blocks.begin(), first_blocks.end()));
}

TEST(BlockOrder, OneWindowMixesEveryBlock) {
  const std::vector<uint64_t> sizes(10, 100);
  const auto v = materialize(BlockOrder(sizes, 10, 4, 0));
  // The first 100 positions draw from most blocks, not from one.
  std::vector<int> seen(10);
  for (uint64_t p = 0; p < 100; ++p) seen[v[p] / 100] = 1;
  EXPECT_GE(std::count(seen.begin(), seen.end(), 1), 8);
}

TEST(BlockOrder, MapGivesWhatIndexingGives) {
  const std::vector<uint64_t> sizes{5, 1, 300, 17, 17, 90};
  const BlockOrder o(sizes, 2, 3, 4);
  std::vector<uint64_t> positions;
  for (uint64_t p = 0; p < o.size(); p += 3) positions.push_back(p);
  std::vector<uint64_t> out(positions.size());
  o.map(positions, out);
  for (size_t i = 0; i < positions.size(); ++i) EXPECT_EQ(out[i], o[positions[i]]);
}

// The order before stripes existed (values from that release): stripes = 1 keeps it bit for bit.
TEST(BlockOrder, OneStripeIsTheUnstripedOrderOfEarlierReleases) {
  const std::vector<uint64_t> sizes{5, 1, 30, 17, 17, 9, 2, 40};
  const std::vector<uint64_t> expected{
      37,  38,  45,  73, 46, 47,  78,  36,  50,  76, 71,  40, 43,  48,  44,  52,  75,  39,
      72,  51,  42,  70, 74, 49,  41,  5,   77,  56, 30,  6,  25,  10,  62,  12,  53,  33,
      20,  67,  35,  54, 3,  32,  61,  69,  68,  34, 29,  15, 60,  14,  24,  8,   57,  22,
      55,  16,  31,  28, 18, 13,  26,  1,   17,  21, 63,  65, 2,   27,  0,   19,  66,  64,
      59,  4,   11,  7,  58, 9,   23,  113, 101, 92, 119, 90, 79,  85,  102, 112, 82,  97,
      120, 87,  111, 80, 96, 115, 106, 103, 89,  94, 86,  88, 104, 109, 81,  107, 108, 105,
      118, 116, 84,  99, 98, 93,  100, 91,  114, 95, 117, 83, 110};
  EXPECT_EQ(materialize(BlockOrder(sizes, 3, 1, 7, 2)), expected);
  EXPECT_EQ(materialize(BlockOrder(sizes, 3, 7, 2)), expected);
  const std::vector<uint64_t> equal(6, 4);
  EXPECT_EQ(materialize(BlockOrder(equal, 2, 1, 99, 0)),
            (std::vector<uint64_t>{19, 2,  17, 16, 1, 0, 3,  18, 15, 10, 12, 8,
                                   11, 14, 9,  13, 7, 4, 21, 23, 22, 20, 5,  6}));
}

TEST(BlockOrder, StripedVisitsEverySampleOnce) {
  std::mt19937_64 rng(17);
  for (int trial = 0; trial < 300; ++trial) {
    // Sizes alike, or very unequal (1 to thousands), and windows past the block count.
    std::vector<uint64_t> sizes = random_sizes(rng, 1 + rng() % 30, 1 + rng() % 60);
    if (trial % 3 == 0)
      for (auto& s : sizes) s = rng() % 4 == 0 ? 1 + rng() % 3000 : 1 + rng() % 5;
    for (uint64_t stripes : {1, 2, 3, 7}) {
      for (uint64_t window : {1, 2, 5, 100}) {
        auto v = materialize(BlockOrder(sizes, window, stripes, rng(), trial));
        std::sort(v.begin(), v.end());
        for (uint64_t i = 0; i < v.size(); ++i)
          ASSERT_EQ(v[i], i) << "trial " << trial << " stripes " << stripes << " window " << window;
      }
    }
  }
}

// The positions of each window (window * stripes blocks) hold exactly its blocks' samples, as
// without stripes: a reader keeps two windows' blocks at most.
TEST(BlockOrder, StripedWindowsKeepTheirBlocks) {
  std::mt19937_64 rng(23);
  for (int trial = 0; trial < 100; ++trial) {
    const auto sizes = random_sizes(rng, 2 + rng() % 30, 1 + rng() % 40);
    const uint64_t window = 1 + rng() % 3, stripes = 1 + rng() % 4;
    const auto blocks = block_of(sizes);
    const BlockOrder o(sizes, window, stripes, 3, trial);
    std::vector<uint64_t> left(sizes);
    std::vector<uint64_t> open;
    for (uint64_t p = 0; p < o.size(); ++p) {
      const uint64_t b = blocks[o[p]];
      if (std::find(open.begin(), open.end(), b) == open.end()) {
        if (open.size() == window * stripes) {
          for (uint64_t x : open) ASSERT_EQ(left[x], 0u) << "a block opened before its window";
          open.clear();
        }
        open.push_back(b);
      }
      --left[b];
    }
  }
}

// With blocks of equal size, rank r of a `stripes`-rank job reads, within each full window, the
// `window` blocks of its group and no other. (The last window, when partly filled, has groups
// short of blocks, whose ranks read the others' overflow: any of its blocks.)
TEST(BlockOrder, EachRankKeepsWindowBlocksOpen) {
  for (uint64_t stripes : {2, 3, 7}) {
    for (uint64_t window : {1, 2, 5}) {
      const uint64_t block = 37, full = 4;
      const uint64_t blocks = window * stripes * full + window * stripes / 2;  // and a partial
      const std::vector<uint64_t> sizes(blocks, block);
      const BlockOrder o(sizes, window, stripes, 5, 1);
      const uint64_t per_window = window * stripes * block;
      for (uint64_t w = 0; w < full; ++w) {
        for (uint64_t r = 0; r < stripes; ++r) {
          std::vector<uint64_t> touched;
          for (uint64_t p = w * per_window + r; p < (w + 1) * per_window; p += stripes)
            touched.push_back(o[p] / block);
          std::sort(touched.begin(), touched.end());
          touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
          EXPECT_EQ(touched.size(), window) << "stripes " << stripes << " window " << window;
        }
      }
    }
  }
}

// Sizes that differ a little overflow a few samples a window: each rank's blocks stay near
// `window` a window (a block of another group supplies a few of its samples).
TEST(BlockOrder, NearlyEqualBlocksOverflowLittle) {
  std::mt19937_64 rng(29);
  std::vector<uint64_t> sizes(320);
  for (auto& s : sizes) s = 95 + rng() % 11;
  const uint64_t window = 4, stripes = 8;
  const BlockOrder o(sizes, window, stripes, 1, 0);
  const auto blocks = block_of(sizes);
  // The windows' runs of positions: window * stripes blocks each (320 blocks: 10 windows).
  uint64_t first = 0, touched = 0, runs = 0;
  for (uint64_t w = 0; w < 10; ++w) {
    // The window's blocks are the first window * stripes seen; it ends where their samples do.
    uint64_t end = first;
    std::vector<uint64_t> window_blocks;
    uint64_t samples = 0;
    for (uint64_t p = first; p < o.size(); ++p) {
      const uint64_t b = blocks[o[p]];
      if (std::find(window_blocks.begin(), window_blocks.end(), b) == window_blocks.end()) {
        if (window_blocks.size() == window * stripes) break;
        window_blocks.push_back(b);
        samples += sizes[b];
      }
      end = p + 1;
      if (end - first == samples && window_blocks.size() == window * stripes) break;
    }
    for (uint64_t r = 0; r < stripes; ++r) {
      std::vector<uint64_t> mine;
      for (uint64_t p = first + (r + stripes - first % stripes) % stripes; p < end; p += stripes)
        mine.push_back(blocks[o[p]]);
      std::sort(mine.begin(), mine.end());
      touched += std::unique(mine.begin(), mine.end()) - mine.begin();
      ++runs;
    }
    first = end;
  }
  EXPECT_EQ(first, o.size());
  const double mean = double(touched) / double(runs);
  EXPECT_GE(mean, double(window));
  EXPECT_LE(mean, double(window) + 2.5) << "blocks a rank reads a window";
}

TEST(BlockOrder, BlocksInOrderIsFirstUseOfEachBlock) {
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 60; ++trial) {
    const auto sizes = random_sizes(rng, 1 + rng() % 25, 1 + rng() % 30);
    const uint64_t stripes = 1 + rng() % 4;
    const BlockOrder o(sizes, 1 + rng() % 3, stripes, rng(), trial);
    const auto blocks = block_of(sizes);
    for (uint64_t world : {uint64_t{1}, stripes, stripes + 1}) {
      const uint64_t start = rng() % (o.size() + 1);
      for (uint64_t rank = 0; rank < world; ++rank) {
        std::vector<uint64_t> expected;
        for (uint64_t p = start + rank; p < o.size(); p += world) {
          const uint64_t b = blocks[o[p]];
          if (std::find(expected.begin(), expected.end(), b) == expected.end())
            expected.push_back(b);
        }
        ASSERT_EQ(o.blocks_in_order(start, rank, world), expected) << "trial " << trial;
      }
    }
    for (uint64_t p = 0; p < o.size(); ++p) {
      ASSERT_EQ(o.block_at(p), blocks[o[p]]);
      ASSERT_EQ(o.block_of_sample(p), blocks[p]);
    }
  }
  EXPECT_THROW(BlockOrder(std::vector<uint64_t>{3}, 1, 1, 0, 0).blocks_in_order(0, 0, 0),
               InvalidArgument);
}

TEST(BlockOrder, StripesChangeTheOrderButNotTheBlocksPermutation) {
  const std::vector<uint64_t> sizes(16, 10);
  const auto one = materialize(BlockOrder(sizes, 2, 1, 7, 1));
  const auto four = materialize(BlockOrder(sizes, 2, 4, 7, 1));
  EXPECT_NE(one, four);
  EXPECT_EQ(materialize(BlockOrder(sizes, 2, 4, 7, 1)), four);
}

TEST(BlockOrder, RejectsEmptyBlocksAndZeroWindow) {
  const std::vector<uint64_t> sizes{3, 0, 2};
  EXPECT_THROW(BlockOrder(sizes, 1, 0, 0), InvalidArgument);
  const std::vector<uint64_t> ok{3, 2};
  EXPECT_THROW(BlockOrder(ok, 0, 0, 0), InvalidArgument);
  EXPECT_THROW(BlockOrder(ok, 1, 0, 0, 0), InvalidArgument);  // no stripes
  EXPECT_EQ(BlockOrder(std::vector<uint64_t>{}, 1, 0, 0).size(), 0u);
}

// A source with blocks: the shuffled loader reads it in the block order, whatever the workers;
// unshuffled it reads in sample order.
class BlockedSource final : public Source {
 public:
  BlockedSource(std::vector<uint64_t> sizes, uint64_t window)
      : sizes_(std::move(sizes)), window_(window), fields_{{"i", kInt64, {}}} {
    for (uint64_t s : sizes_) n_ += s;
  }
  uint64_t size() const override { return n_; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read(const SampleKey& key, std::span<std::byte* const> slots, WorkerState*) const override {
    const auto v = static_cast<int64_t>(key.index);
    std::memcpy(slots[0], &v, sizeof v);
  }
  Blocks blocks() const override { return {sizes_, window_}; }

 private:
  std::vector<uint64_t> sizes_;
  uint64_t window_;
  uint64_t n_ = 0;
  std::vector<FieldSpec> fields_;
};

TEST(BlockOrder, ShuffledLoaderFollowsItWhateverTheWorkers) {
  const std::vector<uint64_t> sizes{40, 40, 40, 25, 40, 40};
  auto src = std::make_shared<BlockedSource>(sizes, 2);
  const BlockOrder expected(sizes, 2, 11, 3);
  for (int workers : {0, 1, 3}) {
    EngineOptions o;
    o.batch_size = 16;
    o.shuffle = true;
    o.seed = 11;
    o.num_workers = workers;
    Engine loader(src, o);
    auto it = loader.iterate(3);
    uint64_t p = 0;
    while (auto b = it->next()) {
      const auto* v = reinterpret_cast<const int64_t*>(b->fields[0].data);
      for (uint64_t s = 0; s < b->length; ++s, ++p)
        ASSERT_EQ(static_cast<uint64_t>(v[s]), expected[p]) << "workers " << workers;
    }
    EXPECT_EQ(p, src->size());
  }
  EngineOptions o;
  o.batch_size = 16;
  Engine plain(src, o);
  const auto indices = plain.epoch_indices(0);
  for (uint64_t i = 0; i < indices.size(); ++i) ASSERT_EQ(indices[i], i);
}

// A source in shards, as a remote one: sample i holds i.
std::shared_ptr<FaultySource> sharded(std::vector<uint64_t> shards) {
  uint64_t n = 0;
  for (uint64_t s : shards) n += s;
  return std::make_shared<FaultySource>(n, 1, std::set<uint64_t>{}, 0, std::move(shards));
}

EngineOptions shard_options(uint64_t rank, uint64_t world_size, int workers) {
  EngineOptions o;
  o.batch_size = 8;
  o.shuffle = true;
  o.seed = 21;
  o.num_workers = workers;
  o.rank = rank;
  o.world_size = world_size;
  o.shard_window = 2;
  return o;
}

// Every sample of the iteration, batch after batch.
std::vector<uint64_t> read_all(EpochIterator& it) {
  std::vector<uint64_t> out;
  while (auto b = it.next()) {
    const auto* v = reinterpret_cast<const int64_t*>(b->fields[0].data);
    out.insert(out.end(), v, v + b->length);
  }
  return out;
}

TEST(ShardOrder, LoaderFollowsItWhateverTheWorkers) {
  const std::vector<uint64_t> shards{30, 30, 30, 30, 25, 30, 30, 30, 7, 30, 30};
  auto src = sharded(shards);
  const BlockOrder expected(shards, 2, 3, 21, 4);  // the loader's world size: 3 stripes
  for (uint64_t rank = 0; rank < 3; ++rank) {
    std::vector<uint64_t> first;
    for (int workers : {0, 1, 3}) {
      Engine loader(src, shard_options(rank, 3, workers));
      EXPECT_EQ(loader.options().shard_window, 2u);
      EXPECT_EQ(loader.options().stripes, 3u);
      const auto got = read_all(*loader.iterate(4));
      ASSERT_EQ(got.size(), loader.samples_per_rank());
      for (uint64_t k = 0; k < got.size(); ++k)
        ASSERT_EQ(got[k], expected[loader.plan().global_position(k)]) << "workers " << workers;
      if (workers == 0) first = got;
      EXPECT_EQ(got, first);
      EXPECT_EQ(loader.epoch_indices(4), first);
    }
  }
}

TEST(ShardOrder, RanksGetEqualBatchesAndTogetherEverySample) {
  const std::vector<uint64_t> shards{40, 40, 40, 40, 40, 40, 40, 33};
  auto src = sharded(shards);
  for (uint64_t world : {2, 3, 5}) {
    std::vector<uint64_t> seen(src->size());
    uint64_t batches = 0;
    for (uint64_t rank = 0; rank < world; ++rank) {
      Engine loader(src, shard_options(rank, world, 0));
      if (rank == 0) batches = loader.num_batches();
      EXPECT_EQ(loader.num_batches(), batches);
      const auto got = loader.epoch_indices(1);
      for (uint64_t k = 0; k < got.size(); ++k)
        if (loader.plan().global_position(k) == rank + k * world) ++seen[got[k]];  // not padding
    }
    for (uint64_t i = 0; i < seen.size(); ++i) ASSERT_EQ(seen[i], 1u) << "sample " << i;
  }
}

// A job of 4 ranks stops mid-epoch; one of 3 goes on from where it stopped with the epoch's
// arrangement (stripes = 4): together they read every sample exactly once.
TEST(ShardOrder, ElasticResumeWithTheEpochsStripesCompletesTheEpoch) {
  const std::vector<uint64_t> shards{50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 12};
  auto src = sharded(shards);
  const uint64_t n = src->size(), epoch = 2, stopped = 5;
  std::vector<uint64_t> seen(n);
  uint64_t reached = 0;
  for (uint64_t rank = 0; rank < 4; ++rank) {
    Engine loader(src, shard_options(rank, 4, 1));
    auto it = loader.iterate(epoch);
    for (uint64_t b = 0; b < stopped; ++b) {
      auto batch = it->next();
      const auto* v = reinterpret_cast<const int64_t*>(batch->fields[0].data);
      for (uint64_t s = 0; s < batch->length; ++s) ++seen[v[s]];
    }
    reached = loader.plan().position_after(stopped);
  }
  for (uint64_t rank = 0; rank < 3; ++rank) {
    Engine loader(src, shard_options(rank, 3, 2));
    EXPECT_EQ(loader.options().stripes, 3u);  // later epochs: the new world size
    const BatchPlan plan(n, 8, false, rank, 3, reached);
    const auto got = read_all(*loader.iterate(epoch, 0, plan, 4));
    for (uint64_t k = 0; k < got.size(); ++k)
      if (plan.global_position(k) >= reached) ++seen[got[k]];  // not padding
    // The fetcher's schedule is the iteration's blocks in first-use order.
    std::vector<uint64_t> blocks;
    for (uint64_t sample : got) {
      uint64_t b = 0, first = 0;
      while (sample >= first + shards[b]) first += shards[b++];
      if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
    }
    EXPECT_EQ(loader.block_schedule(epoch, 0, plan, 4), blocks);
  }
  for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1u) << "sample " << i;
}

TEST(ShardOrder, BlockScheduleIsTheEpochsBlocksInFirstUse) {
  const std::vector<uint64_t> shards{20, 35, 20, 20, 9, 20, 20};
  auto src = sharded(shards);
  const auto block_of_sample = block_of(shards);
  for (uint64_t rank = 0; rank < 2; ++rank) {
    Engine loader(src, shard_options(rank, 2, 0));
    for (uint64_t start_batch : {0, 3}) {
      const auto indices = loader.epoch_indices(7);
      std::vector<uint64_t> expected;
      for (uint64_t k = start_batch * 8; k < indices.size(); ++k) {
        const uint64_t b = block_of_sample[indices[k]];
        if (std::find(expected.begin(), expected.end(), b) == expected.end()) expected.push_back(b);
      }
      EXPECT_EQ(loader.block_schedule(7, start_batch), expected);
    }
  }
  EngineOptions plain = shard_options(0, 1, 0);
  plain.shard_window = 0;
  EXPECT_TRUE(Engine(src, plain).block_schedule(0).empty());  // no block order
}

TEST(ShardOrder, NeedsShardsOrBlocksAndShuffle) {
  auto flat = std::make_shared<FaultySource>(100, 1, std::set<uint64_t>{});
  try {
    Engine loader(flat, shard_options(0, 1, 0));
    FAIL() << "a source without shards took shard_window";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("needs a source with shards"), std::string::npos);
  }
  EngineOptions unshuffled = shard_options(0, 1, 0);
  unshuffled.shuffle = false;
  EXPECT_THROW(Engine(sharded({50, 50}), unshuffled), InvalidArgument);
  // Blocks stand in for shards, with the loader's window.
  const std::vector<uint64_t> sizes{40, 40, 40, 25, 40, 40};
  EngineOptions o = shard_options(1, 2, 0);
  o.shard_window = 3;
  Engine blocked(std::make_shared<BlockedSource>(sizes, 1), o);
  EXPECT_EQ(blocked.options().shard_window, 3u);
  const BlockOrder expected(sizes, 3, 2, 21, 0);
  const auto got = blocked.epoch_indices(0);
  for (uint64_t k = 0; k < got.size(); ++k)
    ASSERT_EQ(got[k], expected[blocked.plan().global_position(k)]);
}

// A source with blocks (Parquet row groups) keeps its window, striped by the world size.
TEST(ShardOrder, BlocksAreStripedByTheWorldSize) {
  const std::vector<uint64_t> sizes{40, 40, 40, 25, 40, 40, 40, 40};
  auto src = std::make_shared<BlockedSource>(sizes, 2);
  EngineOptions o = shard_options(1, 2, 0);
  o.shard_window = 0;
  Engine loader(src, o);
  EXPECT_EQ(loader.options().shard_window, 2u);
  EXPECT_EQ(loader.options().stripes, 2u);
  const BlockOrder expected(sizes, 2, 2, 21, 5);
  const auto got = loader.epoch_indices(5);
  for (uint64_t k = 0; k < got.size(); ++k)
    ASSERT_EQ(got[k], expected[loader.plan().global_position(k)]);
  o.stripes = 1;  // explicitly unstriped: the order of earlier releases
  const BlockOrder unstriped(sizes, 2, 1, 21, 5);
  Engine one(src, o);
  const auto got1 = one.epoch_indices(5);
  for (uint64_t k = 0; k < got1.size(); ++k)
    ASSERT_EQ(got1[k], unstriped[one.plan().global_position(k)]);
}

}  // namespace
}  // namespace stoker
