#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>

#include "stoker/errors.h"
#include "stoker/ffmpeg/sidecar.h"
#include "stoker/random.h"
#include "stoker/sources/image_source.h"
#include "stoker/video/video_source.h"
#include "video/index_cache.h"

namespace stoker {
namespace {

struct VideoWorker final : WorkerState {
  explicit VideoWorker(int threads) : reader(threads) {}
  video::VideoReader reader;
  image::ImageScratch scratch;
  std::vector<std::byte> frame;  // one frame's output, for the CTHW scatter
  std::vector<uint64_t> wanted;
  video::ReaderStats reported;  // the reader's counts already added to the source's
};

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", s);
  return buf;
}

}  // namespace

std::pair<uint64_t, uint64_t> frames_between(const video::VideoIndex& index, double start,
                                             double end) {
  const auto& pts = index.pts;
  // Half a tick of slack: a time given in seconds names the frame whose timestamp rounds to it.
  const double slack = 0.5 * index.time_base_num / index.time_base_den;
  uint64_t lo = 0, hi = pts.size();
  if (start > 0) {
    lo = std::partition_point(pts.begin(), pts.end(),
                              [&](int64_t t) { return index.seconds(t) + slack < start; }) -
         pts.begin();
  }
  if (end > 0) {
    hi = std::partition_point(pts.begin(), pts.end(),
                              [&](int64_t t) { return index.seconds(t) + slack < end; }) -
         pts.begin();
  }
  return {lo, std::max(lo, hi)};
}

std::vector<uint64_t> choose_clip(const video::VideoIndex& index, uint64_t lo, uint64_t hi,
                                  const ClipOptions& o, uint32_t clip, const SampleKey& key) {
  std::vector<uint64_t> out(o.frames);
  SampleRng rng(key.seed ^ ClipOptions::kClipStream, key.epoch, key.index);
  const uint32_t k = o.clips_per_video;
  if (o.fps <= 0) {
    const uint64_t n = hi - lo;
    const uint64_t span = static_cast<uint64_t>(o.frames - 1) * o.stride + 1;
    const uint64_t last_start = n > span ? n - span : 0;
    uint64_t start = 0;
    if (o.random) {
      start = static_cast<uint64_t>(rng.uniform_int(0, static_cast<int64_t>(last_start) + 1));
    } else if (k == 1) {
      start = last_start / 2;
    } else {
      start = (last_start * clip + (k - 1) / 2) / (k - 1);
    }
    for (uint32_t t = 0; t < o.frames; ++t)
      out[t] = lo + std::min<uint64_t>(start + static_cast<uint64_t>(t) * o.stride, n - 1);
    return out;
  }
  const double first = index.seconds(index.pts[lo]);
  const double last = index.seconds(index.pts[hi - 1]);
  const double span = (o.frames - 1) / o.fps;
  const double room = std::max(0.0, last - first - span);
  double t0 = first;
  if (o.random) {
    t0 += rng.uniform() * room;
  } else if (k == 1) {
    t0 += room / 2;
  } else {
    t0 += room * clip / (k - 1);
  }
  const double slack = 0.5 * index.time_base_num / index.time_base_den;
  uint64_t i = lo;
  for (uint32_t t = 0; t < o.frames; ++t) {
    const double at = t0 + t / o.fps + slack;
    while (i + 1 < hi && index.seconds(index.pts[i + 1]) <= at) ++i;
    out[t] = i;
  }
  return out;
}

VideoSource::VideoSource(std::vector<VideoFile> videos,
                         std::shared_ptr<const image::ImagePipeline> pipeline, ClipOptions options)
    : videos_(std::move(videos)),
      pipeline_(std::move(pipeline)),
      options_(options),
      cache_(std::make_unique<video::IndexCache>(options_.index_cache_bytes)),
      counters_(std::make_unique<video::VideoCounters>()) {
  if (!pipeline_) throw InvalidArgument("VideoSource: no pipeline");
  if (options_.frames == 0 || options_.stride == 0 || options_.clips_per_video == 0)
    throw InvalidArgument("VideoSource: frames, stride and clips_per_video must be at least 1");
  if (!(options_.fps >= 0) || std::isinf(options_.fps))
    throw InvalidArgument("VideoSource: fps must be a positive number (or 0: by stride)");
  if (pipeline_->height() == 0)
    throw InvalidArgument("VideoSource: the pipeline must end in a fixed size");
  if (options_.cthw && pipeline_->layout() != image::Layout::kCHW)
    throw InvalidArgument("VideoSource: a CTHW clip needs a pipeline of CHW frames");
  const auto frame = pipeline_->output_shape();
  frame_bytes_ = pipeline_->output_bytes();
  const int64_t t = options_.frames;
  std::vector<int64_t> shape;
  if (options_.cthw) {
    shape = {frame[0], t, frame[1], frame[2]};
  } else {
    shape = {t, frame[0], frame[1], frame[2]};
  }
  fields_.push_back({"clip", to_dtype(pipeline_->dtype()), shape});
  fields_.push_back({"label", kInt64, {}});
  if (options_.timestamps) fields_.push_back({"timestamps", DType{DType::kFloat, 64}, {t}});
}

VideoSource::~VideoSource() = default;

namespace {

std::vector<VideoFile> videos_of(const ImageFiles* files) {
  if (files == nullptr) throw InvalidArgument("VideoSource: no files");
  std::vector<VideoFile> out(files->size());
  for (uint64_t i = 0; i < out.size(); ++i) out[i] = {files->path(i), files->label(i), 0, 0};
  return out;
}

}  // namespace

VideoSource::VideoSource(std::shared_ptr<const ImageFiles> files,
                         std::shared_ptr<const image::ImagePipeline> pipeline, ClipOptions options)
    : VideoSource(videos_of(files.get()), std::move(pipeline), options) {
  files_ = std::move(files);
}

std::vector<uint64_t> VideoSource::shards() const {
  std::vector<uint64_t> out = files_ ? files_->shards() : std::vector<uint64_t>{};
  for (uint64_t& n : out) n *= options_.clips_per_video;
  return out;
}

void VideoSource::open(uint64_t v, video::VideoReader& reader) const {
  const std::string& path = videos_[v].path;
  if (!files_) {
    reader.open(path);
  } else if (!reader.is_open(path)) {
    std::vector<std::byte> bytes;
    files_->read(v, bytes);
    reader.open_bytes(path, std::move(bytes));
  }
}

std::vector<int64_t> VideoSource::labels() const {
  std::vector<int64_t> out;
  out.reserve(size());
  for (const VideoFile& v : videos_)
    for (uint32_t j = 0; j < options_.clips_per_video; ++j) out.push_back(v.label);
  return out;
}

std::unique_ptr<WorkerState> VideoSource::make_worker_state() const {
  return std::make_unique<VideoWorker>(options_.decoder_threads);
}

std::shared_ptr<const video::VideoIndex> VideoSource::index(uint64_t v,
                                                            video::VideoReader& reader) const {
  return cache_->get(v, [&] {
    if (!files_) {  // a sidecar beside the video (`stoker index`), when it describes it
      if (std::optional<video::VideoIndex> side = video::read_sidecar(videos_[v].path))
        return std::move(*side);
    }
    open(v, reader);
    counters_->add_index_build();
    return reader.build_index();
  });
}

void VideoSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                       WorkerState* state) const {
  auto& w = static_cast<VideoWorker&>(*state);
  const uint64_t v = key.index / options_.clips_per_video;
  const auto clip = static_cast<uint32_t>(key.index % options_.clips_per_video);
  const VideoFile& file = videos_[v];
  const std::shared_ptr<const video::VideoIndex> index = this->index(v, w.reader);
  open(v, w.reader);  // kept open from the index build or the last clip of this video
  const auto [lo, hi] = frames_between(*index, file.start, file.end);
  if (lo == hi) {
    if (index->frames() == 0) throw DecodeError(file.path + ": has no video frames");
    throw DecodeError(file.path + ": no frames between t=" + seconds_text(file.start) +
                      " s and t=" + seconds_text(file.end) + " s (it has " +
                      std::to_string(index->frames()) +
                      " frames, from t=" + seconds_text(index->seconds(index->pts.front())) +
                      " s to t=" + seconds_text(index->seconds(index->pts.back())) + " s)");
  }
  w.wanted = choose_clip(*index, lo, hi, options_, clip, key);
  const SampleRng base(key.seed, key.epoch, key.index);
  std::byte* out = slots[0];
  auto* stamps = options_.timestamps ? reinterpret_cast<double*>(slots[2]) : nullptr;
  const size_t plane = frame_bytes_ / 3;
  const uint32_t frames = options_.frames;
  if (options_.cthw) w.frame.resize(frame_bytes_);
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::duration in_sink{};
  w.reader.read_frames(*index, w.wanted, [&](size_t t, image::Picture& picture, int64_t pts) {
    const Clock::time_point sink_start = Clock::now();
    if (options_.exact_size &&
        (picture.width() != pipeline_->width() || picture.height() != pipeline_->height())) {
      throw DecodeError(file.path + ": its frames are " + std::to_string(picture.width()) + "x" +
                        std::to_string(picture.height()) + ", not " +
                        std::to_string(pipeline_->width()) + "x" +
                        std::to_string(pipeline_->height()) +
                        " as the first video's; pass a transform that ends in a fixed size");
    }
    SampleRng rng = base;
    if (options_.cthw) {
      pipeline_->run(picture, rng, w.frame.data(), w.scratch);
      for (int c = 0; c < 3; ++c)
        std::memcpy(out + (static_cast<size_t>(c) * frames + t) * plane, w.frame.data() + c * plane,
                    plane);
    } else {
      pipeline_->run(picture, rng, out + t * frame_bytes_, w.scratch);
    }
    if (stamps != nullptr) stamps[t] = index->seconds(pts);
    in_sink += Clock::now() - sink_start;
  });
  const int64_t label = file.label;
  std::memcpy(slots[1], &label, sizeof label);
  counters_->add(1, frames, Clock::now() - start - in_sink, in_sink, w.reader.stats(), w.reported);
}

VideoStats VideoSource::stats() const { return counters_->stats(cache_->bytes()); }

}  // namespace stoker
