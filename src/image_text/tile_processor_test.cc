#include "stoker/image_text/tile_processor.h"

#include <gtest/gtest.h>

#include <vector>

#include "image/test_images.h"
#include "stoker/errors.h"
#include "stoker/image/resize.h"

namespace stoker::image_text {
namespace {

// LLaVA-v1.6's defaults: 336 px tiles of 14 px patches over five pinpoints.
TEST(TileProcessor, ChoosesTheResolutionAndCountsTokensAsTransformers) {
  const TileProcessor p({});
  // 500x300: (336, 672) keeps all 150,000 pixels and wastes the least.
  EXPECT_EQ(p.best_resolution(300, 500), std::make_pair(336, 672));
  EXPECT_EQ(p.resized_size(300, 500), std::make_pair(336, 560));  // 500 * 1.12 ceiled
  EXPECT_EQ(p.tiles(300, 500), 3);
  // Tokens: a 24 x 48 grid less 4 columns of padding each side: 24 * 40 + 24 newlines, plus the
  // base tile's 576 + 1 (CLS), less the CLS ("default").
  EXPECT_EQ(p.image_tokens(300, 500), 24 * 40 + 24 + 577 - 1);
  // A square image takes the 672 x 672 grid: 48 x 48 + 48 newlines + 576.
  EXPECT_EQ(p.best_resolution(700, 700), std::make_pair(672, 672));
  EXPECT_EQ(p.image_tokens(700, 700), 48 * 48 + 48 + 576);
  EXPECT_EQ(p.tiles(700, 700), 5);
  EXPECT_EQ(p.max_tiles(), 5);
  int64_t info[2];
  p.info(300, 500, info);
  EXPECT_EQ(info[0], 300);
  EXPECT_EQ(info[1], 500);
  EXPECT_EQ(p.row_shape(), (std::vector<int64_t>{3, 336, 336}));
  EXPECT_EQ(p.info_name(), "image_sizes");
  TileProcessorOptions full;
  full.drop_cls = false;
  EXPECT_EQ(TileProcessor(full).image_tokens(700, 700), 48 * 48 + 48 + 577);
}

// The base tile is the whole image resized; the grid's tiles are the image resized to fit,
// centred on black, row by row; every value through the rescale and normalize.
TEST(TileProcessor, TilesAreTheBaseThenTheCanvasRowByRow) {
  TileProcessorOptions o;
  o.tile = 8;
  o.patch_size = 4;
  o.pinpoints = {{8, 16}, {16, 8}, {16, 16}};
  o.mean = {0.5f, 0.25f, 0.0f};
  o.std = {0.5f, 0.5f, 1.0f};
  const TileProcessor p(o);
  const int w = 20, h = 9;  // wider than (8, 16): its width fills it, its height ceiled
  ASSERT_EQ(p.best_resolution(h, w), std::make_pair(8, 16));
  const auto [rh, rw] = p.resized_size(h, w);
  EXPECT_EQ(rw, 16);
  EXPECT_EQ(rh, 8);  // min(ceil(9 * 0.8), 8)
  const std::vector<uint8_t> rgb = image::testing::pattern_rgb(w, h, 3);
  std::vector<float> out(3 * 3 * 8 * 8);
  std::vector<uint8_t> scratch;
  p.fill(rgb, w, h, out, scratch);
  const auto value = [&](int c, uint8_t v) {
    return (static_cast<float>(v * (1.0 / 255.0)) - o.mean[c]) / o.std[c];
  };
  std::vector<uint8_t> base(8 * 8 * 3), fit(16 * 8 * 3);
  image::resize_rgb(rgb, w, h, {0, 0, float(w), float(h)}, 8, 8, base,
                    image::ResizeFilter::kBicubic);
  image::resize_rgb(rgb, w, h, {0, 0, float(w), float(h)}, 16, 8, fit,
                    image::ResizeFilter::kBicubic);
  for (int c = 0; c < 3; ++c)
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 8; ++x) {
        ASSERT_EQ(out[(c * 8 + y) * 8 + x], value(c, base[(y * 8 + x) * 3 + c]));
        for (int t = 0; t < 2; ++t)  // tiles 1 and 2: the left and right halves
          ASSERT_EQ(out[((1 + t) * 3 + c) * 64 + y * 8 + x],
                    value(c, fit[(y * 16 + t * 8 + x) * 3 + c]));
      }
  // A narrow image, 5 x 30, fits (16, 8) as 3 x 16: its columns centred, black either side.
  const int nw = 5, nh = 30;
  ASSERT_EQ(p.best_resolution(nh, nw), std::make_pair(16, 8));
  const auto [nrh, nrw] = p.resized_size(nh, nw);
  EXPECT_EQ(nrh, 16);
  EXPECT_EQ(nrw, 3);  // ceil(5 * 16 / 30)
  const std::vector<uint8_t> narrow = image::testing::pattern_rgb(nw, nh, 4);
  std::vector<float> tiles(3 * 3 * 64);
  p.fill(narrow, nw, nh, tiles, scratch);
  for (int t = 1; t < 3; ++t)
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 8; ++x) {
        const bool black = x < 2 || x >= 5;  // paste_x = (8 - 3) / 2 = 2
        if (black) {
          ASSERT_EQ(tiles[(t * 3 + 0) * 64 + y * 8 + x], value(0, 0)) << t << y << x;
        } else {
          ASSERT_NE(tiles[(t * 3 + 0) * 64 + y * 8 + x], value(0, 0)) << t << y << x;
        }
      }
}

TEST(TileProcessor, RefusesBadOptions) {
  TileProcessorOptions o;
  o.pinpoints = {{336, 500}};
  EXPECT_THROW(TileProcessor{o}, InvalidArgument);
  o = {};
  o.pinpoints.clear();
  EXPECT_THROW(TileProcessor{o}, InvalidArgument);
  o = {};
  o.std[1] = 0;
  EXPECT_THROW(TileProcessor{o}, InvalidArgument);
  EXPECT_THROW(TileProcessor({}).image_tokens(0, 10), InvalidArgument);
}

}  // namespace
}  // namespace stoker::image_text
