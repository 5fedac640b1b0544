// GpuDecodeSource: the worker-thread half of GPU decode (see stoker/gpu/decode.h).
#include <algorithm>
#include <cstring>

#include "image/geometry.h"
#include "render.h"
#include "stoker/errors.h"
#include "stoker/gpu/decode.h"
#include "stoker/random.h"

namespace stoker::image::gpu {
namespace {

struct StagingState final : WorkerState {
  std::vector<std::byte> buffer;
  ImageScratch scratch;
};

StagedAxis staged_axis(const image::internal::AxisPlan& a) {
  const image::internal::AxisSpec s = a.spec();
  return StagedAxis{a.lo, s.in_size, s.in0, s.in1, s.full_out, s.out_offset, s.out_size};
}

constexpr uint64_t kAlign = 256;
uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

}  // namespace

uint64_t gpu_sample_bytes(const StagedSample& s) {
  const internal::k::KAxis x = internal::kernel_axis(s.x), y = internal::kernel_axis(s.y);
  int32_t lo = 0, rows = 0;
  internal::vertical_rows(y, &lo, &rows);
  const uint64_t image = align_up(uint64_t(s.width) * uint64_t(s.height) * 3);
  const uint64_t tmp = align_up(uint64_t(rows) * uint64_t(s.x.out_size) * 3);
  const uint64_t tables = align_up(
      (uint64_t(s.x.out_size) * (2 + x.ksize) + uint64_t(s.y.out_size) * (2 + y.ksize)) * 4);
  return image + tmp + tables + sizeof(internal::k::KSample);
}

GpuDecodeSource::GpuDecodeSource(std::shared_ptr<const ImageFiles> files,
                                 std::vector<Transform> transforms, GpuDecodeOptions options)
    : ImageFilesSource(std::move(files), "GpuDecodeSource"),
      transforms_(std::move(transforms)),
      options_(options) {
  // The CPU path's own validation (of the output size too).
  PipelineOptions cpu_options;
  cpu_options.max_pixels = options_.max_pixels;
  const ImagePipeline full(transforms_, cpu_options);
  const bool vflip = std::any_of(transforms_.begin(), transforms_.end(), [](const Transform& t) {
    return std::holds_alternative<RandomVerticalFlip>(t);
  });
  if (!full.single_pass() || vflip) {
    throw InvalidArgument(
        "decode=\"cuda\" runs RandomResizedCrop, Resize, CenterCrop, RandomHorizontalFlip, "
        "ToTensor and Normalize; the other transforms (colour, blur, warps, auto-augment, "
        "erasing, vertical flips) need decode=\"cpu\"");
  }
  const bool bicubic = std::any_of(transforms_.begin(), transforms_.end(), [](const Transform& t) {
    const auto* r = std::get_if<Resize>(&t);
    const auto* c = std::get_if<RandomResizedCrop>(&t);
    return (r && r->interpolation != ResizeFilter::kBilinear) ||
           (c && c->interpolation != ResizeFilter::kBilinear);
  });
  if (bicubic) {  // the GPU kernels resample with the bilinear filter only
    throw InvalidArgument(
        "decode=\"cuda\" resizes with bilinear interpolation only; bicubic "
        "needs decode=\"cpu\"");
  }
  // As the CPU pipeline's (src/image/pipeline.cc).
  OutputTable out = image::output_table(transforms_);
  dtype_ = out.dtype;
  layout_ = out.layout;
  table_ = std::move(out.table);
  // The CPU path for the samples the GPU does not take: the same geometry, 8-bit HWC out; the
  // GPU applies the output table (ToTensor and Normalize) to every sample alike.
  std::vector<Transform> geometric;
  for (const Transform& t : transforms_)
    if (stage_of(t, false) == Stage::kFused) geometric.push_back(t);
  geometric.push_back(ToTensor(DType::kUInt8, Layout::kHWC));
  cpu_ = std::make_shared<const ImagePipeline>(std::move(geometric), cpu_options);
  payload_bytes_ = std::max(options_.file_bytes, static_cast<size_t>(cpu_->output_bytes()));
  payload_bytes_ = (payload_bytes_ + 63) / 64 * 64;
  fields_ = {{"payload", kUInt8, {static_cast<int64_t>(payload_bytes_)}},
             {"label", kInt64, {}},
             {"record", kUInt8, {static_cast<int64_t>(sizeof(StagedSample))}}};
}

std::array<int64_t, 3> GpuDecodeSource::output_shape() const {
  if (layout_ == Layout::kHWC) return {out_height(), out_width(), 3};
  return {3, out_height(), out_width()};
}

size_t GpuDecodeSource::element_size() const { return image::element_size(dtype_); }

std::unique_ptr<WorkerState> GpuDecodeSource::make_worker_state() const {
  return std::make_unique<StagingState>();
}

void GpuDecodeSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                           WorkerState* state) const {
  StagingState local;
  auto* ws = state != nullptr ? static_cast<StagingState*>(state) : &local;
  files_->read(key.index, ws->buffer);
  StagedSample rec;
  rec.seed = key.seed;
  rec.epoch = key.epoch;
  rec.index = key.index;
  JpegHeader h;
  Route route = classify_jpeg(ws->buffer, &h);
  if (route == Route::kGpu) {
    if (uint64_t(h.width) * uint64_t(h.height) > options_.max_pixels) {
      route = Route::kTooLarge;  // the CPU path raises the pixel-limit error
    } else if (ws->buffer.size() > payload_bytes_) {
      route = Route::kFileTooLarge;
    }
  }
  if (route == Route::kGpu) {
    // The CPU path's draws, by the CPU path's function, from the CPU path's key.
    SampleRng rng(key.seed, key.epoch, key.index);
    const image::internal::GeometryPlan plan =
        image::internal::plan_geometry(transforms_, h.width, h.height, rng);
    rec.flip = plan.flip ? 1 : 0;
    rec.file_bytes = static_cast<uint32_t>(ws->buffer.size());
    rec.width = h.width;
    rec.height = h.height;
    rec.x = staged_axis(plan.x);
    rec.y = staged_axis(plan.y);
    if (gpu_sample_bytes(rec) > options_.decode_buffer_bytes) route = Route::kTooLarge;
  }
  if (route == Route::kGpu) {
    std::memcpy(slots[0], ws->buffer.data(), ws->buffer.size());
  } else {
    SampleRng rng(key.seed, key.epoch, key.index);
    cpu_->run(ws->buffer, rng, slots[0], ws->scratch);
    rec = StagedSample{};
    rec.seed = key.seed;
    rec.epoch = key.epoch;
    rec.index = key.index;
  }
  rec.route = static_cast<uint8_t>(route);
  std::memcpy(slots[2], &rec, sizeof rec);
  const int64_t label = files_->label(key.index);
  std::memcpy(slots[1], &label, sizeof label);
}

void GpuDecodeSource::render_cpu(const SampleKey& key, std::byte* dst, WorkerState* state) const {
  StagingState local;
  auto* ws = state != nullptr ? static_cast<StagingState*>(state) : &local;
  files_->read(key.index, ws->buffer);
  SampleRng rng(key.seed, key.epoch, key.index);
  cpu_->run(ws->buffer, rng, dst, ws->scratch);
}

}  // namespace stoker::image::gpu
