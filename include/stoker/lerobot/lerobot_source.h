// LeRobotSource: the time steps of a LeRobot dataset (robot episodes: lerobot's LeRobotDataset)
// as samples. A step's values are a row of its data table; for every camera, the frame its video
// shows at the step's time is decoded by the worker threads (FFmpeg) straight into a batch slot.
//
// The steps are the selected rows, episode after episode: episode e holds rows [starts[e],
// starts[e + 1]). With deltas (lerobot's delta_timestamps, in steps), a value or camera gives, at
// row r of episode e, the rows r + d clamped to the episode, and a bool field "<name>_is_pad" [D],
// true where r + d falls outside it: lerobot's rule.
//
// Fields, in this order:
// - each camera: its frame at the step, the pipeline's output ([C, H, W]); [D, C, H, W] with D > 1
//   deltas (one delta keeps [C, H, W], as lerobot squeezes it);
// - each value: its row's value, `shape` ([] for a scalar); [D, ...shape] with deltas;
// - "<name>_is_pad" for each camera, then each value, with deltas.
// A camera's frame at row r: of its episode's video, the frame nearest in presentation time to
// `from[e] + timestamps[r]`, distances measured in float32 as lerobot measures them (the first
// nearest on a tie); one further than `tolerance` seconds is an error. A camera's frames of one
// sample are decoded in one pass (read_frames: a GOP once). Its pipeline runs on every frame with
// SampleRng(seed ^ kCameraStream * (camera + 1), epoch, index): one set of random parameters per
// camera and sample, the same on each of its frames.
//
// Contract:
// - Thread safety: immutable but for its index cache and counters (synchronized); read() is safe
//   from any number of threads, each with its WorkerState (a VideoReader per camera, which keeps
//   its last file open: episodes share files).
// - Memory: the values are held in memory (numbers only: 1M steps of 64 float32 values are
//   256 MB); the indexes in a cache of at most index_cache_bytes.
// - Errors: the constructor throws InvalidArgument for inconsistent inputs (sizes, episodes,
//   dtypes). read() throws DecodeError naming the episode, camera, video and timestamp for a frame
//   outside tolerance, and the reader's errors (IoError for a missing video, DecodeError for a
//   corrupt one) prefixed with the episode and camera.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/image/pipeline.h"
#include "stoker/source.h"
#include "stoker/video/video_source.h"

namespace stoker {

namespace video {
class IndexCache;
class VideoCounters;
}  // namespace video

struct StepValue {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;   // per step; [] for a scalar
  std::vector<std::byte> data;  // rows x the step's bytes, in row order
  std::vector<int64_t> deltas;  // empty: the row's value alone
};

struct StepCamera {
  std::string name;
  std::shared_ptr<const image::ImagePipeline> pipeline;  // of a fixed output size
  bool exact_size = false;         // frames must be the pipeline's size already (it only crops)
  std::vector<int64_t> deltas;     // empty: the frame at the step
  std::vector<std::string> video;  // per episode: its file
  std::vector<double> from;        // per episode: the video's time of its first step, seconds
};

struct StepEpisodes {
  std::vector<uint64_t> starts;  // episodes + 1 row positions, from 0 to the rows, ascending
  std::vector<int64_t> ids;      // per episode: its episode_index, for messages
};

class LeRobotSource final : public Source {
 public:
  static constexpr uint64_t kCameraStream = 0x63616d65u;  // "came"

  // REQUIRES: values' data rows x the step's bytes each; timestamps one per row; labels one per
  // row or none; cameras with a pipeline, a video and a time per episode (InvalidArgument
  // otherwise).
  LeRobotSource(std::vector<StepValue> values, std::vector<float> timestamps,
                std::vector<StepCamera> cameras, StepEpisodes episodes, std::vector<int64_t> labels,
                double tolerance, int decoder_threads, uint64_t index_cache_bytes);
  ~LeRobotSource() override;

  uint64_t size() const override { return timestamps_.size(); }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  std::string path(uint64_t index) const override;
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  std::unique_ptr<WorkerState> make_worker_state() const override;
  // The labels given (a stratified order groups steps by them: their task or episode).
  std::vector<int64_t> labels() const override { return labels_; }
  VideoStats stats() const;

 private:
  uint64_t episode_of(uint64_t row) const;

  std::vector<StepValue> values_;
  std::vector<float> timestamps_;
  std::vector<StepCamera> cameras_;
  StepEpisodes episodes_;
  std::vector<int64_t> labels_;
  double tolerance_;
  int decoder_threads_;
  std::vector<std::string> files_;              // every camera's distinct videos
  std::vector<std::vector<uint32_t>> file_of_;  // [camera][episode] -> files_
  std::vector<FieldSpec> fields_;
  std::unique_ptr<video::IndexCache> cache_;
  std::unique_ptr<video::VideoCounters> counters_;
};

}  // namespace stoker
