#include "stoker/image/pipeline.h"

#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#define STOKER_PIPELINE_X86 1
#include <immintrin.h>
#else
#define STOKER_PIPELINE_X86 0
#endif

#include "convert.h"
#include "decode_region.h"
#include "geometry.h"
#include "image_stage.h"
#include "output_row.h"
#include "resample.h"
#include "stoker/errors.h"

namespace stoker::image {
namespace internal {

struct ScratchImpl {
  RegionDecoder decoder;
  CachedCoeffs h, v;
  std::vector<uint8_t> tmp, row;
  std::vector<std::byte> out_row;
  StageScratch stage;  // the image stage's images (a list with image transforms)
};

}  // namespace internal

ImageScratch::ImageScratch() : impl_(std::make_unique<internal::ScratchImpl>()) {}
ImageScratch::~ImageScratch() = default;
ImageScratch::ImageScratch(ImageScratch&&) noexcept = default;
ImageScratch& ImageScratch::operator=(ImageScratch&&) noexcept = default;

namespace internal {

// What transform_image reads pixels from: an encoded file (decoded region by region) or a
// Picture (a decoded video frame, converted region by region).
class PixelInput {
 public:
  virtual ~PixelInput() = default;
  virtual ImageInfo open() = 0;
  // Whether decode() takes scale_num < 8 (JPEG's DCT scaling).
  virtual bool scalable() const = 0;
  virtual DecodedRegion decode(int scale_num, Rect want, const JpegOptions& options) = 0;
};

}  // namespace internal

namespace {

class FileInput final : public internal::PixelInput {
 public:
  FileInput(internal::RegionDecoder& decoder, std::span<const std::byte> file,
            const PipelineOptions& options)
      : decoder_(decoder), file_(file), max_pixels_(options.max_pixels), alpha_(options.alpha) {}
  ImageInfo open() override { return info_ = decoder_.open(file_, max_pixels_, alpha_); }
  bool scalable() const override { return info_.format == ImageFormat::kJpeg; }
  internal::DecodedRegion decode(int scale_num, internal::Rect want,
                                 const internal::JpegOptions& options) override {
    return decoder_.decode(scale_num, want, options);
  }

 private:
  internal::RegionDecoder& decoder_;
  std::span<const std::byte> file_;
  uint64_t max_pixels_;
  Alpha alpha_;
  ImageInfo info_;
};

class PictureInput final : public internal::PixelInput {
 public:
  PictureInput(Picture& picture, uint64_t max_pixels)
      : picture_(picture), max_pixels_(max_pixels) {}
  ImageInfo open() override {
    ImageInfo info{picture_.width(), picture_.height(), ImageFormat::kPng};
    if (info.width <= 0 || info.height <= 0) throw DecodeError("a picture of no pixels");
    internal::check_pixel_limit(info.width, info.height, max_pixels_);
    return info;
  }
  bool scalable() const override { return true; }
  internal::DecodedRegion decode(int scale_num, internal::Rect want,
                                 const internal::JpegOptions&) override {
    const RgbRegion r = picture_.rgb(want.x0, want.y0, want.x1, want.y1, scale_num);
    return {{r.x0, r.y0, r.x1, r.y1}, r.data, r.stride};
  }

 private:
  Picture& picture_;
  uint64_t max_pixels_;
};

// Copies a finished output row to the batch. The batch (tens of MB) is not read again by this
// thread: non-temporal stores write it without first reading each cache line into the cache
// and without evicting the decoder's working set. run() fences them before it returns.
void stream_out(std::byte* dst, const std::byte* src, size_t n) {
#if STOKER_PIPELINE_X86
  if ((reinterpret_cast<uintptr_t>(dst) & 15) == 0 && n % 16 == 0) {
    for (size_t i = 0; i < n; i += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

struct SinkCtx {
  internal::RowFormat format;
  int height;
  std::byte* dst;
  std::byte* row;  // one output row (all channels), built here in cache, then streamed out
  bool flip, vflip;
};

// Writes output row y from 8-bit RGB through the per-channel table (ToTensor's scaling and
// Normalize), flipped if asked, in the output layout.
void sink(void* c, int row_in, const uint8_t* rgb) {
  auto* s = static_cast<SinkCtx*>(c);
  const int h = s->height;
  const int y = s->vflip ? h - 1 - row_in : row_in;
  internal::write_row(s->format, rgb, s->flip, s->row);
  const size_t row_bytes = static_cast<size_t>(s->format.width) * element_size(s->format.dtype);
  if (s->format.layout == Layout::kHWC) {
    stream_out(s->dst + static_cast<size_t>(y) * 3 * row_bytes, s->row, 3 * row_bytes);
  } else {
    for (int ch = 0; ch < 3; ++ch)
      stream_out(s->dst + (static_cast<size_t>(ch) * h + y) * row_bytes, s->row + ch * row_bytes,
                 row_bytes);
  }
}

}  // namespace

ImagePipeline::ImagePipeline(std::vector<Transform> transforms, PipelineOptions options)
    : transforms_(std::move(transforms)), options_(options) {
  OutputTable out = output_table(transforms_);  // validates the list
  dtype_ = out.dtype;
  layout_ = out.layout;
  lut_ = std::move(out.table);
  lut_.resize(lut_.size() + internal::kRowTablePadding);
  while (fused_end_ < transforms_.size() && stage_of(transforms_[fused_end_], false) == Stage::kFused)
    ++fused_end_;
  image_end_ = fused_end_;
  while (image_end_ < transforms_.size() && stage_of(transforms_[image_end_], false) != Stage::kOutput)
    ++image_end_;
  for (size_t i = image_end_; i < transforms_.size(); ++i) {
    if (!std::holds_alternative<RandomErasing>(transforms_[i])) continue;
    TensorOp op{i, std::nullopt};
    for (size_t k = i + 1; k < transforms_.size(); ++k)
      if (const auto* n = std::get_if<Normalize>(&transforms_[k])) op.normalize_after = {{n->mean, n->std}};
    tensor_ops_.push_back(op);
  }
  // Output size, as far as it can be known without an image.
  const std::optional<std::pair<int, int>> size =
      internal::size_after({transforms_.data(), image_end_}, std::nullopt);
  if (options_.any_size) {
    if (image_end_ != transforms_.size()) {
      throw InvalidArgument("ImagePipeline: a pipeline of any output size runs the transforms "
                            "of the image only, not ToTensor, Normalize or erasing after them");
    }
    if (size) std::tie(height_, width_) = *size;
    return;
  }
  if (!size) {
    throw InvalidArgument(
        "ImagePipeline: the output size depends on the image (batching needs a fixed size); end "
        "the transforms of the image with CenterCrop, RandomResizedCrop, RandomCrop or "
        "Resize((h, w)), and keep size-changing ones out of RandomApply");
  }
  std::tie(height_, width_) = *size;
}

std::array<int64_t, 3> ImagePipeline::output_shape() const {
  if (layout_ == Layout::kHWC) return {height_, width_, 3};
  return {3, height_, width_};
}

size_t ImagePipeline::output_bytes() const {
  return static_cast<size_t>(height_) * width_ * 3 * element_size(dtype_);
}

void ImagePipeline::run(std::span<const std::byte> file, SampleRng& rng, std::byte* dst,
                        ImageScratch& scratch) const {
  FileInput input(scratch.impl_->decoder, file, options_);
  run_input(input, rng, dst, scratch);
}

void ImagePipeline::run(Picture& picture, SampleRng& rng, std::byte* dst,
                        ImageScratch& scratch) const {
  PictureInput input(picture, options_.max_pixels);
  run_input(input, rng, dst, scratch);
}

void ImagePipeline::run_input(internal::PixelInput& input, SampleRng& rng, std::byte* dst,
                              ImageScratch& scratch) const {
  if (height_ == 0) {
    throw std::logic_error("ImagePipeline::run: a pipeline of any output size has no tensor: "
                           "use run_image()");
  }
  internal::ScratchImpl& s = *scratch.impl_;
  s.out_row.resize(static_cast<size_t>(width_) * 3 * element_size(dtype_));
  SinkCtx ctx{{dtype_, layout_, lut_.data(), width_}, height_, dst, s.out_row.data(), false,
              false};
  const internal::RowSink fn = sink;
  if (fused_end_ == image_end_) {  // no image transform: the resample writes the batch
    transform_image(input, rng, s, fn, &ctx);
  } else {
    transform_image(input, rng, s, nullptr, nullptr);
    const internal::RgbView v = s.stage.image().view();
    if (v.height != height_ || v.width != width_) {  // a bug, not bad input: the size is static
      throw std::logic_error("ImagePipeline: the image stage made " + std::to_string(v.height) +
                             "x" + std::to_string(v.width) + ", not the output size");
    }
    for (int y = 0; y < height_; ++y) fn(&ctx, y, v.row(y));
  }
  if (!tensor_ops_.empty()) {
#if STOKER_PIPELINE_X86
    _mm_sfence();  // the streamed rows are read back
#endif
    const internal::OutputView out{dst, height_, width_, dtype_, layout_};
    for (const TensorOp& op : tensor_ops_) {
      internal::erase_output(std::get<RandomErasing>(transforms_[op.index]), out, rng,
                             op.normalize_after);
    }
  }
#if STOKER_PIPELINE_X86
  _mm_sfence();  // the streamed rows are visible before the sample is reported done
#endif
}

ImageView ImagePipeline::run_image(std::span<const std::byte> file, SampleRng& rng,
                                   ImageScratch& scratch) const {
  if (image_end_ != transforms_.size()) {
    throw std::logic_error(
        "ImagePipeline::run_image: the list has ToTensor, Normalize or "
        "erasing after them; use run()");
  }
  internal::ScratchImpl& s = *scratch.impl_;
  FileInput input(s.decoder, file, options_);
  transform_image(input, rng, s, nullptr, nullptr);
  const internal::RgbView v = s.stage.image().view();
  return ImageView{v.data, v.height, v.width, v.stride};
}

void ImagePipeline::transform_image(internal::PixelInput& input, SampleRng& rng,
                                    internal::ScratchImpl& s, internal::RowSink out,
                                    void* out_ctx) const {
  const ImageInfo info = input.open();
  const std::span<const Transform> all(transforms_);
  internal::StageScratch& st = s.stage;
  if (fused_end_ == 0) {  // the list starts with an image transform: the whole image
    const internal::DecodedRegion r = input.decode(8, {0, 0, info.width, info.height}, {});
    st.image().reset(info.height, info.width);
    const internal::RgbView v = st.image().view();
    for (int y = 0; y < info.height; ++y)
      std::memcpy(v.row(y), r.rgb + static_cast<size_t>(y) * r.stride,
                  static_cast<size_t>(info.width) * 3);
  } else {
    const internal::GeometryPlan plan =
        internal::plan_geometry(all.first(fused_end_), info.width, info.height, rng);
    const int num =
        input.scalable() ? internal::choose_scale_num(plan, options_.dct_min_ratio) : 8;
    const internal::AxisPlan ax =
        internal::scale_axis(plan.x, num, internal::scaled_size(info.width, num));
    const internal::AxisPlan ay =
        internal::scale_axis(plan.y, num, internal::scaled_size(info.height, num));
    s.h.prepare(ax.spec());
    s.v.prepare(ay.spec());
    const internal::AxisCoeffs& h = s.h.coeffs();
    const internal::AxisCoeffs& v = s.v.coeffs();

    // Decode just the pixels the resample reads (one pixel when the output is all padding, so
    // that the file is still checked).
    internal::Rect want{ax.lo + h.lo, ay.lo + v.lo, ax.lo + h.hi, ay.lo + v.hi};
    if (h.lo == h.hi || v.lo == v.hi) want = {0, 0, 1, 1};
    const internal::JpegOptions jpeg{options_.fast_idct, options_.fancy_upsampling};
    const internal::DecodedRegion r = input.decode(num, want, jpeg);
    s.h.move(ax.lo - r.rect.x0);
    s.v.move(ay.lo - r.rect.y0);
    if (out != nullptr) {  // straight to the output sink, which applies the flips
      auto* ctx = static_cast<SinkCtx*>(out_ctx);
      ctx->flip = plan.flip;
      ctx->vflip = plan.vflip;
      internal::resample_rgb8(r.rgb, r.stride, h, v, s.tmp, s.row, out, ctx,
                              internal::pil_vertical_first(ax.spec(), ay.spec()));
      return;
    }
    st.image().reset(plan.y.size, plan.x.size);
    internal::ImageSink to_image{st.image().view(), plan.flip, plan.vflip};
    internal::resample_rgb8(r.rgb, r.stride, h, v, s.tmp, s.row, internal::image_sink,
                            &to_image, internal::pil_vertical_first(ax.spec(), ay.spec()));
  }
  internal::run_image_stage(all.subspan(fused_end_, image_end_ - fused_end_), rng, st);
}

}  // namespace stoker::image
