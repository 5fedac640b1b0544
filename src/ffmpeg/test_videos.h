// Test videos, encoded with FFmpeg's own encoders: no files checked in, no external tools.
//
// write_test_video() encodes `frames` frames in which frame i is a flat grey of luma
// test_luma(i) with a small moving square (so that motion search has something to do), in the
// container the path's extension names (mp4, mkv, avi, ...).
#pragma once

#include <cstdint>
#include <string>

namespace stoker::video::testing {

struct TestVideo {
  int frames = 30;
  int width = 64, height = 48;
  int fps = 25;
  int gop = 10;      // a keyframe every gop frames
  int b_frames = 2;  // consecutive B-frames
  std::string codec = "mpeg4";
  bool audio_only = false;  // no video stream at all (an audio stream of silence)
};

// Frame i's luma (and, with neutral chroma, its R = G = B after conversion: rgb_of_luma()).
int test_luma(int frame);
int rgb_of_luma(int luma);
// The frame a flat grey of `rgb` was made from (the nearest test_luma).
int frame_of_rgb(int rgb, int frames);

// Writes the video; throws std::runtime_error when FFmpeg cannot.
void write_test_video(const std::string& path, const TestVideo& spec = {});

}  // namespace stoker::video::testing
