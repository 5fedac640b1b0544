// BENCHMARK-ONLY: the decode bound of bench/bench_video.py and bench/bench_lerobot.py, what a
// decoder that throws nothing away cannot beat. Built only with the C++ tests or STOKER_TESTING
// (stoker_ffmpeg_bench; from Python: stoker._video.testing.decode_bound): never in a wheel.
//
// Each job (path, first frame, last frame) is decoded from the keyframe before its first frame to
// its last, every frame, none converted: a bare FFmpeg loop (VideoReader::decode_span), on
// `threads` threads taking jobs in turn. The videos' indexes are built first, outside the timing
// (Stoker's are cached too).
//
// Thread safety: a free function; it runs its own threads and returns when they are joined.
// Errors: the first error a thread meets (IoError, DecodeError as VideoReader's), rethrown after
// every thread has stopped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stoker::video {

struct DecodeJob {
  std::string path;
  uint64_t first = 0, last = 0;  // frames, in presentation order; REQUIRES: first <= last
};

struct DecodeBound {
  double seconds = 0;   // wall time of the decoding (not of the indexing)
  uint64_t frames = 0;  // frames decoded
};

// REQUIRES: every job's last frame is a frame of its video. threads < 1 counts as 1;
// decoder_threads: FFmpeg's own threads per decoder (as VideoReader's).
DecodeBound decode_bound(const std::vector<DecodeJob>& jobs, int threads, int decoder_threads);

}  // namespace stoker::video
