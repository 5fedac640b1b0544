// The image wing (stoker._native.image).
//
// Image pipelines (checked, and parsed for the image sources of sources.cc) and single-image
// decoding for __getitem__.
//
// A pipeline arrives as a list of (name, params) pairs (private format, written by
// stoker/transforms/), params a dict whose keys are the C++ members' names (augment.h,
// transforms.h): ("RandomResizedCrop", {"height": 224, "width": 224, "scale": (0.08, 1.0),
// "ratio": (0.75, 1.333), "antialias": True}), ("ToTensor", {"dtype": "float32", "layout":
// "CHW", "scale": True}), ... Enums travel as their lower-case names ("bilinear", "reflect",
// "imagenet"); a fill as None or 3 numbers; a range as None or 2 numbers.
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>

#include "bindings.h"
#include "stoker/errors.h"
#include "stoker/image/decode.h"
#include "stoker/image/pipeline.h"
#include "stoker/sources/image_files.h"
#include "stoker/sources/image_source.h"  // to_dtype

namespace stoker::python {
namespace {

image::DType parse_image_dtype(const std::string& s) {
  if (s == "uint8") return image::DType::kUInt8;
  if (s == "float32") return image::DType::kFloat32;
  if (s == "float16") return image::DType::kFloat16;
  if (s == "bfloat16") return image::DType::kBFloat16;
  throw InvalidArgument(
      "ToTensor dtype must be \"uint8\", \"float32\", \"float16\" or "
      "\"bfloat16\", got \"" +
      s + "\"");
}

image::Layout parse_layout(const std::string& s) {
  if (s == "CHW") return image::Layout::kCHW;
  if (s == "HWC") return image::Layout::kHWC;
  throw InvalidArgument("ToTensor layout must be \"CHW\" or \"HWC\", got \"" + s + "\"");
}

// Typed access to a transform's parameters, with errors that name the transform and key.
class Params {
 public:
  Params(std::string name, nb::dict d) : name_(std::move(name)), d_(std::move(d)) {}

  bool has(const char* key) const { return d_.contains(key); }

  // "interpolation": "bilinear" (also when absent) or "bicubic".
  image::ResizeFilter resize_filter() const {
    if (!d_.contains("interpolation")) return image::ResizeFilter::kBilinear;
    const auto s = get<std::string>("interpolation");
    if (s == "bilinear") return image::ResizeFilter::kBilinear;
    if (s == "bicubic") return image::ResizeFilter::kBicubic;
    throw InvalidArgument(name_ + ": interpolation must be bilinear or bicubic, got " + s);
  }

  template <typename T>
  T get(const char* key) const {
    try {
      return nb::cast<T>(at(key));
    } catch (const nb::cast_error&) {
      throw InvalidArgument(name_ + ": parameter '" + key + "' has the wrong type");
    }
  }
  std::pair<double, double> pair(const char* key) const {
    const auto v = get<std::vector<double>>(key);
    if (v.size() != 2) throw InvalidArgument(name_ + ": '" + key + "' must be 2 numbers");
    return {v[0], v[1]};
  }
  std::optional<std::pair<double, double>> range(const char* key) const {
    if (!d_.contains(key) || d_[key].is_none()) return std::nullopt;
    return pair(key);
  }
  std::array<float, 3> triple(const char* key) const {
    const auto v = get<std::vector<float>>(key);
    if (v.size() != 3) throw InvalidArgument(name_ + ": '" + key + "' must be 3 numbers");
    return {v[0], v[1], v[2]};
  }
  std::array<uint8_t, 3> bytes(const char* key) const {
    const auto v = get<std::vector<int>>(key);
    if (v.size() != 3 || std::any_of(v.begin(), v.end(), [](int x) { return x < 0 || x > 255; }))
      throw InvalidArgument(name_ + ": '" + key + "' must be 3 integers in [0, 255]");
    return {uint8_t(v[0]), uint8_t(v[1]), uint8_t(v[2])};
  }
  image::Fill fill(const char* key = "fill") const {
    if (!d_.contains(key) || d_[key].is_none()) return std::nullopt;
    return triple(key);
  }
  std::optional<std::array<double, 2>> center() const {
    if (!d_.contains("center") || d_["center"].is_none()) return std::nullopt;
    const auto [x, y] = pair("center");
    return std::array<double, 2>{x, y};
  }
  image::Interpolation interpolation() const {
    const auto s = get<std::string>("interpolation");
    if (s == "nearest") return image::Interpolation::kNearest;
    if (s == "bilinear") return image::Interpolation::kBilinear;
    throw InvalidArgument(name_ + ": interpolation must be \"nearest\" or \"bilinear\"");
  }
  image::PadMode pad_mode() const {
    const auto s = get<std::string>("mode");
    if (s == "constant") return image::PadMode::kConstant;
    if (s == "edge") return image::PadMode::kEdge;
    if (s == "reflect") return image::PadMode::kReflect;
    if (s == "symmetric") return image::PadMode::kSymmetric;
    throw InvalidArgument(name_ + ": mode must be constant, edge, reflect or symmetric");
  }
  image::Pad pad() const {
    return image::Pad(get<int>("left"), get<int>("top"), get<int>("right"), get<int>("bottom"),
                      bytes("fill"), pad_mode());
  }

 private:
  nb::handle at(const char* key) const {
    if (!d_.contains(key)) throw InvalidArgument(name_ + ": missing parameter '" + key + "'");
    return d_[key];
  }
  std::string name_;
  nb::dict d_;
};

image::AutoAugmentPolicy parse_policy(const std::string& s) {
  if (s == "imagenet") return image::AutoAugmentPolicy::kImageNet;
  if (s == "cifar10") return image::AutoAugmentPolicy::kCifar10;
  if (s == "svhn") return image::AutoAugmentPolicy::kSvhn;
  throw InvalidArgument("AutoAugment: policy must be imagenet, cifar10 or svhn, got " + s);
}

image::Transform parse_transform(const nb::handle& spec) {
  const auto t = nb::cast<nb::tuple>(spec);
  if (t.size() != 2) throw InvalidArgument("a transform spec is a (name, params) pair");
  const std::string name = nb::cast<std::string>(t[0]);
  const Params p(name, nb::cast<nb::dict>(t[1]));
  using namespace image;
  if (name == "RandomResizedCrop")
    return RandomResizedCrop(p.get<int>("height"), p.get<int>("width"), p.pair("scale"),
                             p.pair("ratio"), p.get<bool>("antialias"), p.resize_filter());
  if (name == "Resize") {
    const bool aa = p.get<bool>("antialias");
    const int shorter = p.get<int>("shorter_side");
    const ResizeFilter f = p.resize_filter();
    return shorter > 0 ? Resize(shorter, aa, f)
                       : Resize(p.get<int>("height"), p.get<int>("width"), aa, f);
  }
  if (name == "CenterCrop")
    return CenterCrop(p.get<int>("height"), p.get<int>("width"),
                      p.has("floor") && p.get<bool>("floor"));
  if (name == "CoverCrop")
    return CoverCrop(p.get<int>("height"), p.get<int>("width"), p.get<bool>("random"),
                     p.get<bool>("antialias"));
  if (name == "RandomHorizontalFlip") return RandomHorizontalFlip(p.get<double>("p"));
  if (name == "RandomVerticalFlip") return RandomVerticalFlip(p.get<double>("p"));
  if (name == "ToTensor")
    return ToTensor(parse_image_dtype(p.get<std::string>("dtype")),
                    parse_layout(p.get<std::string>("layout")), p.get<bool>("scale"));
  if (name == "Normalize") return Normalize(p.triple("mean"), p.triple("std"));
  if (name == "Pad") return p.pad();
  if (name == "RandomCrop")
    return RandomCrop(p.get<int>("height"), p.get<int>("width"), p.pad(),
                      p.get<bool>("pad_if_needed"));
  if (name == "ColorJitter")
    return ColorJitter(p.range("brightness"), p.range("contrast"), p.range("saturation"),
                       p.range("hue"));
  if (name == "RandomGrayscale") return RandomGrayscale(p.get<double>("p"));
  if (name == "GaussianBlur")
    return GaussianBlur(p.get<int>("kernel_width"), p.get<int>("kernel_height"), p.pair("sigma"));
  if (name == "RandomRotation")
    return RandomRotation(p.pair("degrees"), p.interpolation(), p.fill(), p.center());
  if (name == "RandomAffine")
    return RandomAffine(p.pair("degrees"), p.range("translate"), p.range("scale"),
                        p.range("shear_x"), p.range("shear_y"), p.interpolation(), p.fill(),
                        p.center());
  if (name == "TrivialAugmentWide")
    return TrivialAugmentWide(p.get<int>("num_magnitude_bins"), p.interpolation(), p.fill());
  if (name == "RandAugment")
    return RandAugment(p.get<int>("num_ops"), p.get<int>("magnitude"),
                       p.get<int>("num_magnitude_bins"), p.interpolation(), p.fill());
  if (name == "AutoAugment")
    return AutoAugment(parse_policy(p.get<std::string>("policy")), p.interpolation(), p.fill());
  if (name == "RandomErasing")
    return RandomErasing(p.get<double>("p"), p.pair("scale"), p.pair("ratio"), p.triple("value"),
                         p.get<bool>("random_value"));
  if (name == "RandomApply") return RandomApply(p.get<double>("p"), p.get<int>("count"));
  throw InvalidArgument("unknown transform '" + name + "'");
}

nb::ndarray<nb::numpy, uint8_t> to_numpy(image::DecodedImage img) {
  auto* rgb = new std::vector<uint8_t>(std::move(img.rgb));
  nb::capsule owner(rgb, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  const size_t shape[3] = {static_cast<size_t>(img.height), static_cast<size_t>(img.width), 3};
  return nb::ndarray<nb::numpy, uint8_t>(rgb->data(), 3, shape, owner);
}

}  // namespace

image::Alpha parse_alpha(const std::string& alpha) {
  if (alpha == "drop") return image::Alpha::kDrop;
  if (alpha == "white") return image::Alpha::kOverWhite;
  throw InvalidArgument("alpha is \"drop\" or \"white\", got \"" + alpha + "\"");
}

std::vector<std::byte> read_whole_file(const std::string& path) {
  auto files = ImageFolderFiles({{path, 0}});
  std::vector<std::byte> bytes;
  files.read(0, bytes);
  return bytes;
}

std::vector<image::Transform> parse_transforms(const nb::list& spec) {
  std::vector<image::Transform> transforms;
  for (nb::handle h : spec) transforms.push_back(parse_transform(h));
  return transforms;
}

std::shared_ptr<const image::ImagePipeline> make_pipeline(const nb::list& spec, uint64_t max_pixels,
                                                          image::Alpha alpha) {
  std::vector<image::Transform> transforms = parse_transforms(spec);
  image::PipelineOptions options;
  options.max_pixels = max_pixels;
  options.alpha = alpha;
  return std::make_shared<const image::ImagePipeline>(std::move(transforms), options);
}

void register_image(nb::module_& m) {
  m.attr("DEFAULT_MAX_PIXELS") = image::kDefaultMaxPixels;

  m.def(
      "check_pipeline",
      [](const nb::list& spec) {
        auto p = make_pipeline(spec, image::kDefaultMaxPixels);
        const auto shape = p->output_shape();
        return std::make_pair(std::vector<int64_t>(shape.begin(), shape.end()),
                              to_dtype(p->dtype()).name());
      },
      nb::arg("pipeline"), "(output shape, dtype name); ValueError when the pipeline is invalid.");

  // A compiled pipeline: what a VideoSource (stoker._video) runs on every frame, or, with
  // any_size, the native part of a pipeline that goes on in Python
  // (stoker/transforms/_compile.py): the transforms of the image, any output size, run() per
  // sample on the calling thread.
  nb::class_<image::ImagePipeline>(m, "ImagePipeline")
      .def(nb::new_([](const nb::list& spec, uint64_t max_pixels, bool any_size,
                       const std::string& alpha) {
             image::PipelineOptions options;
             options.max_pixels = max_pixels;
             options.any_size = any_size;
             options.alpha = parse_alpha(alpha);
             return std::make_shared<image::ImagePipeline>(parse_transforms(spec), options);
           }),
           nb::arg("pipeline"), nb::arg("max_pixels") = image::kDefaultMaxPixels,
           nb::arg("any_size") = false, nb::arg("alpha") = "drop",
           "alpha: what a PNG's transparency becomes, \"drop\" (torchvision's loader) or "
           "\"white\" (composited on white, as Hugging Face's image processors do).")
      .def_prop_ro("output_shape", &image::ImagePipeline::output_shape,
                   "[3, H, W] (CHW) or [H, W, 3] (HWC): what a sample's slot holds.")
      .def(
          "run",
          [](const image::ImagePipeline& p, nb::bytes data, uint64_t key) {
            thread_local image::ImageScratch scratch;
            std::span<const std::byte> bytes(static_cast<const std::byte*>(data.data()),
                                             data.size());
            image::DecodedImage out;
            {
              nb::gil_scoped_release release;
              SampleRng rng(key, 0, 0);
              const image::ImageView v = p.run_image(bytes, rng, scratch);
              out.width = v.width;
              out.height = v.height;
              out.rgb.resize(static_cast<size_t>(v.height) * v.width * 3);
              for (int y = 0; y < v.height; ++y)
                std::memcpy(out.rgb.data() + static_cast<size_t>(y) * v.width * 3,
                            v.data + y * v.stride, static_cast<size_t>(v.width) * 3);
            }
            return to_numpy(std::move(out));
          },
          nb::arg("data"), nb::arg("key"),
          "Decodes `data` and runs the transforms with randomness keyed by `key`: an HWC uint8 "
          "RGB array of whatever size they make.");

  m.def(
      "decode_file",
      [](const std::string& path, uint64_t max_pixels, const std::string& alpha) {
        const image::Alpha a = parse_alpha(alpha);
        image::DecodedImage img;
        {
          nb::gil_scoped_release release;
          img = image::decode(read_whole_file(path), max_pixels, a);
        }
        return to_numpy(std::move(img));
      },
      nb::arg("path"), nb::arg("max_pixels") = image::kDefaultMaxPixels, nb::arg("alpha") = "drop");
  m.def(
      "decode_file",
      [](nb::bytes data, uint64_t max_pixels, const std::string& alpha) {
        const image::Alpha a = parse_alpha(alpha);
        std::span<const std::byte> bytes(static_cast<const std::byte*>(data.data()), data.size());
        image::DecodedImage img;
        {
          nb::gil_scoped_release release;
          img = image::decode(bytes, max_pixels, a);
        }
        return to_numpy(std::move(img));
      },
      nb::arg("data"), nb::arg("max_pixels") = image::kDefaultMaxPixels, nb::arg("alpha") = "drop",
      "Decodes a whole image to an HWC uint8 RGB array.");
}

}  // namespace stoker::python
