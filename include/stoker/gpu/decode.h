// GPU JPEG decode: ImageFolder/TarShards(decode="cuda") with DataLoader(device="cuda").
//
// Two stages, split where the bytes leave the CPU:
// 1. Staging (GpuDecodeSource, on the loader's worker threads): read the file, parse the JPEG
//    header (classify_jpeg), and draw the sample's augmentation with the CPU pipeline's own
//    function (plan_geometry, keyed by (seed, epoch, index)): the crop window, output size and flip
//    are the CPU path's, whatever the device. A file nvJPEG can take is copied into the sample's
//    payload slot with a StagedSample record of its plan; any other (PNG, CMYK/YCCK, 12-bit,
//    progressive, arithmetic-coded, damaged headers, too large) is decoded and resampled right
//    there by the CPU pipeline into 8-bit HWC pixels, so it reaches the GPU already done.
// 2. GPU stage (GpuBatchDecoder, per batch, on the consumer's copy stream): the batch's JPEGs go
//    to nvJPEG in one batched call (the hardware decoder where the GPU has one, the GPU-hybrid
//    backend otherwise), then three kernels resample (PIL's antialiased bilinear: the CPU
//    resampler's coefficients and rounding), flip, and write the batch tensor with ToTensor's
//    dtype and layout and Normalize fused in (the CPU pipeline's per-value table).
//
// Errors: a file that fails on the GPU is decoded again by the CPU path. If that fails too, the
// sample gets the loader's on_error: kRaise throws SampleError naming the file; kSkip replaces it
// with the loader's own candidates (skip_candidate), decoded by the CPU path.
//
// Thread safety: GpuDecodeSource is a Source (immutable; read() from any thread). A
// GpuBatchDecoder is used by one thread at a time (the consumer's copy stage).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "stoker/image/pipeline.h"
#include "stoker/image/transforms.h"
#include "stoker/engine.h"
#include "stoker/sources/image_source.h"

namespace stoker::image::gpu {

// Where a sample is decoded, and why not on the GPU. Stable numbers: they are stored in batches.
enum class Route : uint8_t {
  kGpu = 0,
  kNotJpeg = 1,        // PNG (or not an image: the CPU path names the error)
  kBadHeader = 2,      // the marker structure is damaged or truncated before the image data
  kNotBaseline = 3,    // progressive, lossless, hierarchical or arithmetic-coded
  kPrecision = 4,      // not 8 bits per sample (12-bit JPEG)
  kColorSpace = 5,     // CMYK, YCCK, RGB-coded (Adobe transform 0 / 'R','G','B' ids), 2 or 4+ comps
  kSubsampling = 6,    // sampling factors nvJPEG's batched decoders do not take (4:1:1, odd ones)
  kMultiScan = 7,      // a sequential JPEG whose components are in several scans
  kNoEndMarker = 8,    // no EOI: truncated (the CPU path reports it)
  kTooLarge = 9,       // over max_pixels, or its decode needs more than the decode buffer
  kFileTooLarge = 10,  // the file is larger than a batch's payload slot
  kGpuFailed = 11,     // passed the header checks, but nvJPEG failed on it (counted by the stage)
};
inline constexpr int kNumRoutes = 12;
const char* route_name(Route r);

// What classify_jpeg reads from the header (up to the first scan, and the scan count to EOI).
struct JpegHeader {
  int width = 0, height = 0;
  int precision = 0;  // bits per sample
  int sof = -1;       // SOF marker type (0 baseline, 1 extended, 2 progressive, ...)
  int components = 0;
  std::array<uint8_t, 4> component_id{}, h_samp{}, v_samp{};
  int adobe_transform = -1;  // from an Adobe APP14 marker; -1 without one
  bool jfif = false;
  int scans = 0;  // SOS markers before EOI
  bool eoi = false;
};

// Parses `file` and says whether nvJPEG's batched decode takes it (Route::kGpu) or why not. Never
// throws and reads nothing outside the span. Pure function: no CUDA needed.
Route classify_jpeg(std::span<const std::byte> file, JpegHeader* header = nullptr);

// One axis of a staged plan: the window [lo, lo + in_size) of the decoded image that the filter
// may read, PIL's resize box [in0, in1) relative to lo, resized to full_out pixels, of which
// out_size starting at out_offset are kept (outside [0, full_out): zero padding).
struct StagedAxis {
  int32_t lo = 0, in_size = 0;
  float in0 = 0, in1 = 0;
  int32_t full_out = 0, out_offset = 0, out_size = 0;
};

// The per-sample record of a staged batch (the "record" field: 96 plain bytes).
struct StagedSample {
  uint64_t seed = 0, epoch = 0, index = 0;  // the sample's key (for errors and replacement)
  uint8_t route = 0;                        // Route
  uint8_t flip = 0;                         // GPU samples: flip when writing (CPU: already done)
  uint16_t reserved = 0;
  uint32_t file_bytes = 0;        // GPU samples: JPEG bytes at the payload's start
  int32_t width = 0, height = 0;  // GPU samples: the image
  StagedAxis x, y;                // GPU samples
};
static_assert(sizeof(StagedSample) == 96);

struct GpuDecodeOptions {
  uint64_t max_pixels = kDefaultMaxPixels;
  // Bytes of one sample's payload slot: the largest JPEG staged for the GPU (larger files take
  // the CPU path). Raised to the output's 8-bit HWC size if smaller (CPU-path pixels go there).
  size_t file_bytes = size_t{1} << 20;
  // GPU memory for one batch's decode work (decoded images, resample scratch, tables). A batch
  // that needs more is decoded in chunks; an image that alone needs more takes the CPU path.
  uint64_t decode_buffer_bytes = uint64_t{512} << 20;
};

// Device bytes one GPU sample needs in the decode buffer (decoded image, horizontal-pass rows,
// coefficient tables, descriptor), for the plan in `s`. Used by staging and by the stage.
uint64_t gpu_sample_bytes(const StagedSample& s);

// The staging source: fields "payload" (uint8 [payload_bytes()]), "label" (int64) and "record"
// (uint8 [sizeof(StagedSample)]). See the top of this file.
class GpuDecodeSource final : public ImageFilesSource {
 public:
  // `transforms` as for ImagePipeline (they must end in a fixed size).
  // Throws InvalidArgument like ImagePipeline does.
  GpuDecodeSource(std::shared_ptr<const ImageFiles> files, std::vector<Transform> transforms,
                  GpuDecodeOptions options = {});

  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  std::unique_ptr<WorkerState> make_worker_state() const override;

  // Runs the CPU path for sample `key.index`: its file through the CPU pipeline into `dst`
  // (8-bit HWC, out_height x out_width x 3, flipped as drawn). Throws as ImageSource::read.
  void render_cpu(const SampleKey& key, std::byte* dst, WorkerState* state) const;

  size_t payload_bytes() const { return payload_bytes_; }
  const GpuDecodeOptions& options() const { return options_; }
  const std::vector<Transform>& transforms() const { return transforms_; }
  int out_height() const { return cpu_->height(); }
  int out_width() const { return cpu_->width(); }
  DType dtype() const { return dtype_; }
  Layout layout() const { return layout_; }
  std::array<int64_t, 3> output_shape() const;
  size_t element_size() const;
  // The output element of channel c (0..2) and 8-bit value v, as the CPU pipeline writes it
  // (ToTensor's scaling and Normalize): 768 * element_size() bytes.
  const std::vector<std::byte>& output_table() const { return table_; }

 private:
  std::vector<Transform> transforms_;
  GpuDecodeOptions options_;
  std::shared_ptr<const ImagePipeline> cpu_;  // the transforms with an 8-bit HWC ToTensor
  DType dtype_ = DType::kUInt8;
  Layout layout_ = Layout::kCHW;
  std::vector<std::byte> table_;
  size_t payload_bytes_ = 0;
};

// A staged batch as the GPU stage sees it: host memory the stage may write (CPU-path pixels and
// replacement labels go into the batch itself). The payload, label and record arrays of
// `length` samples.
struct StagedBatch {
  size_t length = 0;
  std::byte* payload = nullptr;  // length * payload_bytes
  int64_t* labels = nullptr;
  StagedSample* records = nullptr;
};

struct GpuDecodeStats {
  std::string backend;  // "hardware" or "gpu_hybrid" (the tests' emulation: "emulated")
  uint64_t batches = 0;
  std::array<uint64_t, kNumRoutes> routes{};         // samples by route (kGpuFailed: recovered)
  uint64_t hardware_samples = 0;                     // decoded by the hardware decoder
  uint64_t skipped = 0;                              // replaced under kSkip by this stage
  std::vector<std::string> skipped_samples;          // "index: path: message", the latest ones
  uint64_t chunks = 0;                               // nvJPEG calls of decode-buffer size
  uint64_t device_bytes = 0, device_bytes_peak = 0;  // decode buffer + nvJPEG's own + tables
  uint64_t pinned_bytes = 0;                         // staging for descriptors + nvJPEG's own
  double host_seconds = 0;                           // time in decode(), on the calling thread
};

// The GPU work, behind an interface (private: src/gpu/backend.h): nvJPEG + NVRTC kernels on a
// device; the tests put an emulation on the CPU behind it (stoker/gpu/emulated.h).
class DecodeBackend;

// REQUIRES for the factories: the source outlives nothing; the decoder keeps it.
// The nvJPEG backend: libnvjpeg and libnvrtc are loaded at run time from the usual sonames, the
// directories in `library_dirs` (pip wheels: nvidia/*/lib, torch/lib, torchvision.libs) and
// libraries already loaded in the process. Throws Error naming CUDA, nvJPEG or NVRTC and what was
// tried when something is missing.
std::unique_ptr<DecodeBackend> make_nvjpeg_backend(int device,
                                                   const std::vector<std::string>& library_dirs);
// Opens libnvjpeg and libnvrtc as make_nvjpeg_backend does, without a device: their paths, or
// Error saying which is missing and what was tried.
std::pair<std::string, std::string> find_gpu_decode_libraries(
    const std::vector<std::string>& library_dirs);
// Which device a GpuBatchDecoder drives.
struct DecodeDevice {
  int device = 0;                         // CUDA ordinal
  std::vector<std::string> library_dirs;  // see make_nvjpeg_backend
};

class GpuBatchDecoder {
 public:
  // Throws as make_nvjpeg_backend when the device cannot be used.
  GpuBatchDecoder(std::shared_ptr<const GpuDecodeSource> source, const DecodeDevice& device,
                  OnError on_error);
  // On any backend (the tests' emulated one).
  GpuBatchDecoder(std::shared_ptr<const GpuDecodeSource> source,
                  std::unique_ptr<DecodeBackend> backend, OnError on_error);
  ~GpuBatchDecoder();
  GpuBatchDecoder(const GpuBatchDecoder&) = delete;
  GpuBatchDecoder& operator=(const GpuBatchDecoder&) = delete;

  // Decodes `batch` into `images` (device memory: length x the source's output shape and dtype)
  // and copies its labels to `labels` (device, length int64), all queued on `stream` (a
  // CUstream; 0 is the legacy default stream). Returns once the work is queued; the caller orders
  // later work after it on `stream` (an event) and keeps `batch` unchanged until then (its pinned
  // buffer is read by copies on `stream`). Throws SampleError (on_error = kRaise, or no readable
  // replacement) naming the sample; work already queued then writes only into `images`.
  void decode(const StagedBatch& batch, std::byte* images, std::byte* labels, uintptr_t stream);

  GpuDecodeStats stats() const;
  const GpuDecodeSource& source() const { return *source_; }

 private:
  struct Impl;
  std::shared_ptr<const GpuDecodeSource> source_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace stoker::image::gpu
