#include "stoker/image/transforms.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "convert.h"
#include "stoker/errors.h"

namespace stoker::image {
namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw InvalidArgument(what);
}

// Python's round(): half to even, as torchvision relies on.
int py_round(double v) { return static_cast<int>(std::nearbyint(v)); }

}  // namespace

RandomResizedCrop::RandomResizedCrop(int height, int width, std::pair<double, double> scale,
                                     std::pair<double, double> ratio, bool antialias,
                                     ResizeFilter interpolation)
    : height(height),
      width(width),
      scale(scale),
      ratio(ratio),
      antialias(antialias),
      interpolation(interpolation) {
  validate();
}

void RandomResizedCrop::validate() const {
  require(height > 0 && width > 0, "RandomResizedCrop: height and width must be positive");
  require(scale.first > 0 && scale.first <= scale.second,
          "RandomResizedCrop: scale must satisfy 0 < scale.min <= scale.max");
  require(ratio.first > 0 && ratio.first <= ratio.second,
          "RandomResizedCrop: ratio must satisfy 0 < ratio.min <= ratio.max");
  require(antialias || interpolation == ResizeFilter::kBilinear,
          "RandomResizedCrop: antialias=false is bilinear only");
}

Resize::Resize(int shorter_side, bool antialias, ResizeFilter interpolation)
    : shorter_side(shorter_side), antialias(antialias), interpolation(interpolation) {
  require(shorter_side > 0, "Resize: the shorter side must be positive");
  validate();
}

Resize::Resize(int height, int width, bool antialias, ResizeFilter interpolation)
    : height(height), width(width), antialias(antialias), interpolation(interpolation) {
  validate();
}

void Resize::validate() const {
  require(exact() ? height > 0 && width > 0 && shorter_side == 0
                  : shorter_side > 0 && height == 0 && width == 0,
          "Resize: give either a positive shorter side or a positive (height, width)");
  require(antialias || interpolation == ResizeFilter::kBilinear,
          "Resize: antialias=false is bilinear only");
}

CenterCrop::CenterCrop(int height, int width, bool floor)
    : height(height), width(width), floor(floor) {
  validate();
}

void CenterCrop::validate() const {
  require(height > 0 && width > 0, "CenterCrop: height and width must be positive");
}

RandomHorizontalFlip::RandomHorizontalFlip(double p) : p(p) { validate(); }

void RandomHorizontalFlip::validate() const {
  require(p >= 0 && p <= 1, "RandomHorizontalFlip: p must be in [0, 1]");
}

Normalize::Normalize(std::array<float, 3> mean, std::array<float, 3> std) : mean(mean), std(std) {
  validate();
}

void Normalize::validate() const {
  for (int c = 0; c < 3; ++c) {
    require(std::isfinite(mean[c]) && std::isfinite(std[c]) && std[c] != 0,
            "Normalize: mean must be finite and std finite and non-zero");
  }
}

Stage stage_of(const Transform& t, bool after_to_tensor) {
  if (std::holds_alternative<ToTensor>(t) || std::holds_alternative<Normalize>(t))
    return Stage::kOutput;
  if (std::holds_alternative<RandomErasing>(t))
    return after_to_tensor ? Stage::kTensor : Stage::kImage;
  if (std::holds_alternative<RandomResizedCrop>(t) || std::holds_alternative<Resize>(t) ||
      std::holds_alternative<CenterCrop>(t) || std::holds_alternative<CoverCrop>(t) ||
      std::holds_alternative<RandomHorizontalFlip>(t) ||
      std::holds_alternative<RandomVerticalFlip>(t))
    return Stage::kFused;
  return Stage::kImage;
}

size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::kUInt8:
      return 1;
    case DType::kFloat32:
      return 4;
    default:
      return 2;
  }
}

OutputTable output_table(const std::vector<Transform>& transforms) {
  OutputTable out;
  bool have_tensor = false, have_normalize = false, scale = true;
  std::array<float, 3> mean{0, 0, 0}, stdev{1, 1, 1};
  for (size_t i = 0; i < transforms.size(); ++i) {
    const Transform& t = transforms[i];
    std::visit([](const auto& v) { v.validate(); }, t);
    const Stage stage = stage_of(t, have_tensor);
    if ((stage == Stage::kFused || stage == Stage::kImage) && have_tensor) {
      throw InvalidArgument(
          "ImagePipeline: transforms of the image (crops, resizes, flips, colour, blur, warps, "
          "auto-augment) must come before ToTensor and Normalize");
    }
    if (const auto* ra = std::get_if<RandomApply>(&t)) {
      require(i + ra->count < transforms.size(),
              "ImagePipeline: RandomApply covers more transforms than follow it");
      for (size_t k = i + 1; k <= i + ra->count; ++k) {
        const Stage inner = stage_of(transforms[k], false);
        require(inner == Stage::kFused || inner == Stage::kImage,
                "ImagePipeline: RandomApply may only cover transforms of the image, not "
                "ToTensor or Normalize");
      }
    }
    if (const auto* tt = std::get_if<ToTensor>(&t)) {
      if (have_tensor) throw InvalidArgument("ImagePipeline: ToTensor may appear only once");
      have_tensor = true;
      out.dtype = tt->dtype;
      out.layout = tt->layout;
      scale = tt->scale;
    } else if (const auto* n = std::get_if<Normalize>(&t)) {
      if (!have_tensor || out.dtype == DType::kUInt8 || have_normalize) {
        throw InvalidArgument(
            "ImagePipeline: Normalize must follow a ToTensor with a float dtype (float32, "
            "float16 or bfloat16), once");
      }
      have_normalize = true;
      mean = n->mean;
      stdev = n->std;
    }
  }
  const size_t es = element_size(out.dtype);
  out.table.resize(768 * es);
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      std::byte* o = out.table.data() + (c * 256 + v) * es;
      // torchvision: uint8 -> float32, / 255 (ToDtype's scale), then (x - mean) / std, all in
      // float32.
      const float x = scale ? static_cast<float>(v) / 255.0f : static_cast<float>(v);
      const float f = (x - mean[c]) / stdev[c];
      if (out.dtype == DType::kUInt8) {
        const auto u = static_cast<uint8_t>(v);
        std::memcpy(o, &u, 1);
      } else if (out.dtype == DType::kFloat32) {
        std::memcpy(o, &f, 4);
      } else {
        const uint16_t b =
            out.dtype == DType::kFloat16 ? internal::float_to_half(f) : internal::float_to_bf16(f);
        std::memcpy(o, &b, 2);
      }
    }
  }
  return out;
}

CoverCrop::CoverCrop(int height, int width, bool random, bool antialias)
    : height(height), width(width), random(random), antialias(antialias) {
  validate();
}

void CoverCrop::validate() const {
  require(height > 0 && width > 0, "CoverCrop: height and width must be positive");
}

CoverBox cover_crop_params(int image_height, int image_width, const CoverCrop& t, SampleRng& rng) {
  const double scale = std::max(static_cast<double>(t.height) / image_height,
                                static_cast<double>(t.width) / image_width);
  CoverBox b{std::max(t.height, py_round(image_height * scale)),
             std::max(t.width, py_round(image_width * scale)), 0, 0};
  if (t.random) {
    b.top = static_cast<int>(rng.uniform_int(0, b.resized_height - t.height + 1));
    b.left = static_cast<int>(rng.uniform_int(0, b.resized_width - t.width + 1));
  } else {
    b.top = py_round((b.resized_height - t.height) / 2.0);
    b.left = py_round((b.resized_width - t.width) / 2.0);
  }
  return b;
}

CropBox random_resized_crop_params(int image_height, int image_width, const RandomResizedCrop& t,
                                   SampleRng& rng) {
  const double area = static_cast<double>(image_height) * image_width;
  const double log_lo = std::log(t.ratio.first), log_hi = std::log(t.ratio.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * rng.uniform(t.scale.first, t.scale.second);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int w = py_round(std::sqrt(target_area * aspect));
    const int h = py_round(std::sqrt(target_area / aspect));
    if (0 < w && w <= image_width && 0 < h && h <= image_height) {
      const int top = static_cast<int>(rng.uniform_int(0, image_height - h + 1));
      const int left = static_cast<int>(rng.uniform_int(0, image_width - w + 1));
      return CropBox{top, left, h, w};
    }
  }
  // Fallback: the central crop with the aspect ratio clamped into range. At least one pixel:
  // torchvision's int(round(w / ratio)) is 0 for an image 1 pixel wide and a ratio above 2, and
  // its resize of that empty crop fails (found by fuzz/fuzz_jpeg).
  const double in_ratio = static_cast<double>(image_width) / image_height;
  int w = image_width, h = image_height;
  if (in_ratio < t.ratio.first) {
    h = std::max(1, py_round(w / t.ratio.first));
  } else if (in_ratio > t.ratio.second) {
    w = std::max(1, py_round(h * t.ratio.second));
  }
  return CropBox{(image_height - h) / 2, (image_width - w) / 2, h, w};
}

std::pair<int, int> resize_output_size(int image_height, int image_width, const Resize& t) {
  if (t.exact()) return {t.height, t.width};
  const bool portrait = image_width <= image_height;
  const int shorter = portrait ? image_width : image_height;
  const int longer = portrait ? image_height : image_width;
  // torchvision: int(size * long / short), a float product truncated.
  const int new_long = static_cast<int>(static_cast<double>(t.shorter_side) * longer / shorter);
  return portrait ? std::pair{new_long, t.shorter_side} : std::pair{t.shorter_side, new_long};
}

CropBox center_crop_box(int image_height, int image_width, const CenterCrop& t) {
  const auto offset = [&t](int excess) {
    return t.floor ? static_cast<int>(std::floor(excess / 2.0)) : py_round(excess / 2.0);
  };
  return CropBox{offset(image_height - t.height), offset(image_width - t.width), t.height, t.width};
}

}  // namespace stoker::image
