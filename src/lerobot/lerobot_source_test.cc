#include <gtest/gtest.h>

#include <cstring>

#include "engine/test_temp_dir.h"
#include "stoker/errors.h"
#include "stoker/lerobot/lerobot_source.h"
#include "ffmpeg/test_videos.h"

namespace stoker {
namespace {

using stoker::testing::TempDir;
using video::testing::TestVideo;

constexpr int kFps = 25;

// One video of 30 frames holding two episodes of 10 steps (frames 0..9 and 10..19: the second
// starts 0.4 s after the first), and a third whose start is off by 0.01 s (beyond the tolerance).
// Each step's "index" value is its row.
struct Fixture {
  TempDir dir;
  std::string path = dir.path("file-000.mp4");
  Fixture() {
    TestVideo spec;
    spec.fps = kFps;
    video::testing::write_test_video(path, spec);
  }
  std::shared_ptr<LeRobotSource> source(std::vector<int64_t> camera_deltas,
                                        std::vector<int64_t> value_deltas, bool third = false) {
    const int episodes = third ? 3 : 2;
    std::vector<float> stamps;
    std::vector<int64_t> rows;
    for (int e = 0; e < episodes; ++e)
      for (int k = 0; k < 10; ++k) {
        stamps.push_back(static_cast<float>(k) / kFps);
        rows.push_back(static_cast<int64_t>(rows.size()));
      }
    StepValue index{"index", kInt64, {}, {}, value_deltas};
    index.data.resize(rows.size() * sizeof(int64_t));
    std::memcpy(index.data.data(), rows.data(), index.data.size());
    StepCamera cam;
    cam.name = "cam";
    cam.pipeline = std::make_shared<const image::ImagePipeline>(
        std::vector<image::Transform>{image::CenterCrop{48, 64}});
    cam.exact_size = true;
    cam.deltas = camera_deltas;
    cam.video.assign(episodes, path);
    cam.from = {0.04, 0.44};  // frame i shows at (i + 1) / 25 s (the encoder's B-frame delay)
    if (third) cam.from.push_back(0.45);
    StepEpisodes eps;
    for (int e = 0; e <= episodes; ++e) eps.starts.push_back(10u * e);
    for (int e = 0; e < episodes; ++e) eps.ids.push_back(5 + e);
    std::vector<StepValue> values;
    values.push_back(std::move(index));
    return std::make_shared<LeRobotSource>(std::move(values), stamps, std::vector<StepCamera>{cam},
                                           eps, std::vector<int64_t>{}, 1e-4, 1, 1 << 20);
  }
};

struct Step {
  std::vector<uint8_t> frames;
  std::vector<int64_t> index;
  std::vector<uint8_t> camera_pad, value_pad;
};

Step read(const LeRobotSource& s, uint64_t row) {
  const auto& f = s.fields();
  Step out;
  out.frames.resize(f[0].sample_bytes());
  out.index.resize(f[1].sample_bytes() / sizeof(int64_t));
  std::vector<std::byte*> slots{reinterpret_cast<std::byte*>(out.frames.data()),
                                reinterpret_cast<std::byte*>(out.index.data())};
  for (size_t k = 2; k < f.size(); ++k) {
    std::vector<uint8_t>& pad = f[k].name == "cam_is_pad" ? out.camera_pad : out.value_pad;
    pad.resize(f[k].sample_bytes());
    slots.push_back(reinterpret_cast<std::byte*>(pad.data()));
  }
  auto state = s.make_worker_state();
  s.read({1, 0, row}, slots, state.get());
  return out;
}

// The source frame shown by frame k of a step's frames (flat grey away from the moving square:
// the green plane's pixel there says).
int frame_at(const Step& s, size_t k) {
  constexpr size_t plane = 48 * 64;
  return video::testing::frame_of_rgb(s.frames[(k * 3 + 1) * plane + 36 * 64 + 32], 30);
}

TEST(LeRobotSource, FramesAtEachStepsTimeFromItsEpisodesStartInTheSharedVideo) {
  Fixture fx;
  auto s = fx.source({}, {});
  ASSERT_EQ(s->size(), 20u);
  EXPECT_EQ(s->fields()[0].shape, (std::vector<int64_t>{3, 48, 64}));
  EXPECT_EQ(s->fields()[1].shape, (std::vector<int64_t>{}));
  for (uint64_t row : {0u, 3u, 9u, 10u, 14u, 19u}) {
    const Step step = read(*s, row);
    EXPECT_EQ(frame_at(step, 0), static_cast<int>(row)) << row;
    EXPECT_EQ(step.index[0], static_cast<int64_t>(row));
  }
  EXPECT_EQ(s->path(12), "episode 6, step 2 (" + fx.path + ")");
}

TEST(LeRobotSource, DeltasClampToTheEpisodeAndSayWhereTheyPad) {
  Fixture fx;
  auto s = fx.source({-1, 0, 2}, {1, -2});
  ASSERT_EQ(s->fields().size(), 4u);
  EXPECT_EQ(s->fields()[0].shape, (std::vector<int64_t>{3, 3, 48, 64}));
  EXPECT_EQ(s->fields()[2].name, "cam_is_pad");
  EXPECT_EQ(s->fields()[3].name, "index_is_pad");
  const Step first = read(*s, 10);    // episode 6's first step
  EXPECT_EQ(frame_at(first, 0), 10);  // delta -1: clamped to the step itself
  EXPECT_EQ(frame_at(first, 1), 10);
  EXPECT_EQ(frame_at(first, 2), 12);
  EXPECT_EQ(first.camera_pad, (std::vector<uint8_t>{1, 0, 0}));
  EXPECT_EQ(first.index, (std::vector<int64_t>{11, 10}));
  EXPECT_EQ(first.value_pad, (std::vector<uint8_t>{0, 1}));
  const Step last = read(*s, 9);  // episode 5's last step: nothing from episode 6
  EXPECT_EQ(frame_at(last, 2), 9);
  EXPECT_EQ(last.camera_pad, (std::vector<uint8_t>{0, 0, 1}));
  EXPECT_EQ(last.index, (std::vector<int64_t>{9, 7}));
}

TEST(LeRobotSource, DeltasInAnyOrderKeepTheirOrder) {
  Fixture fx;
  auto s = fx.source({3, -2, 0}, {});
  const Step step = read(*s, 4);
  EXPECT_EQ(frame_at(step, 0), 7);
  EXPECT_EQ(frame_at(step, 1), 2);
  EXPECT_EQ(frame_at(step, 2), 4);
}

TEST(LeRobotSource, AFrameBeyondTheToleranceNamesEpisodeCameraAndTime) {
  Fixture fx;
  auto s = fx.source({}, {}, /*third=*/true);
  EXPECT_EQ(frame_at(read(*s, 5), 0), 5);
  try {
    read(*s, 21);
    FAIL() << "no error";
  } catch (const DecodeError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("episode 7, camera cam: " + fx.path), std::string::npos) << what;
    EXPECT_NE(what.find("no frame within 0.000100 s of t=0.490000 s"), std::string::npos) << what;
  }
}

TEST(LeRobotSource, AMissingVideoIsAnIoErrorNamingTheEpisode) {
  Fixture fx;
  auto s = fx.source({}, {});
  std::remove(fx.path.c_str());
  EXPECT_THROW(
      {
        try {
          read(*s, 0);
        } catch (const IoError& e) {
          EXPECT_NE(std::string(e.what()).find("episode 5, camera cam"), std::string::npos);
          throw;
        }
      },
      IoError);
}

TEST(LeRobotSource, InconsistentInputsAreRefused) {
  auto pipeline = std::make_shared<const image::ImagePipeline>(
      std::vector<image::Transform>{image::CenterCrop{4, 4}});
  StepEpisodes eps{{0, 3}, {0}};
  EXPECT_THROW(LeRobotSource({}, {0.f, 0.1f}, {}, eps, {}, 1e-4, 1, 1024), InvalidArgument);
  StepValue short_value{"x", kFloat32, {2}, std::vector<std::byte>(8), {}};
  EXPECT_THROW(LeRobotSource({short_value}, {0.f, 0.1f, 0.2f}, {}, eps, {}, 1e-4, 1, 1024),
               InvalidArgument);
  StepCamera no_videos{"cam", pipeline, true, {}, {}, {}};
  EXPECT_THROW(LeRobotSource({}, {0.f, 0.1f, 0.2f}, {no_videos}, eps, {}, 1e-4, 1, 1024),
               InvalidArgument);
}

}  // namespace
}  // namespace stoker
