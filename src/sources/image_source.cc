#include "stoker/sources/image_source.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>

#include "stoker/errors.h"
#include "stoker/image/decode.h"

namespace stoker {
namespace {

struct ImageWorkerState final : WorkerState {
  std::vector<std::byte> buffer;
  image::ImageScratch scratch;
};

struct StatsWorkerState final : WorkerState {
  std::vector<std::byte> buffer;
  image::Decoder decoder;
  image::DecodedImage image;
};

}  // namespace

DType to_dtype(image::DType dtype) {
  switch (dtype) {
    case image::DType::kUInt8:
      return kUInt8;
    case image::DType::kFloat32:
      return kFloat32;
    case image::DType::kFloat16:
      return DType{DType::kFloat, 16};
    case image::DType::kBFloat16:
      return DType{DType::kBFloat, 16};
  }
  throw InvalidArgument("unknown image dtype");
}

ImageFilesSource::ImageFilesSource(std::shared_ptr<const ImageFiles> files, const char* who)
    : files_(std::move(files)) {
  if (!files_) throw InvalidArgument(std::string(who) + " needs files");
}

ImageSource::ImageSource(std::shared_ptr<const ImageFiles> files,
                         std::shared_ptr<const image::ImagePipeline> pipeline)
    : ImageFilesSource(std::move(files), "ImageSource"), pipeline_(std::move(pipeline)) {
  if (!pipeline_) throw InvalidArgument("ImageSource needs a pipeline");
  const auto shape = pipeline_->output_shape();
  fields_ = {{"image", to_dtype(pipeline_->dtype()), {shape.begin(), shape.end()}},
             {"label", kInt64, {}}};
}

std::unique_ptr<WorkerState> ImageSource::make_worker_state() const {
  return std::make_unique<ImageWorkerState>();
}

void ImageSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                       WorkerState* state) const {
  // Without a worker state (a one-off read), a temporary one; the loader passes each thread's.
  std::unique_ptr<WorkerState> local;
  if (state == nullptr) state = (local = make_worker_state()).get();
  auto* ws = static_cast<ImageWorkerState*>(state);
  files_->read(key.index, ws->buffer);
  SampleRng rng(key.seed, key.epoch, key.index);
  pipeline_->run(ws->buffer, rng, slots[0], ws->scratch);
  const int64_t label = files_->label(key.index);
  std::memcpy(slots[1], &label, sizeof label);
}

ChannelStatsSource::ChannelStatsSource(std::shared_ptr<const ImageFiles> files, uint64_t max_pixels)
    : ImageFilesSource(std::move(files), "ChannelStatsSource"), max_pixels_(max_pixels) {
  fields_ = {{"stats", DType{DType::kFloat, 64}, {kValues}}};
}

std::unique_ptr<WorkerState> ChannelStatsSource::make_worker_state() const {
  return std::make_unique<StatsWorkerState>();
}

void ChannelStatsSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                              WorkerState* state) const {
  std::unique_ptr<WorkerState> local;
  if (state == nullptr) state = (local = make_worker_state()).get();
  auto* ws = static_cast<StatsWorkerState*>(state);
  files_->read(key.index, ws->buffer);
  const image::DecodedImage& img = ws->image;
  ws->decoder.decode(ws->buffer, ws->image, max_pixels_);
  // Exact integer sums per row, accumulated in double: no rounding until the final scaling.
  uint64_t sum[3] = {0, 0, 0}, sq[3] = {0, 0, 0};
  const uint8_t* p = img.rgb.data();
  const size_t n = static_cast<size_t>(img.width) * img.height;
  for (size_t i = 0; i < n; ++i, p += 3) {
    for (int c = 0; c < 3; ++c) {
      sum[c] += p[c];
      sq[c] += uint64_t{p[c]} * p[c];
    }
  }
  double out[kValues];
  for (int c = 0; c < 3; ++c) {
    out[c] = static_cast<double>(sum[c]) / 255.0;
    out[3 + c] = static_cast<double>(sq[c]) / (255.0 * 255.0);
  }
  out[6] = static_cast<double>(n);
  std::memcpy(slots[0], out, sizeof out);
}

std::vector<uint64_t> image_pixels(const ImageFiles& files, int threads, uint64_t max_pixels) {
  std::vector<uint64_t> out(files.size(), 0);
  const uint64_t n = files.size();
  const int used = static_cast<int>(std::clamp<uint64_t>(n, 1, std::max(threads, 1)));
  auto work = [&](int t) {
    std::vector<std::byte> buffer;
    for (uint64_t i = t; i < n; i += used) {
      try {
        files.read(i, buffer);
        const image::ImageInfo info = image::read_info(buffer, max_pixels);
        out[i] = static_cast<uint64_t>(info.width) * static_cast<uint64_t>(info.height);
      } catch (...) {
        out[i] = 0;  // the sample's own read reports it
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < used; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  return out;
}

}  // namespace stoker
