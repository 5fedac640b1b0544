#include "stoker/ffmpeg/reader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <random>

#include "engine/test_temp_dir.h"
#include "stoker/errors.h"
#include "ffmpeg/test_videos.h"

namespace stoker::video {
namespace {

using stoker::testing::TempDir;
using testing::TestVideo;

// The frame a picture shows: its grey level (away from the moving square), as a test frame.
int frame_shown(image::Picture& p, int frames) {
  const int x = p.width() / 2, y = p.height() * 3 / 4;
  const image::RgbRegion r = p.rgb(x, y, x + 1, y + 1);
  const uint8_t* px = r.data + (y - r.y0) * r.stride + 3 * (x - r.x0);
  EXPECT_NEAR(px[0], px[1], 2);
  EXPECT_NEAR(px[1], px[2], 2);
  return testing::frame_of_rgb(px[1], frames);
}

// The frames shown for `wanted`, read with `reader`.
std::vector<int> shown(VideoReader& reader, const VideoIndex& index,
                       const std::vector<uint64_t>& wanted, int frames) {
  std::vector<int> out(wanted.size(), -1);
  reader.read_frames(index, wanted, [&](size_t k, image::Picture& p, int64_t pts) {
    EXPECT_EQ(pts, index.pts[wanted[k]]);
    out[k] = frame_shown(p, frames);
  });
  return out;
}

std::vector<int> as_int(const std::vector<uint64_t>& v) { return {v.begin(), v.end()}; }

TEST(VideoReader, IndexesEveryFrameInPresentationOrderWithItsKeyframes) {
  TempDir dir;
  const std::string path = dir.path("v.mp4");
  testing::write_test_video(path, TestVideo{.frames = 30, .gop = 10, .b_frames = 2});
  VideoReader reader;
  reader.open(path);
  const VideoIndex index = reader.build_index();
  EXPECT_EQ(index.frames(), 30u);
  EXPECT_EQ(index.width, 64);
  EXPECT_EQ(index.height, 48);
  EXPECT_EQ(index.codec, "mpeg4");
  EXPECT_TRUE(std::is_sorted(index.pts.begin(), index.pts.end()));
  ASSERT_GE(index.keyframes.size(), 3u);  // every 10 frames at least (the encoder may add)
  EXPECT_EQ(index.keyframes[0].pts, index.pts[0]);
  for (uint64_t i = 0; i < 30; ++i) {
    const size_t k = index.keyframe_for(i);
    EXPECT_LE(index.keyframes[k].pts, index.pts[i]) << i;
    if (k + 1 < index.keyframes.size()) {
      EXPECT_GT(index.keyframes[k + 1].pts, index.pts[i]) << i;
    }
  }
  EXPECT_NEAR(index.seconds(index.pts[25]) - index.seconds(index.pts[0]), 1.0, 1e-9);
}

class EveryContainer : public ::testing::TestWithParam<const char*> {};

TEST_P(EveryContainer, DeliversExactlyTheWantedFramesForwardBackwardAndRepeated) {
  TempDir dir;
  const std::string path = dir.path(std::string("v.") + GetParam());
  testing::write_test_video(path, TestVideo{.frames = 40, .gop = 12, .b_frames = 2});
  VideoReader reader;
  reader.open(path);
  const VideoIndex index = reader.build_index();
  ASSERT_EQ(index.frames(), 40u);
  std::mt19937 gen(7);
  for (int round = 0; round < 25; ++round) {
    std::vector<uint64_t> wanted;
    const uint64_t start = gen() % 40, step = 1 + gen() % 4;
    for (uint64_t f = start; f < 40 && wanted.size() < 6; f += step) wanted.push_back(f);
    if (round % 5 == 0) wanted.push_back(wanted.back());  // a short clip repeats its last
    EXPECT_EQ(shown(reader, index, wanted, 40), as_int(wanted)) << "round " << round;
  }
}

INSTANTIATE_TEST_SUITE_P(Containers, EveryContainer, ::testing::Values("mp4", "mkv", "avi"));

TEST(VideoReader, DecodesLessThanEveryFrameFromTheKeyframe) {
  TempDir dir;
  const std::string path = dir.path("v.mp4");
  testing::write_test_video(path, TestVideo{.frames = 60, .gop = 30, .b_frames = 3});
  VideoReader reader;
  reader.open(path);
  const VideoIndex index = reader.build_index();
  // Frames 10, 20 and 28 of a GOP that starts at 0: a naive decoder outputs 29 frames.
  const std::vector<uint64_t> wanted{10, 20, 28};
  EXPECT_EQ(shown(reader, index, wanted, 60), as_int(wanted));
  EXPECT_LT(reader.stats().frames_decoded, 29u);
  EXPECT_GE(reader.stats().frames_decoded, 3u);
}

TEST(VideoReader, GoesOnForwardWithinAGopInsteadOfSeekingBack) {
  TempDir dir;
  const std::string path = dir.path("v.mp4");
  testing::write_test_video(path, TestVideo{.frames = 60, .gop = 30, .b_frames = 0});
  VideoReader reader;
  reader.open(path);
  const VideoIndex index = reader.build_index();
  EXPECT_EQ(shown(reader, index, {2, 4}, 60), (std::vector<int>{2, 4}));
  const uint64_t seeks = reader.stats().seeks;
  EXPECT_EQ(shown(reader, index, {8, 9}, 60), (std::vector<int>{8, 9}));
  EXPECT_EQ(reader.stats().seeks, seeks);
  EXPECT_EQ(shown(reader, index, {1}, 60), (std::vector<int>{1}));  // backwards: a seek
  EXPECT_EQ(reader.stats().seeks, seeks + 1);
  reader.open(path);  // the open file: kept
  EXPECT_EQ(reader.stats().opens, 1u);
}

TEST(VideoReader, AVideoInMemoryReadsAsItsFileDoes) {
  TempDir dir;
  const std::string path = dir.path("v.mkv");
  testing::write_test_video(path, TestVideo{.frames = 30, .gop = 8});
  std::ifstream in(path, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), {});
  std::vector<std::byte> bytes(data.size());
  std::memcpy(bytes.data(), data.data(), data.size());
  VideoReader file, memory;
  file.open(path);
  memory.open_bytes("shard.tar:v.mkv", bytes);
  EXPECT_TRUE(memory.is_open("shard.tar:v.mkv"));
  const VideoIndex a = file.build_index(), b = memory.build_index();
  EXPECT_EQ(a.pts, b.pts);
  const std::vector<uint64_t> wanted{3, 12, 29};
  EXPECT_EQ(shown(memory, b, wanted, 30), as_int(wanted));
  EXPECT_EQ(shown(memory, b, {20, 21}, 30), (std::vector<int>{20, 21}));
  memory.open_bytes("shard.tar:v.mkv", {});  // the open one: kept, the bytes not needed
  EXPECT_EQ(shown(memory, b, {1}, 30), (std::vector<int>{1}));
  try {
    memory.open_bytes("shard.tar:cut.mkv",
                      std::vector<std::byte>(bytes.begin(), bytes.begin() + 40));
    ADD_FAILURE();
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("shard.tar:cut.mkv"), std::string::npos) << e.what();
  }
}

TEST(VideoIndex, ASidecarRoundTripsAndIsRefusedWhenStaleOrDamaged) {
  TempDir dir;
  const std::string path = dir.path("v.mp4");
  testing::write_test_video(path, TestVideo{.frames = 30, .gop = 8});
  VideoReader reader;
  reader.open(path);
  const VideoIndex index = reader.build_index();
  const std::string bytes = serialize_index(index, 1234);
  auto span = [](const std::string& s) {
    return std::span<const std::byte>(reinterpret_cast<const std::byte*>(s.data()), s.size());
  };
  const std::optional<VideoIndex> back = parse_index(span(bytes), 1234);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->pts, index.pts);
  EXPECT_EQ(back->codec, index.codec);
  EXPECT_EQ(back->time_base_den, index.time_base_den);
  ASSERT_EQ(back->keyframes.size(), index.keyframes.size());
  EXPECT_EQ(back->keyframes.back().dts, index.keyframes.back().dts);
  EXPECT_FALSE(parse_index(span(bytes), 1235).has_value());  // the video changed size
  for (size_t cut = 0; cut < bytes.size(); cut += 7)
    EXPECT_FALSE(parse_index(span(bytes.substr(0, cut)), 1234).has_value()) << cut;
  std::string damaged = bytes;
  damaged[8] = 9;  // another version
  EXPECT_FALSE(parse_index(span(damaged), 1234).has_value());
  EXPECT_EQ(sidecar_path("a/b.mp4"), "a/b.mp4.stoker-index");
}

TEST(VideoReader, VideosEncodedAlikeShareADecoderAndDecodeAsAlone) {
  TempDir dir;
  testing::write_test_video(dir.path("a.mp4"), TestVideo{.frames = 20, .gop = 5});
  testing::write_test_video(dir.path("b.mp4"), TestVideo{.frames = 30, .gop = 5});
  testing::write_test_video(dir.path("wide.mp4"), TestVideo{.frames = 20, .width = 96});
  VideoReader reader;
  auto read = [&](const char* name, std::vector<uint64_t> wanted, int frames) {
    reader.open(dir.path(name));
    const VideoIndex index = reader.build_index();
    return shown(reader, index, wanted, frames);
  };
  EXPECT_EQ(read("a.mp4", {3, 17}, 20), (std::vector<int>{3, 17}));
  EXPECT_EQ(read("b.mp4", {1, 28}, 30), (std::vector<int>{1, 28}));  // mid-GOP state flushed
  EXPECT_EQ(reader.stats().decoder_reuses, 1u);
  EXPECT_EQ(read("wide.mp4", {4}, 20), (std::vector<int>{4}));  // another size: a new decoder
  EXPECT_EQ(reader.stats().decoder_reuses, 1u);
  EXPECT_EQ(read("a.mp4", {0, 19}, 20), (std::vector<int>{0, 19}));
  EXPECT_EQ(reader.stats().opens, 4u);
}

TEST(VideoReader, NamesTheFileOfEveryBadInput) {
  TempDir dir;
  VideoReader reader;
  auto fails_with = [&](const std::string& path, const std::string& what) {
    try {
      reader.open(path);
      reader.read_frames(reader.build_index(), std::vector<uint64_t>{0},
                         [](size_t, image::Picture&, int64_t) {});
      ADD_FAILURE() << path << " did not fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  EXPECT_THROW(reader.open(dir.path("missing.mp4")), IoError);
  fails_with(dir.path("missing.mp4"), "cannot open");
  { std::ofstream(dir.path("empty.mp4")); }
  EXPECT_THROW(reader.open(dir.path("empty.mp4")), DecodeError);
  { std::ofstream(dir.path("noise.mp4")) << std::string(4096, 'x'); }
  EXPECT_THROW(reader.open(dir.path("noise.mp4")), DecodeError);
  testing::write_test_video(dir.path("audio.wav"), TestVideo{.audio_only = true});
  fails_with(dir.path("audio.wav"), "has no video stream");
  // An mp4 cut in half: its moov atom (written last) is gone.
  testing::write_test_video(dir.path("whole.mp4"), TestVideo{.frames = 30});
  {
    std::ifstream in(dir.path("whole.mp4"), std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(dir.path("cut.mp4"), std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  EXPECT_THROW(reader.open(dir.path("cut.mp4")), DecodeError);
  // Still usable after every failure.
  reader.open(dir.path("whole.mp4"));
  const VideoIndex index = reader.build_index();
  EXPECT_EQ(shown(reader, index, {3, 17}, 30), (std::vector<int>{3, 17}));
}

TEST(VideoReader, AStreamShorterThanItsIndexIsADecodeErrorWithTheTimestamp) {
  TempDir dir;
  testing::write_test_video(dir.path("long.mkv"), TestVideo{.frames = 40, .gop = 10});
  testing::write_test_video(dir.path("short.mkv"), TestVideo{.frames = 20, .gop = 10});
  VideoReader reader;
  reader.open(dir.path("long.mkv"));
  const VideoIndex long_index = reader.build_index();
  reader.open(dir.path("short.mkv"));
  try {  // the index of another file: frame 35 is not there
    reader.read_frames(long_index, std::vector<uint64_t>{35},
                       [](size_t, image::Picture&, int64_t) {});
    ADD_FAILURE() << "no error";
  } catch (const DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("short.mkv"), std::string::npos) << e.what();
    // The keyframe frame 35 decodes from (frame 30, at 1.2 s) is not in the shorter file.
    EXPECT_NE(std::string(e.what()).find("keyframe at t=1.200 s is not where its index says"),
              std::string::npos)
        << e.what();
  }
}

TEST(VideoReader, SurvivesCorruptPacketsMidStream) {
  TempDir dir;
  testing::write_test_video(dir.path("v.avi"), TestVideo{.frames = 40, .gop = 10});
  std::string bytes;
  {
    std::ifstream in(dir.path("v.avi"), std::ios::binary);
    bytes.assign((std::istreambuf_iterator<char>(in)), {});
  }
  std::mt19937 gen(3);
  for (int trial = 0; trial < 12; ++trial) {
    std::string bad = bytes;
    for (int k = 0; k < 40; ++k) bad[bytes.size() / 4 + gen() % (bytes.size() / 2)] = char(gen());
    const std::string path = dir.path("bad" + std::to_string(trial) + ".avi");
    std::ofstream(path, std::ios::binary) << bad;
    VideoReader reader;
    try {
      reader.open(path);
      const VideoIndex index = reader.build_index();
      std::vector<uint64_t> all(index.frames());
      for (uint64_t i = 0; i < all.size(); ++i) all[i] = i;
      reader.read_frames(index, all, [](size_t, image::Picture& p, int64_t) {
        p.rgb(0, 0, p.width(), p.height());
      });
    } catch (const DecodeError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace stoker::video
