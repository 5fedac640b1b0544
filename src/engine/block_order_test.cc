#include "stoker/block_order.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "stoker/errors.h"
#include "stoker/loader.h"

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

TEST(BlockOrder, RejectsEmptyBlocksAndZeroWindow) {
  const std::vector<uint64_t> sizes{3, 0, 2};
  EXPECT_THROW(BlockOrder(sizes, 1, 0, 0), InvalidArgument);
  const std::vector<uint64_t> ok{3, 2};
  EXPECT_THROW(BlockOrder(ok, 0, 0, 0), InvalidArgument);
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
    LoaderOptions o;
    o.batch_size = 16;
    o.shuffle = true;
    o.seed = 11;
    o.num_workers = workers;
    Loader loader(src, o);
    auto it = loader.iterate(3);
    uint64_t p = 0;
    while (auto b = it->next()) {
      const auto* v = reinterpret_cast<const int64_t*>(b->fields[0].data);
      for (uint64_t s = 0; s < b->length; ++s, ++p)
        ASSERT_EQ(static_cast<uint64_t>(v[s]), expected[p]) << "workers " << workers;
    }
    EXPECT_EQ(p, src->size());
  }
  LoaderOptions o;
  o.batch_size = 16;
  Loader plain(src, o);
  const auto indices = plain.epoch_indices(0);
  for (uint64_t i = 0; i < indices.size(); ++i) ASSERT_EQ(indices[i], i);
}

}  // namespace
}  // namespace stoker
