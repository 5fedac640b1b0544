// VideoSource: clips of videos, decoded by the worker threads (FFmpeg) straight into batch slots.
//
// Fields: "clip" (frames x the pipeline's output shape, [T, C, H, W]; or [C, T, H, W] with
// ClipOptions::cthw), "label" (int64 scalar) and, with ClipOptions::timestamps, "timestamps"
// ([T] float64, each frame's presentation time in seconds as FFmpeg and PyAV give it).
//
// Sample i is clip i % clips_per_video of video i / clips_per_video. Its frames:
// - by stride: frames start + t * stride (t < frames) of the video's frames in presentation
//   order (those between its start and end times, when given);
// - by fps: the frame shown at time t0 + t / fps: the last whose timestamp is at or before it.
// The start (frame or time) is drawn uniformly from SampleRng(seed ^ kClipStream, epoch, i) when
// ClipOptions::random, else clips_per_video starts evenly spaced from the first possible to the
// last (one clip: the middle). A video shorter than a clip repeats its last frame (the
// timestamps say so). Every frame runs the pipeline with a copy of SampleRng(seed, epoch, i): one
// set of random parameters per clip, the same crop, flip and jitter on every frame.
//
// Contract:
// - Thread safety: immutable but for its index cache and counters (both synchronized); read()
//   is safe from any number of threads, each with its own WorkerState (a VideoReader, which keeps
//   its last video open for the next clip of it).
// - Indexes: read from the video's sidecar (<video>.stoker-index, `stoker index`) when there is
//   one that describes it, else built by demuxing the video once (index_builds counts those);
//   kept in a cache of at most ClipOptions::index_cache_bytes, least recently used first out.
// - Errors: read() throws IoError (a file that cannot be opened) or DecodeError naming the file
//   and, where there is one, the timestamp (no video stream, an unsupported codec, no frames
//   between the start and end times, corrupt or truncated data, frames of a size other than the
//   fixed one); the loader names the sample.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/image/pipeline.h"
#include "stoker/source.h"
#include "stoker/sources/image_files.h"
#include "stoker/ffmpeg/reader.h"

namespace stoker {

struct VideoFile {
  std::string path;
  int64_t label = 0;
  double start = 0;  // seconds: only frames at or after it (0: from the first)
  double end = 0;    // seconds: only frames before it (<= 0: to the last)
};

struct ClipOptions {
  static constexpr uint64_t kClipStream = 0x636c6970u;  // "clip": the start's random stream
  uint32_t frames = 16;
  uint32_t stride = 1;
  double fps = 0;  // > 0: frames by timestamp at this rate (stride is then unused)
  uint32_t clips_per_video = 1;
  bool random = true;       // random starts; false: evenly spaced
  bool timestamps = false;  // add the "timestamps" field
  bool cthw = false;        // [C, T, H, W] instead of [T, C, H, W] (a CHW pipeline)
  // The frames must be the pipeline's output size already (a pipeline that only crops to it):
  // a video of another size is a DecodeError naming its size.
  bool exact_size = false;
  int decoder_threads = 1;
  uint64_t index_cache_bytes = 64ull << 20;
};

// The frames [lo, hi) of `index` between `start` and `end` seconds (end <= 0: to the last).
std::pair<uint64_t, uint64_t> frames_between(const video::VideoIndex& index, double start,
                                             double end);

// The frames (indices into index.pts) of clip `clip` of the video, of whose frames [lo, hi) are
// in range; `key` is the sample's (drawn from when options.random). REQUIRES: lo < hi <=
// index.frames().
std::vector<uint64_t> choose_clip(const video::VideoIndex& index, uint64_t lo, uint64_t hi,
                                  const ClipOptions& options, uint32_t clip, const SampleKey& key);

struct VideoStats {
  uint64_t clips = 0;
  uint64_t frames_delivered = 0;
  uint64_t frames_decoded = 0;
  uint64_t seeks = 0;
  uint64_t opens = 0;
  uint64_t decoder_reuses = 0;  // opens that kept the worker's decoder (a video encoded alike)
  uint64_t index_builds = 0;
  uint64_t index_cache_bytes = 0;
  double decode_seconds = 0;     // worker time demuxing and decoding (summed over threads)
  double transform_seconds = 0;  // worker time converting kept frames and running the pipeline
};

namespace video {
class IndexCache;     // src/video/index_cache.h
class VideoCounters;  // src/video/index_cache.h
}  // namespace video

class VideoSource final : public Source {
 public:
  // REQUIRES: pipeline not null and of a fixed output size in CHW when options.cthw; options
  // with frames, stride and clips_per_video >= 1 (InvalidArgument otherwise).
  VideoSource(std::vector<VideoFile> videos, std::shared_ptr<const image::ImagePipeline> pipeline,
              ClipOptions options);
  ~VideoSource() override;
  // Videos whose bytes `files` reads (the members of WebDataset tar shards: TarShardFiles with
  // TarMedia::kVideos), with its labels; a clip's video is read into memory whole (once for the
  // clips of it a worker reads in a row). REQUIRES: files not null.
  VideoSource(std::shared_ptr<const ImageFiles> files,
              std::shared_ptr<const image::ImagePipeline> pipeline, ClipOptions options);

  uint64_t size() const override { return videos_.size() * options_.clips_per_video; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  std::string path(uint64_t index) const override {
    return videos_[index / options_.clips_per_video].path;
  }
  std::vector<int64_t> labels() const override;
  // Tar shards: each shard's videos, clips_per_video samples each.
  std::vector<uint64_t> shards() const override;
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  std::unique_ptr<WorkerState> make_worker_state() const override;

  const ClipOptions& options() const { return options_; }
  const image::ImagePipeline& pipeline() const { return *pipeline_; }
  VideoStats stats() const;
  // The index of video v, from the cache or built with `reader` (which opens it).
  std::shared_ptr<const video::VideoIndex> index(uint64_t video, video::VideoReader& reader) const;

 private:
  // Opens video v in `reader` (from its path, or from files_'s bytes).
  void open(uint64_t v, video::VideoReader& reader) const;

  std::vector<VideoFile> videos_;
  std::shared_ptr<const ImageFiles> files_;  // the videos' bytes, when they are not files
  std::shared_ptr<const image::ImagePipeline> pipeline_;
  ClipOptions options_;
  std::vector<FieldSpec> fields_;
  size_t frame_bytes_ = 0;

  std::unique_ptr<video::IndexCache> cache_;
  std::unique_ptr<video::VideoCounters> counters_;
};

}  // namespace stoker
