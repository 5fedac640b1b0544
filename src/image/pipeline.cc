#include "stoker/image/pipeline.h"

#include <cstring>
#include <optional>
#include <string>

#include "convert.h"
#include "decode_region.h"
#include "geometry.h"
#include "resample.h"
#include "stoker/errors.h"

namespace stoker::image {
namespace internal {

struct ScratchImpl {
  RegionDecoder decoder;
  AxisCoeffs h, v;
  std::vector<uint8_t> tmp, row;
};

}  // namespace internal

ImageScratch::ImageScratch() : impl_(std::make_unique<internal::ScratchImpl>()) {}
ImageScratch::~ImageScratch() = default;
ImageScratch::ImageScratch(ImageScratch&&) noexcept = default;
ImageScratch& ImageScratch::operator=(ImageScratch&&) noexcept = default;

namespace {

bool is_geometric(const Transform& t) {
  return !std::holds_alternative<ToTensor>(t) && !std::holds_alternative<Normalize>(t);
}

size_t element_size(DType d) {
  switch (d) {
    case DType::kUInt8:
      return 1;
    case DType::kFloat32:
      return 4;
    default:
      return 2;
  }
}

// Writes one output row from 8-bit RGB through the per-channel table.
template <typename T>
void write_row(const uint8_t* rgb, int y, int h, int w, Layout layout, bool flip, const T* lut,
               T* dst) {
  for (int x = 0; x < w; ++x) {
    const int ox = flip ? w - 1 - x : x;
    const uint8_t* p = rgb + x * 3;
    if (layout == Layout::kHWC) {
      T* o = dst + (static_cast<size_t>(y) * w + ox) * 3;
      o[0] = lut[p[0]];
      o[1] = lut[256 + p[1]];
      o[2] = lut[512 + p[2]];
    } else {
      const size_t plane = static_cast<size_t>(h) * w;
      T* o = dst + static_cast<size_t>(y) * w + ox;
      o[0] = lut[p[0]];
      o[plane] = lut[256 + p[1]];
      o[2 * plane] = lut[512 + p[2]];
    }
  }
}

struct SinkCtx {
  const ImagePipeline* pipeline;
  const std::byte* lut;
  std::byte* dst;
  bool flip;
};

template <typename T>
void sink(void* c, int y, const uint8_t* rgb) {
  auto* s = static_cast<SinkCtx*>(c);
  const ImagePipeline& p = *s->pipeline;
  write_row(rgb, y, p.height(), p.width(), p.layout(), s->flip, reinterpret_cast<const T*>(s->lut),
            reinterpret_cast<T*>(s->dst));
}

}  // namespace

ImagePipeline::ImagePipeline(std::vector<Transform> transforms, PipelineOptions options)
    : transforms_(std::move(transforms)), options_(options) {
  // Output size, as far as it can be known without an image.
  std::optional<std::pair<int, int>> size;  // (h, w)
  bool have_tensor = false, have_normalize = false;
  std::array<float, 3> mean{0, 0, 0}, stdev{1, 1, 1};
  for (const Transform& t : transforms_) {
    std::visit([](const auto& v) { v.validate(); }, t);
    if (is_geometric(t) && have_tensor) {
      throw InvalidArgument(
          "ImagePipeline: geometric transforms must come before ToTensor and Normalize");
    }
    if (const auto* r = std::get_if<RandomResizedCrop>(&t)) {
      size = {r->height, r->width};
    } else if (const auto* rs = std::get_if<Resize>(&t)) {
      if (rs->exact()) {
        size = {rs->height, rs->width};
      } else if (size) {
        size = resize_output_size(size->first, size->second, *rs);
      }
    } else if (const auto* cc = std::get_if<CenterCrop>(&t)) {
      size = {cc->height, cc->width};
    } else if (const auto* tt = std::get_if<ToTensor>(&t)) {
      if (have_tensor) throw InvalidArgument("ImagePipeline: ToTensor may appear only once");
      have_tensor = true;
      dtype_ = tt->dtype;
      layout_ = tt->layout;
    } else if (const auto* n = std::get_if<Normalize>(&t)) {
      if (!have_tensor || dtype_ == DType::kUInt8 || have_normalize) {
        throw InvalidArgument(
            "ImagePipeline: Normalize must follow a ToTensor with a float dtype (float32, "
            "float16 or bfloat16), once");
      }
      have_normalize = true;
      mean = n->mean;
      stdev = n->std;
    }
  }
  if (!size) {
    throw InvalidArgument(
        "ImagePipeline: the output size depends on the image (batching needs a fixed size); end "
        "the geometric transforms with CenterCrop, RandomResizedCrop or Resize((h, w))");
  }
  std::tie(height_, width_) = *size;

  const size_t es = element_size(dtype_);
  lut_.resize(768 * es);
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      std::byte* o = lut_.data() + (c * 256 + v) * es;
      // torchvision: uint8 -> float32, / 255, then (x - mean) / std, all in float32.
      const float f = (static_cast<float>(v) / 255.0f - mean[c]) / stdev[c];
      if (dtype_ == DType::kUInt8) {
        const auto u = static_cast<uint8_t>(v);
        std::memcpy(o, &u, 1);
      } else if (dtype_ == DType::kFloat32) {
        std::memcpy(o, &f, 4);
      } else {
        const uint16_t b =
            dtype_ == DType::kFloat16 ? internal::float_to_half(f) : internal::float_to_bf16(f);
        std::memcpy(o, &b, 2);
      }
    }
  }
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
  internal::ScratchImpl& s = *scratch.impl_;
  const ImageInfo info = s.decoder.open(file, options_.max_pixels);
  const internal::GeometryPlan plan =
      internal::plan_geometry(transforms_, info.width, info.height, rng);

  const int num = info.format == ImageFormat::kJpeg
                      ? internal::choose_scale_num(plan, options_.dct_min_ratio)
                      : 8;
  const internal::AxisPlan ax =
      internal::scale_axis(plan.x, num, internal::scaled_size(info.width, num));
  const internal::AxisPlan ay =
      internal::scale_axis(plan.y, num, internal::scaled_size(info.height, num));
  internal::compute_coeffs(ax.spec(), s.h);
  internal::compute_coeffs(ay.spec(), s.v);

  // Decode just the pixels the resample reads (one pixel when the output is all padding, so
  // that the file is still checked).
  internal::Rect want{ax.lo + s.h.lo, ay.lo + s.v.lo, ax.lo + s.h.hi, ay.lo + s.v.hi};
  if (s.h.lo == s.h.hi || s.v.lo == s.v.hi) want = {0, 0, 1, 1};
  const internal::JpegOptions jpeg{options_.fast_idct, options_.fancy_upsampling};
  const internal::DecodedRegion r = s.decoder.decode(num, want, jpeg);
  internal::shift_coeffs(s.h, ax.lo - r.rect.x0);
  internal::shift_coeffs(s.v, ay.lo - r.rect.y0);

  SinkCtx ctx{this, lut_.data(), dst, plan.flip};
  internal::RowSink fn = nullptr;
  switch (dtype_) {
    case DType::kUInt8:
      fn = sink<uint8_t>;
      break;
    case DType::kFloat32:
      fn = sink<float>;
      break;
    default:
      fn = sink<uint16_t>;
  }
  internal::resample_rgb8(r.rgb, r.stride, s.h, s.v, s.tmp, s.row, fn, &ctx);
}

}  // namespace stoker::image
