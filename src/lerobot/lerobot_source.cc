#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "stoker/errors.h"
#include "stoker/ffmpeg/sidecar.h"
#include "stoker/random.h"
#include "stoker/sources/image_source.h"
#include "stoker/lerobot/lerobot_source.h"
#include "video/index_cache.h"

namespace stoker {
namespace {

struct StepWorker final : WorkerState {
  StepWorker(size_t cameras, int threads) {
    for (size_t c = 0; c < cameras; ++c)
      readers.push_back(std::make_unique<video::VideoReader>(threads));
    reported.resize(cameras);
  }
  std::vector<std::unique_ptr<video::VideoReader>> readers;  // one per camera
  std::vector<video::ReaderStats> reported;
  image::ImageScratch scratch;
  std::vector<uint64_t> rows;    // a camera's or value's rows of the sample
  std::vector<uint64_t> frames;  // a camera's frames of them
  std::vector<size_t> order;     // their positions, by frame
  std::vector<uint64_t> sorted;  // the frames in that order
};

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6f", s);
  return buf;
}

// The deltas' rows at `row` of the episode [lo, hi), and into `pad` whether each falls outside.
void rows_at(uint64_t row, uint64_t lo, uint64_t hi, const std::vector<int64_t>& deltas,
             std::vector<uint64_t>& rows, bool* pad) {
  rows.clear();
  if (deltas.empty()) {
    rows.push_back(row);
    return;
  }
  for (size_t k = 0; k < deltas.size(); ++k) {
    const int64_t at = static_cast<int64_t>(row) + deltas[k];
    const bool outside = at < static_cast<int64_t>(lo) || at >= static_cast<int64_t>(hi);
    rows.push_back(static_cast<uint64_t>(
        std::clamp<int64_t>(at, static_cast<int64_t>(lo), static_cast<int64_t>(hi) - 1)));
    if (pad != nullptr) pad[k] = outside;
  }
}

}  // namespace

LeRobotSource::LeRobotSource(std::vector<StepValue> values, std::vector<float> timestamps,
                             std::vector<StepCamera> cameras, StepEpisodes episodes,
                             std::vector<int64_t> labels, double tolerance, int decoder_threads,
                             uint64_t index_cache_bytes)
    : values_(std::move(values)),
      timestamps_(std::move(timestamps)),
      cameras_(std::move(cameras)),
      episodes_(std::move(episodes)),
      labels_(std::move(labels)),
      tolerance_(tolerance),
      decoder_threads_(decoder_threads),
      cache_(std::make_unique<video::IndexCache>(index_cache_bytes)),
      counters_(std::make_unique<video::VideoCounters>()) {
  const uint64_t rows = timestamps_.size();
  const auto& starts = episodes_.starts;
  if (starts.size() < 2 || starts.front() != 0 || starts.back() != rows ||
      !std::is_sorted(starts.begin(), starts.end()) || episodes_.ids.size() + 1 != starts.size())
    throw InvalidArgument("LeRobotSource: episodes must partition the " + std::to_string(rows) +
                          " rows (starts from 0 to the rows, one id per episode)");
  if (!labels_.empty() && labels_.size() != rows)
    throw InvalidArgument("LeRobotSource: one label per row, or none");
  if (!(tolerance_ > 0)) throw InvalidArgument("LeRobotSource: the tolerance must be positive");
  const uint64_t n_episodes = episodes_.ids.size();
  std::unordered_map<std::string, uint32_t> file_ids;
  for (const StepCamera& c : cameras_) {
    if (!c.pipeline || c.pipeline->height() == 0)
      throw InvalidArgument("LeRobotSource: camera " + c.name +
                            " needs a pipeline of a fixed output size");
    if (c.video.size() != n_episodes || c.from.size() != n_episodes)
      throw InvalidArgument("LeRobotSource: camera " + c.name +
                            " needs a video and a start time per episode");
    std::vector<uint32_t>& of = file_of_.emplace_back();
    for (const std::string& path : c.video) {
      auto [it, added] = file_ids.emplace(path, static_cast<uint32_t>(files_.size()));
      if (added) files_.push_back(path);
      of.push_back(it->second);
    }
    const auto frame = c.pipeline->output_shape();
    std::vector<int64_t> shape(frame.begin(), frame.end());
    if (c.deltas.size() > 1) shape.insert(shape.begin(), static_cast<int64_t>(c.deltas.size()));
    fields_.push_back({c.name, to_dtype(c.pipeline->dtype()), shape});
  }
  for (const StepValue& v : values_) {
    std::vector<int64_t> shape = v.shape;
    const FieldSpec step{v.name, v.dtype, v.shape};
    if (v.data.size() != rows * step.sample_bytes())
      throw InvalidArgument("LeRobotSource: value " + v.name + " holds " +
                            std::to_string(v.data.size()) + " bytes, not " + std::to_string(rows) +
                            " rows of " + std::to_string(step.sample_bytes()));
    if (!v.deltas.empty()) shape.insert(shape.begin(), static_cast<int64_t>(v.deltas.size()));
    fields_.push_back({v.name, v.dtype, shape});
  }
  const DType boolean{DType::kBool, 8};
  for (const StepCamera& c : cameras_)
    if (!c.deltas.empty())
      fields_.push_back({c.name + "_is_pad", boolean, {static_cast<int64_t>(c.deltas.size())}});
  for (const StepValue& v : values_)
    if (!v.deltas.empty())
      fields_.push_back({v.name + "_is_pad", boolean, {static_cast<int64_t>(v.deltas.size())}});
}

LeRobotSource::~LeRobotSource() = default;

uint64_t LeRobotSource::episode_of(uint64_t row) const {
  const auto& s = episodes_.starts;
  return static_cast<uint64_t>(std::upper_bound(s.begin(), s.end(), row) - s.begin()) - 1;
}

std::string LeRobotSource::path(uint64_t index) const {
  const uint64_t e = episode_of(index);
  std::string out = "episode " + std::to_string(episodes_.ids[e]) + ", step " +
                    std::to_string(index - episodes_.starts[e]);
  if (!cameras_.empty()) out += " (" + cameras_.front().video[e] + ")";
  return out;
}

std::unique_ptr<WorkerState> LeRobotSource::make_worker_state() const {
  return std::make_unique<StepWorker>(cameras_.size(), decoder_threads_);
}

VideoStats LeRobotSource::stats() const { return counters_->stats(cache_->bytes()); }

void LeRobotSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                         WorkerState* state) const {
  auto& w = static_cast<StepWorker&>(*state);
  const uint64_t row = key.index;
  const uint64_t e = episode_of(row);
  const uint64_t lo = episodes_.starts[e], hi = episodes_.starts[e + 1];
  size_t field = 0;
  size_t pad_field = cameras_.size() + values_.size();

  using Clock = video::VideoCounters::Clock;
  for (size_t c = 0; c < cameras_.size(); ++c, ++field) {
    const StepCamera& cam = cameras_[c];
    bool* pad = nullptr;
    if (!cam.deltas.empty()) pad = reinterpret_cast<bool*>(slots[pad_field++]);
    rows_at(row, lo, hi, cam.deltas, w.rows, pad);
    const uint32_t file = file_of_[c][e];
    const std::string& path = files_[file];
    video::VideoReader& reader = *w.readers[c];
    const Clock::time_point start = Clock::now();
    Clock::duration in_sink{};
    try {
      const auto index = cache_->get(file, [&] {
        if (std::optional<video::VideoIndex> side = video::read_sidecar(path))
          return std::move(*side);
        reader.open(path);
        counters_->add_index_build();
        return reader.build_index();
      });
      if (index->frames() == 0) throw DecodeError(path + ": has no video frames");
      // The nearest frame to each wanted time, in float32 as lerobot measures it.
      w.frames.clear();
      for (const uint64_t r : w.rows) {
        const double at = cam.from[e] + static_cast<double>(timestamps_[r]);
        const auto& pts = index->pts;
        const size_t after = static_cast<size_t>(
            std::partition_point(pts.begin(), pts.end(),
                                 [&](int64_t t) { return index->seconds(t) < at; }) -
            pts.begin());
        const float query = static_cast<float>(at);
        size_t best = after < pts.size() ? after : pts.size() - 1;
        float best_distance = std::fabs(query - static_cast<float>(index->seconds(pts[best])));
        if (after > 0) {
          const float d = std::fabs(query - static_cast<float>(index->seconds(pts[after - 1])));
          if (d <= best_distance) best = after - 1, best_distance = d;
        }
        if (!(best_distance < static_cast<float>(tolerance_)))
          throw DecodeError(
              path + ": no frame within " + seconds_text(tolerance_) +
              " s of t=" + seconds_text(at) + " s (the step at t=" + seconds_text(timestamps_[r]) +
              " s of the episode; the nearest is at t=" + seconds_text(index->seconds(pts[best])) +
              " s)");
        w.frames.push_back(best);
      }
      // read_frames takes them ascending; deltas may come in any order.
      w.order.resize(w.frames.size());
      for (size_t k = 0; k < w.order.size(); ++k) w.order[k] = k;
      std::stable_sort(w.order.begin(), w.order.end(),
                       [&](size_t a, size_t b) { return w.frames[a] < w.frames[b]; });
      w.sorted.resize(w.frames.size());
      for (size_t k = 0; k < w.order.size(); ++k) w.sorted[k] = w.frames[w.order[k]];
      reader.open(path);
      const size_t frame_bytes = cam.pipeline->output_bytes();
      const SampleRng base(key.seed ^ (kCameraStream * (c + 1)), key.epoch, key.index);
      reader.read_frames(*index, w.sorted, [&](size_t k, image::Picture& picture, int64_t) {
        const Clock::time_point sink_start = Clock::now();
        if (cam.exact_size && (picture.width() != cam.pipeline->width() ||
                               picture.height() != cam.pipeline->height()))
          throw DecodeError(path + ": its frames are " + std::to_string(picture.width()) + "x" +
                            std::to_string(picture.height()) + ", not " +
                            std::to_string(cam.pipeline->width()) + "x" +
                            std::to_string(cam.pipeline->height()) +
                            " as meta/info.json says; pass a transform that ends in a fixed size");
        SampleRng rng = base;
        cam.pipeline->run(picture, rng, slots[field] + w.order[k] * frame_bytes, w.scratch);
        in_sink += Clock::now() - sink_start;
      });
    } catch (const IoError& err) {
      throw IoError("episode " + std::to_string(episodes_.ids[e]) + ", camera " + cam.name + ": " +
                    err.what());
    } catch (const DecodeError& err) {
      throw DecodeError("episode " + std::to_string(episodes_.ids[e]) + ", camera " + cam.name +
                        ": " + err.what());
    }
    counters_->add(1, w.frames.size(), Clock::now() - start - in_sink, in_sink, reader.stats(),
                   w.reported[c]);
  }
  for (const StepValue& v : values_) {
    bool* pad = nullptr;
    if (!v.deltas.empty()) pad = reinterpret_cast<bool*>(slots[pad_field++]);
    rows_at(row, lo, hi, v.deltas, w.rows, pad);
    const size_t bytes = FieldSpec{v.name, v.dtype, v.shape}.sample_bytes();
    std::byte* out = slots[field++];
    for (const uint64_t r : w.rows) {
      std::memcpy(out, v.data.data() + r * bytes, bytes);
      out += bytes;
    }
  }
}

}  // namespace stoker
