#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>

#include "engine/test_temp_dir.h"
#include "stoker/engine.h"
#include "stoker/errors.h"
#include "stoker/video/video_source.h"
#include "ffmpeg/test_videos.h"

namespace stoker {
namespace {

using stoker::testing::TempDir;
using video::testing::TestVideo;

// A pipeline that keeps the frames as they are (uint8 CHW of the video's size).
std::shared_ptr<const image::ImagePipeline> as_is(int h, int w) {
  return std::make_shared<const image::ImagePipeline>(
      std::vector<image::Transform>{image::CenterCrop{h, w}});
}

struct Clip {
  std::vector<uint8_t> pixels;
  int64_t label = 0;
  std::vector<double> stamps;
};

Clip read(const VideoSource& s, uint64_t index, uint64_t epoch = 0, uint64_t seed = 5) {
  Clip c;
  c.pixels.resize(s.fields()[0].sample_bytes());
  c.stamps.resize(s.options().timestamps ? s.options().frames : 0);
  std::vector<std::byte*> slots{reinterpret_cast<std::byte*>(c.pixels.data()),
                                reinterpret_cast<std::byte*>(&c.label)};
  if (s.options().timestamps) slots.push_back(reinterpret_cast<std::byte*>(c.stamps.data()));
  auto state = s.make_worker_state();
  s.read({seed, epoch, index}, slots, state.get());
  return c;
}

// The test frame each of a TCHW (or CTHW) clip's frames shows.
std::vector<int> frames_of(const Clip& c, int t, int h, int w, int frames, bool cthw = false) {
  std::vector<int> out;
  const size_t plane = static_cast<size_t>(h) * w;
  for (int k = 0; k < t; ++k) {
    const size_t g = cthw ? (1 * t + k) * plane : (k * 3 + 1) * plane;  // the green plane
    out.push_back(video::testing::frame_of_rgb(c.pixels[g + (h * 3 / 4) * w + w / 2], frames));
  }
  return out;
}

class VideoSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    video::testing::write_test_video(dir.path("a.mp4"), TestVideo{.frames = 50, .gop = 10});
    video::testing::write_test_video(dir.path("b.mkv"), TestVideo{.frames = 30, .gop = 8});
    video::testing::write_test_video(dir.path("short.mp4"), TestVideo{.frames = 5, .gop = 5});
  }
  std::vector<VideoFile> files() {
    return {{dir.path("a.mp4"), 3}, {dir.path("b.mkv"), 7}, {dir.path("short.mp4"), 1}};
  }
  TempDir dir;
};

TEST_F(VideoSourceTest, ClipsEvenlySpacedByStrideWithTheirLabelsAndTimes) {
  ClipOptions o{
      .frames = 4, .stride = 3, .clips_per_video = 3, .random = false, .timestamps = true};
  VideoSource s(files(), as_is(48, 64), o);
  ASSERT_EQ(s.size(), 9u);
  EXPECT_EQ(s.fields()[0].shape, (std::vector<int64_t>{4, 3, 48, 64}));
  EXPECT_EQ(s.fields()[2].shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(s.labels(), (std::vector<int64_t>{3, 3, 3, 7, 7, 7, 1, 1, 1}));
  // a.mp4: 50 frames, a clip spans 10: starts 0, 20, 40.
  for (int j = 0; j < 3; ++j) {
    const Clip c = read(s, j);
    const int f = 20 * j;
    EXPECT_EQ(frames_of(c, 4, 48, 64, 50), (std::vector<int>{f, f + 3, f + 6, f + 9}));
    EXPECT_EQ(c.label, 3);
    for (int k = 0; k < 4; ++k) EXPECT_NEAR(c.stamps[k] - c.stamps[0], 3 * k / 25.0, 1e-9);
  }
  // short.mp4: 5 frames, shorter than a clip: frames 0, 3, then the last again.
  const Clip c = read(s, 7);
  EXPECT_EQ(frames_of(c, 4, 48, 64, 5), (std::vector<int>{0, 3, 4, 4}));
  EXPECT_EQ(c.stamps[2], c.stamps[3]);
}

TEST_F(VideoSourceTest, RandomStartsDependOnSeedEpochAndIndexOnly) {
  ClipOptions o{.frames = 3, .stride = 2, .clips_per_video = 2, .random = true};
  VideoSource s(files(), as_is(48, 64), o);
  std::set<int> starts;
  for (uint64_t epoch = 0; epoch < 12; ++epoch) {
    const std::vector<int> f = frames_of(read(s, 1, epoch), 3, 48, 64, 50);
    EXPECT_EQ(f[1], f[0] + 2);
    EXPECT_EQ(f[2], f[0] + 4);
    EXPECT_LE(f[2], 49);
    starts.insert(f[0]);
    EXPECT_EQ(read(s, 1, epoch).pixels, read(s, 1, epoch).pixels);
  }
  EXPECT_GT(starts.size(), 6u);
}

TEST_F(VideoSourceTest, FramesByTimestampAtAnFpsAndBetweenStartAndEnd) {
  const video::VideoIndex index = [&] {
    video::VideoReader r;
    r.open(dir.path("a.mp4"));
    return r.build_index();
  }();
  const double first = index.seconds(index.pts[0]);
  // Frames 10..29 of 25 fps: from first + 0.4 s to before first + 1.2 s.
  std::vector<VideoFile> v{{dir.path("a.mp4"), 0, first + 0.4, first + 1.2}};
  ClipOptions o{.frames = 5, .fps = 10, .random = false, .timestamps = true};
  VideoSource s(v, as_is(48, 64), o);
  const Clip c = read(s, 0);
  // 0.4 s of clip in frames 10..29 (0.76 s): centred start at frame 14.5; then every 2.5 frames.
  EXPECT_EQ(frames_of(c, 5, 48, 64, 50), (std::vector<int>{14, 17, 19, 22, 24}));
  EXPECT_NEAR(c.stamps[0], first + 14 / 25.0, 1e-9);
  std::vector<VideoFile> none{{dir.path("a.mp4"), 0, 5.0, 6.0}};
  VideoSource empty(none, as_is(48, 64), o);
  try {
    read(empty, 0);
    ADD_FAILURE();
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("no frames between t=5.000 s"), std::string::npos)
        << e.what();
  }
}

TEST_F(VideoSourceTest, CthwPutsTimeInsideEachChannel) {
  ClipOptions o{.frames = 4, .stride = 2, .random = false, .cthw = true};
  VideoSource s(files(), as_is(48, 64), o);
  EXPECT_EQ(s.fields()[0].shape, (std::vector<int64_t>{3, 4, 48, 64}));
  ClipOptions t = o;
  t.cthw = false;
  VideoSource tchw(files(), as_is(48, 64), t);
  EXPECT_EQ(frames_of(read(s, 0), 4, 48, 64, 50, true), frames_of(read(tchw, 0), 4, 48, 64, 50));
}

TEST_F(VideoSourceTest, EveryFrameOfAClipGetsTheSameRandomCropAndFlip) {
  // Random crops of 32x32 resized to 16x16 with a flip: frames differ only by their grey level,
  // so each frame's pixels minus its grey are the same pattern (the square's crop) or none.
  auto pipeline = std::make_shared<const image::ImagePipeline>(
      std::vector<image::Transform>{image::RandomResizedCrop{16, 16, {0.2, 1.0}, {0.75, 1.333}},
                                    image::RandomHorizontalFlip{0.5}});
  ClipOptions o{.frames = 2, .stride = 1, .random = false};
  std::vector<VideoFile> v{{dir.path("a.mp4"), 0}};
  VideoSource s(v, pipeline, o);
  // The square does not move between frames 24 and 25? It moves by 2 px: compare the crop box
  // through the flat parts instead: a clip's two frames have their grey edges in the same place.
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const Clip c = read(s, 0, 0, seed);
    const size_t frame = 3 * 16 * 16;
    int same_shape = 0;
    for (size_t i = 0; i < frame; ++i) {
      const bool a = c.pixels[i] > 200, b = c.pixels[frame + i] > 200;  // the white square
      same_shape += a == b;
    }
    EXPECT_GT(same_shape, static_cast<int>(frame * 9 / 10)) << seed;
  }
}

TEST_F(VideoSourceTest, AShrinkingResizeConvertsAtAReducedSizeCloseToTheFullSizePath) {
  // Resize to a half, a quarter and an eighth of the frame: the picture is converted and then
  // halved once per factor of 2 (each pixel the mean of the 2x2 below it), instead of
  // converted whole and resampled; the two agree within rounding.
  video::testing::write_test_video(dir.path("big.mkv"),
                                   TestVideo{.frames = 12, .width = 128, .height = 96});
  for (const int f : {2, 4, 8}) {
    auto pipeline = [f](double ratio) {
      image::PipelineOptions o;
      o.dct_min_ratio = ratio;
      return std::make_shared<const image::ImagePipeline>(
          std::vector<image::Transform>{image::Resize{96 / f, 128 / f}}, o);
    };
    std::vector<VideoFile> v{{dir.path("big.mkv"), 0}};
    const ClipOptions o{.frames = 3, .stride = 4, .random = false};
    VideoSource scaled(v, pipeline(1.0), o), full(v, pipeline(0.0), o);
    const Clip a = read(scaled, 0), b = read(full, 0);
    ASSERT_EQ(a.pixels.size(), b.pixels.size());
    double diff = 0;
    int worst = 0;
    for (size_t i = 0; i < a.pixels.size(); ++i) {
      diff += std::abs(a.pixels[i] - b.pixels[i]);
      worst = std::max(worst, std::abs(a.pixels[i] - b.pixels[i]));
    }
    EXPECT_LT(diff / a.pixels.size(), 1.5) << f;
    EXPECT_LE(worst, 64) << f;  // at the square's edges (215 levels): a box against a triangle
  }
}

TEST_F(VideoSourceTest, BatchesAreBitIdenticalWhateverTheWorkers) {
  auto pipeline = std::make_shared<const image::ImagePipeline>(
      std::vector<image::Transform>{image::RandomResizedCrop{24, 24, {0.3, 1.0}, {0.75, 1.333}},
                                    image::RandomHorizontalFlip{0.5}});
  auto s = std::make_shared<VideoSource>(
      files(), pipeline, ClipOptions{.frames = 4, .stride = 2, .clips_per_video = 3});
  auto run = [&](int workers) {
    EngineOptions o;
    o.batch_size = 2;
    o.shuffle = true;
    o.seed = 11;
    o.num_workers = workers;
    Engine engine(s, o);
    std::vector<std::vector<uint8_t>> out;
    std::multiset<int64_t> labels;
    auto it = engine.iterate(1);
    while (auto b = it->next()) {
      const auto* p = reinterpret_cast<const uint8_t*>(b->fields[0].data);
      out.emplace_back(p, p + b->length * s->fields()[0].sample_bytes());
      const auto* l = reinterpret_cast<const int64_t*>(b->fields[1].data);
      labels.insert(l, l + b->length);
    }
    EXPECT_EQ(labels, (std::multiset<int64_t>{1, 1, 1, 3, 3, 3, 7, 7, 7}));
    return out;
  };
  const auto one = run(0);
  EXPECT_EQ(run(1), one);
  EXPECT_EQ(run(3), one);
  EXPECT_GT(s->stats().clips, 0u);
  EXPECT_LE(s->stats().index_builds, 3u * 4u);  // one per video and racing thread at most
}

TEST_F(VideoSourceTest, AFrameOfAnotherSizeIsNamedWhenTheSizeIsExact) {
  video::testing::write_test_video(dir.path("big.mp4"), TestVideo{.frames = 10, .width = 80});
  std::vector<VideoFile> v{{dir.path("a.mp4"), 0}, {dir.path("big.mp4"), 0}};
  VideoSource s(v, as_is(48, 64), ClipOptions{.frames = 2, .random = false, .exact_size = true});
  read(s, 0);
  try {
    read(s, 1);
    ADD_FAILURE();
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("big.mp4: its frames are 80x48, not 64x48"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(VideoSourceTest, TheIndexCacheStaysWithinItsBudget) {
  ClipOptions o{.frames = 2, .random = false, .index_cache_bytes = 1};
  VideoSource s(files(), as_is(48, 64), o);
  for (uint64_t i = 0; i < 3; ++i) read(s, i);
  for (uint64_t i = 0; i < 3; ++i) read(s, i);
  EXPECT_EQ(s.stats().index_builds, 6u);  // room for one index: every read builds its own
  EXPECT_LT(s.stats().index_cache_bytes, 2000u);
}

}  // namespace
}  // namespace stoker
