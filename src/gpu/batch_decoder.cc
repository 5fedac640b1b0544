// GpuBatchDecoder: the GPU stage of GPU decode (see stoker/gpu/decode.h).
//
// Per batch: the staged JPEGs are decoded in chunks that fit the decode buffer (one nvJPEG call
// and one render launch each), then the samples whose pixels the CPU made (staged fallbacks, and
// files the GPU failed on, decoded again here by the CPU path) are copied up and written by the
// same vertical-pass kernel, then the labels. Everything is queued on the caller's stream; the
// host waits only when nvJPEG fails (to retry file by file).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include "backend.h"
#include "engine/skip_policy.h"
#include "stoker/errors.h"

namespace stoker::image::gpu {
namespace {

using internal::k::KParams;
using internal::k::KSample;

constexpr uint64_t kAlign = 256;

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Ends the backend's batch whatever happens.
class BatchScope {
 public:
  BatchScope(DecodeBackend& b, uintptr_t stream) : b_(b) { b_.begin(stream); }
  ~BatchScope() { b_.end(); }
  BatchScope(const BatchScope&) = delete;
  BatchScope& operator=(const BatchScope&) = delete;

 private:
  DecodeBackend& b_;
};

}  // namespace

struct GpuBatchDecoder::Impl {
  const GpuDecodeSource& src;
  std::unique_ptr<DecodeBackend> backend;
  OnError on_error;
  const uint8_t* table = nullptr;  // device
  std::unique_ptr<WorkerState> worker;

  mutable std::mutex mu;  // guards stats against a concurrent stats() call
  GpuDecodeStats stats;
  SkippedSamples skipped;

  // This batch's host staging: a bump allocator over one block.
  std::byte* staging = nullptr;
  size_t staging_used = 0, staging_size = 0;

  Impl(const GpuDecodeSource& s, std::unique_ptr<DecodeBackend> b, OnError e)
      : src(s), backend(std::move(b)), on_error(e), worker(s.make_worker_state()) {
    table = backend->upload_table(src.output_table());
    stats.backend = backend->name();
  }

  std::byte* stage(size_t bytes) {
    bytes = align_up(bytes);
    if (staging_used + bytes > staging_size) throw Error("GPU decode: descriptor staging overflow");
    std::byte* p = staging + staging_used;
    staging_used += bytes;
    return p;
  }

  KParams params(uint8_t* arena, uint64_t desc_off, uint64_t tables_off, std::byte* images,
                 int32_t n) const {
    KParams p{};
    p.arena = arena;
    p.samples = reinterpret_cast<const KSample*>(arena + desc_off);
    p.tables = reinterpret_cast<int32_t*>(arena + tables_off);
    p.table_out = table;
    p.out = reinterpret_cast<uint8_t*>(images);
    p.elem_bytes = static_cast<int32_t>(src.element_size());
    p.out_sample_bytes = int64_t(src.out_height()) * src.out_width() * 3 * p.elem_bytes;
    p.hwc = src.layout() == Layout::kHWC ? 1 : 0;
    p.out_h = src.out_height();
    p.out_w = src.out_width();
    p.n = n;
    return p;
  }

  // Decodes and renders GPU samples `chunk` (batch positions); returns those that failed.
  std::vector<size_t> gpu_chunk(const StagedBatch& b, const std::vector<size_t>& chunk,
                                std::byte* images) {
    const int out_w = src.out_width();
    std::vector<KSample> ks(chunk.size());
    uint64_t images_bytes = 0, tmp_bytes = 0, table_words = 0;
    int32_t max_rows = 0;
    for (size_t i = 0; i < chunk.size(); ++i) {
      const StagedSample& r = b.records[chunk[i]];
      KSample& k = ks[i];
      k.out_index = static_cast<int32_t>(chunk[i]);
      k.pixels = 0;
      k.flip = r.flip;
      k.src = static_cast<int64_t>(images_bytes);
      k.src_pitch = r.width * 3;
      images_bytes += align_up(uint64_t(r.width) * r.height * 3);
      k.x = internal::kernel_axis(r.x);
      k.y = internal::kernel_axis(r.y);
      k.x.table = static_cast<int64_t>(table_words);
      table_words += uint64_t(k.x.out_size) * (2 + k.x.ksize);
      k.y.table = static_cast<int64_t>(table_words);
      table_words += uint64_t(k.y.out_size) * (2 + k.y.ksize);
      internal::vertical_rows(k.y, &k.rows_lo, &k.rows);
      max_rows = std::max(max_rows, k.rows);
      k.tmp = static_cast<int64_t>(tmp_bytes);
      tmp_bytes += align_up(uint64_t(k.rows) * out_w * 3);
    }
    const uint64_t tmp_off = images_bytes, tables_off = tmp_off + tmp_bytes;
    const uint64_t desc_off = tables_off + align_up(table_words * 4);
    const uint64_t total = desc_off + align_up(ks.size() * sizeof(KSample));
    uint8_t* arena = backend->arena(total);

    std::vector<JpegJob> jobs(chunk.size());
    for (size_t i = 0; i < chunk.size(); ++i) {
      const StagedSample& r = b.records[chunk[i]];
      jobs[i] = JpegJob{r.index,      b.payload + chunk[i] * src.payload_bytes(),
                        r.file_bytes, arena + ks[i].src,
                        r.width * 3,  r.width,
                        r.height};
    }
    std::vector<uint8_t> ok(jobs.size(), 1);
    uint64_t hardware = 0;
    backend->decode(jobs, ok, &hardware);

    std::vector<size_t> failed;
    size_t n = 0;
    for (size_t i = 0; i < ks.size(); ++i) {
      if (!ok[i]) {
        failed.push_back(chunk[i]);
        continue;
      }
      KSample k = ks[i];
      k.tmp += static_cast<int64_t>(tmp_off);
      ks[n++] = k;
    }
    if (n > 0) {
      std::byte* host = stage(n * sizeof(KSample));
      std::memcpy(host, ks.data(), n * sizeof(KSample));
      backend->upload(arena + desc_off, host, n * sizeof(KSample));
      backend->render(params(arena, desc_off, tables_off, images, static_cast<int32_t>(n)),
                      max_rows);
    }
    std::lock_guard lock(mu);
    stats.hardware_samples += hardware;
    ++stats.chunks;
    return failed;
  }

  // Writes samples whose 8-bit pixels are in their payload slots.
  void pixel_chunk(const StagedBatch& b, const std::vector<size_t>& chunk, std::byte* images) {
    const uint64_t pixels = uint64_t(src.out_height()) * src.out_width() * 3;
    const uint64_t step = align_up(pixels);
    const uint64_t desc_off = step * chunk.size();
    uint8_t* arena = backend->arena(desc_off + align_up(chunk.size() * sizeof(KSample)));
    std::byte* host = stage(chunk.size() * sizeof(KSample));
    auto* ks = reinterpret_cast<KSample*>(host);
    for (size_t i = 0; i < chunk.size(); ++i) {
      KSample k{};
      k.out_index = static_cast<int32_t>(chunk[i]);
      k.pixels = 1;
      k.src = static_cast<int64_t>(i * step);
      std::memcpy(&ks[i], &k, sizeof k);
      backend->upload(arena + i * step, b.payload + chunk[i] * src.payload_bytes(), pixels);
    }
    backend->upload(arena + desc_off, host, chunk.size() * sizeof(KSample));
    backend->render(params(arena, desc_off, 0, images, static_cast<int32_t>(chunk.size())), 0);
  }

  // A sample the GPU failed on: the CPU path's pixels into its payload slot, or on_error.
  void recover(const StagedBatch& b, size_t s) {
    StagedSample& r = b.records[s];
    std::byte* dst = b.payload + s * src.payload_bytes();
    std::exception_ptr error;
    try {
      src.render_cpu({r.seed, r.epoch, r.index}, dst, worker.get());
      r.route = static_cast<uint8_t>(Route::kGpuFailed);
      std::lock_guard lock(mu);
      ++stats.routes[static_cast<int>(Route::kGpuFailed)];
      return;
    } catch (...) {
      error = std::current_exception();
    }
    if (on_error == OnError::kRaise) throw SampleError(r.index, src.path(r.index), error);
    skipped.record(r.index, src.path(r.index), error);
    const uint64_t other = read_replacement(
        r.seed, r.epoch, r.index, src.size(), src.path(r.index),
        [&](uint64_t c) { src.render_cpu({r.seed, r.epoch, c}, dst, worker.get()); });
    b.labels[s] = src.files().label(other);
  }

  void decode(const StagedBatch& b, std::byte* images, std::byte* labels, uintptr_t stream) {
    const auto t0 = std::chrono::steady_clock::now();
    BatchScope scope(*backend, stream);
    staging_size = align_up(2 * b.length * sizeof(KSample)) + 2 * kAlign * (b.length + 1);
    staging = backend->host_staging(staging_size);
    staging_used = 0;

    std::vector<size_t> gpu, pixels;
    std::array<uint64_t, kNumRoutes> routes{};
    for (size_t s = 0; s < b.length; ++s) {
      const auto route = static_cast<Route>(b.records[s].route);
      ++routes[static_cast<int>(route) < kNumRoutes ? static_cast<int>(route) : 0];
      (route == Route::kGpu ? gpu : pixels).push_back(s);
    }
    const uint64_t budget = src.options().decode_buffer_bytes;
    for (size_t i = 0; i < gpu.size();) {
      std::vector<size_t> chunk;
      uint64_t bytes = 0;
      for (; i < gpu.size(); ++i) {
        const uint64_t need = gpu_sample_bytes(b.records[gpu[i]]);
        if (!chunk.empty() && bytes + need > budget) break;
        chunk.push_back(gpu[i]);
        bytes += need;
      }
      for (size_t s : gpu_chunk(b, chunk, images)) {
        recover(b, s);
        pixels.push_back(s);
      }
    }
    const uint64_t per_pixels =
        align_up(uint64_t(src.out_height()) * src.out_width() * 3) + sizeof(KSample);
    const size_t per_chunk = static_cast<size_t>(std::max<uint64_t>(1, budget / per_pixels));
    for (size_t i = 0; i < pixels.size(); i += per_chunk) {
      const std::vector<size_t> chunk(pixels.begin() + i,
                                      pixels.begin() + std::min(pixels.size(), i + per_chunk));
      pixel_chunk(b, chunk, images);
    }
    backend->upload(labels, b.labels, b.length * sizeof(int64_t));

    std::lock_guard lock(mu);
    ++stats.batches;
    for (int r = 0; r < kNumRoutes; ++r) stats.routes[r] += routes[r];
    stats.device_bytes_peak = std::max(stats.device_bytes_peak, backend->device_bytes());
    stats.host_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
};

GpuBatchDecoder::GpuBatchDecoder(std::shared_ptr<const GpuDecodeSource> source,
                                 std::unique_ptr<DecodeBackend> backend, OnError on_error)
    : source_(std::move(source)) {
  if (!source_) throw InvalidArgument("GpuBatchDecoder needs a source");
  if (!backend) throw InvalidArgument("GpuBatchDecoder needs a backend");
  impl_ = std::make_unique<Impl>(*source_, std::move(backend), on_error);
}

GpuBatchDecoder::GpuBatchDecoder(std::shared_ptr<const GpuDecodeSource> source,
                                 const DecodeDevice& device, OnError on_error)
    : GpuBatchDecoder(std::move(source), make_nvjpeg_backend(device.device, device.library_dirs),
                      on_error) {}

GpuBatchDecoder::~GpuBatchDecoder() = default;

void GpuBatchDecoder::decode(const StagedBatch& batch, std::byte* images, std::byte* labels,
                             uintptr_t stream) {
  impl_->decode(batch, images, labels, stream);
}

GpuDecodeStats GpuBatchDecoder::stats() const {
  std::lock_guard lock(impl_->mu);
  GpuDecodeStats s = impl_->stats;
  impl_->skipped.read(&s.skipped, &s.skipped_samples);
  s.device_bytes = impl_->backend->device_bytes();
  s.pinned_bytes = impl_->backend->pinned_bytes();
  return s;
}

}  // namespace stoker::image::gpu
