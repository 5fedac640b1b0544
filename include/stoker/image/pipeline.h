// ImagePipeline: decoding fused with torchvision-style augmentation.
//
// Built from an ordered list of transforms, it turns an encoded image (JPEG or PNG) into one
// fixed-size output tensor the way torchvision does (`Image.open(f).convert("RGB")`, then the
// transforms), in as few passes as the list allows:
// - the leading crops, resizes and flips (stage kFused, transforms.h) are composed into a single
//   source box, only that region is decoded (JPEG: with DCT scaling when the output is much
//   smaller), and one PIL-equivalent bilinear resample produces their result;
// - the image transforms after them (colour, blur, warps, padding, random crops, auto-augment:
//   stage kImage) run on that 8-bit image in memory (src/image/image_stage.h), a later run of
//   crops and resizes again as one resample;
// - ToTensor and Normalize are fused into the write to the batch (one table look-up a value),
//   and random erasing after ToTensor runs on the written tensor.
// A list with no image transform writes the resample's rows straight to the batch, with the
// flips, dtype, layout and normalisation fused in.
//
// Contract:
// - Thread safety: an ImagePipeline is immutable after construction; run() may be called
//   concurrently from many threads, each with its own ImageScratch and SampleRng.
// - Construction throws InvalidArgument when the transforms are invalid or do not end in a
//   fixed size (end with CenterCrop, RandomResizedCrop, RandomCrop or Resize(h, w)), when
//   ToTensor/Normalize come before an image transform, or when Normalize has no float ToTensor
//   before it. Without ToTensor the output is uint8 CHW.
// - run() throws DecodeError for bad input and InvalidArgument for an image a transform cannot
//   take (a RandomCrop larger than the image, a reflection wider than it); dst is then
//   unspecified. A JPEG is read only up to the last row the output needs, so damage after that
//   row goes unnoticed (it cannot affect the output); decode() reads to the end and reports it.
// - A warm ImageScratch makes no allocations of ours; libjpeg and libpng still allocate
//   their per-image state internally.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "stoker/image/decode.h"
#include "stoker/image/transforms.h"
#include "stoker/random.h"

namespace stoker::image {

namespace internal {
struct ScratchImpl;
class PixelInput;
using RowSink = void (*)(void* ctx, int y, const uint8_t* rgb);
}  // namespace internal

struct PipelineOptions {
  uint64_t max_pixels = kDefaultMaxPixels;
  // A PNG's transparency: dropped as torchvision's loader does, or composited on white as
  // Hugging Face's image processors do (decode.h).
  Alpha alpha = Alpha::kDrop;
  // JPEG DCT scaling (decoding at 1/2, 1/4 or 1/8 size, which libjpeg-turbo does with SIMD
  // inverse DCTs) is used only while the decoded region stays at least this many times the
  // output size on both axes: with 1.0, whenever the crop is at least 2x the output both ways.
  // The resample then goes on from the scaled pixels (mean absolute difference to the exact path
  // 0.31 of 255 on 640-1024 px photos with RandomResizedCrop(224); see docs/images.md). <= 0
  // disables it, giving output bit-identical to PIL.
  double dct_min_ratio = 1.0;
  // JPEG inverse DCT and chroma upsampling: PIL's (exact) by default. fast_idct uses libjpeg's
  // fast integer IDCT; fancy_upsampling = false replicates chroma samples instead of
  // interpolating them. Both trade accuracy for speed (see docs/images.md for the figures).
  bool fast_idct = false;
  bool fancy_upsampling = true;
  // The list need not end in a fixed size and holds transforms of the image only (no ToTensor,
  // Normalize or erasing after them): run_image() gives the 8-bit image of whatever size they
  // make (the native part of a pipeline that continues in Python). run() is then unavailable;
  // height() and width() are 0 unless the size is fixed after all.
  bool any_size = false;
};

// An 8-bit interleaved RGB image: pixel (x, y) at data + y * stride + 3 * x.
struct ImageView {
  const uint8_t* data = nullptr;
  int height = 0, width = 0;
  size_t stride = 0;
};

// 8-bit interleaved RGB pixels of the rectangle [x0, x1) x [y0, y1) of a picture: pixel (x, y)
// at data + (y - y0) * stride + 3 * (x - x0).
struct RgbRegion {
  int x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  const uint8_t* data = nullptr;
  size_t stride = 0;
};

// A decoded picture that the pipeline reads instead of an encoded file (a video frame): it
// converts to RGB only the rectangle the transforms read, and at a reduced scale where they
// shrink it (as JPEG's DCT scaling, PipelineOptions::dct_min_ratio). One thread at a time.
class Picture {
 public:
  virtual ~Picture() = default;
  virtual int width() const = 0;
  virtual int height() const = 0;
  // The RGB pixels of [x0, x1) x [y0, y1) of the picture scaled by scale_num/8 (1, 2, 4 or 8;
  // scaled sides rounded up, each scaled pixel the average of the area it covers), or of a
  // rectangle inside it that holds it, valid until the next call. REQUIRES: a non-empty
  // rectangle inside the scaled picture. Throws DecodeError when the pixels cannot be
  // converted.
  virtual RgbRegion rgb(int x0, int y0, int x1, int y1, int scale_num = 8) = 0;
};

// Per-thread reusable buffers and decoder state. Use one per thread; not thread-safe.
class ImageScratch {
 public:
  ImageScratch();
  ~ImageScratch();
  ImageScratch(ImageScratch&&) noexcept;
  ImageScratch& operator=(ImageScratch&&) noexcept;

 private:
  friend class ImagePipeline;
  std::unique_ptr<internal::ScratchImpl> impl_;
};

class ImagePipeline {
 public:
  explicit ImagePipeline(std::vector<Transform> transforms, PipelineOptions options = {});

  int height() const { return height_; }
  int width() const { return width_; }
  DType dtype() const { return dtype_; }
  Layout layout() const { return layout_; }
  // Whether the list is only crops, resizes, horizontal flips, ToTensor and Normalize: the
  // single-pass path (and what the GPU decoder can run).
  bool single_pass() const { return fused_end_ == image_end_ && tensor_ops_.empty(); }
  const std::vector<Transform>& transforms() const { return transforms_; }

  // {3, H, W} for CHW, {H, W, 3} for HWC.
  std::array<int64_t, 3> output_shape() const;
  size_t output_bytes() const;

  // Decodes `file` and writes exactly output_bytes() bytes to dst. `rng` supplies the random
  // parameters (torchvision's draws, in transform order). REQUIRES: dst suitably aligned for the
  // dtype (2 or 4 bytes).
  void run(std::span<const std::byte> file, SampleRng& rng, std::byte* dst,
           ImageScratch& scratch) const;

  // run() on a decoded picture: the transforms read only the region they need of it (a clip's
  // frames each run with a copy of one SampleRng, so that every frame gets the same draws).
  void run(Picture& picture, SampleRng& rng, std::byte* dst, ImageScratch& scratch) const;

  // Decodes `file` and runs the transforms of the image (PipelineOptions::any_size), drawing from
  // `rng` as run() does; the result lives in `scratch` until its next use. REQUIRES: a list
  // with no ToTensor, Normalize or erasing after them (std::logic_error otherwise).
  ImageView run_image(std::span<const std::byte> file, SampleRng& rng,
                      ImageScratch& scratch) const;

 private:
  void run_input(internal::PixelInput& input, SampleRng& rng, std::byte* dst,
                 ImageScratch& scratch) const;
  // Decodes and runs the transforms of the image: into `out` (the output rows, flips applied)
  // when given and the list has no image transform, else into scratch's stage image.
  void transform_image(internal::PixelInput& input, SampleRng& rng, internal::ScratchImpl& s,
                       internal::RowSink out, void* out_ctx) const;

  std::vector<Transform> transforms_;
  PipelineOptions options_;
  // transforms_[0, fused_end_) compose into the decoder's resample; [fused_end_, image_end_)
  // run on the image in memory; the rest are ToTensor, Normalize and RandomErasing.
  size_t fused_end_ = 0, image_end_ = 0;
  // RandomErasing after ToTensor: its place in transforms_, and the Normalize after it, if any.
  struct TensorOp {
    size_t index;
    std::optional<std::pair<std::array<float, 3>, std::array<float, 3>>> normalize_after;
  };
  std::vector<TensorOp> tensor_ops_;
  int height_ = 0, width_ = 0;
  DType dtype_ = DType::kUInt8;
  Layout layout_ = Layout::kCHW;
  // Per channel and 8-bit value, the output element (bytes of the dtype): fuses ToTensor's
  // scaling and Normalize into a table look-up.
  std::vector<std::byte> lut_;
};

}  // namespace stoker::image
