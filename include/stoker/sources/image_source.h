// Image sources: encoded image files decoded by the worker threads straight into batch slots.
//
// ImageSource: fields "image" (the pipeline's output shape and dtype) and "label" (int64 scalar).
// Sample i is pipeline.run(file bytes of i, SampleRng(seed, epoch, i)), so augmentation depends
// only on (seed, epoch, index): bit-identical whatever the worker count.
//
// ChannelStatsSource: one float64 field "stats" of 7 values per sample, from the full-size decode:
// sum of R, G, B and sum of squares of R, G, B (values scaled to [0, 1]), then the pixel count.
// Summing over every sample gives the dataset's per-channel mean and std.
//
// Contract:
// - Thread safety: immutable; read() is safe from any number of threads, each with its own
//   WorkerState (a reusable byte buffer and, for ImageSource, an ImageScratch).
// - Ownership: the files and the pipeline are shared and must not change.
// - Errors: read() throws IoError (file unreadable) or DecodeError (bad image, or larger than the
//   pixel limit); the loader names the sample with path(index).
#pragma once

#include <memory>

#include "stoker/image/pipeline.h"
#include "stoker/source.h"
#include "stoker/sources/image_files.h"

namespace stoker {

// Stoker's element type for an image::DType.
DType to_dtype(image::DType dtype);

// What both image sources share: one sample per file, named by the file's path.
class ImageFilesSource : public Source {
 public:
  uint64_t size() const override { return files_->size(); }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  std::string path(uint64_t index) const override { return files_->path(index); }
  std::vector<int64_t> labels() const override {
    std::vector<int64_t> out(files_->size());
    for (uint64_t i = 0; i < out.size(); ++i) out[i] = files_->label(i);
    return out;
  }
  Blocks blocks() const override { return files_->blocks(); }
  std::vector<uint64_t> shards() const override { return files_->shards(); }
  const ImageFiles& files() const { return *files_; }

 protected:
  // REQUIRES: files is not null (InvalidArgument naming `who` otherwise).
  ImageFilesSource(std::shared_ptr<const ImageFiles> files, const char* who);

  std::shared_ptr<const ImageFiles> files_;
  std::vector<FieldSpec> fields_;
};

class ImageSource final : public ImageFilesSource {
 public:
  // REQUIRES: files and pipeline are not null.
  ImageSource(std::shared_ptr<const ImageFiles> files,
              std::shared_ptr<const image::ImagePipeline> pipeline);

  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  std::unique_ptr<WorkerState> make_worker_state() const override;
  // The layout of the "image" field (a batch transform needs to know which axes are H and W).
  image::Layout layout() const { return pipeline_->layout(); }

 private:
  std::shared_ptr<const image::ImagePipeline> pipeline_;
};

class ChannelStatsSource final : public ImageFilesSource {
 public:
  static constexpr int kValues = 7;

  // REQUIRES: files is not null. Images over max_pixels fail with DecodeError.
  ChannelStatsSource(std::shared_ptr<const ImageFiles> files,
                     uint64_t max_pixels = image::kDefaultMaxPixels);

  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  std::unique_ptr<WorkerState> make_worker_state() const override;

 private:
  uint64_t max_pixels_;
};

// Each image's width x height, read from its header without decoding it (a batch's cost in
// pixels, for a budget: budget.h), by `threads` threads (>= 1) that share the files in strides.
// An image whose file or header cannot be read counts 0 pixels: it fails with its own error when
// the loader reads it. Thread safety: reentrant.
std::vector<uint64_t> image_pixels(const ImageFiles& files, int threads,
                                   uint64_t max_pixels = image::kDefaultMaxPixels);

}  // namespace stoker
