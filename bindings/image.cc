// The image wing (stoker._native.image).
//
// Image pipelines (checked, and parsed for the image sources of sources.cc) and single-image
// decoding for __getitem__.
//
// A pipeline arrives as a list of tuples (private format, written by stoker/transforms.py):
//   ("RandomResizedCrop", h, w, scale_lo, scale_hi, ratio_lo, ratio_hi)
//   ("Resize", shorter_side) | ("Resize", h, w)
//   ("CenterCrop", h, w)
//   ("RandomHorizontalFlip", p)
//   ("ToTensor", "uint8"|"float32"|"float16"|"bfloat16", "CHW"|"HWC")
//   ("Normalize", (m0, m1, m2), (s0, s1, s2))
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

image::Transform parse_transform(const nb::tuple& t) {
  if (t.size() == 0) throw InvalidArgument("empty transform spec");
  const std::string name = nb::cast<std::string>(t[0]);
  const size_t n = t.size();
  auto i = [&](size_t k) { return nb::cast<int>(t[k]); };
  auto d = [&](size_t k) { return nb::cast<double>(t[k]); };
  if (name == "RandomResizedCrop" && n == 7)
    return image::RandomResizedCrop(i(1), i(2), {d(3), d(4)}, {d(5), d(6)});
  if (name == "Resize" && n == 2) return image::Resize(i(1));
  if (name == "Resize" && n == 3) return image::Resize(i(1), i(2));
  if (name == "CenterCrop" && n == 3) return image::CenterCrop(i(1), i(2));
  if (name == "RandomHorizontalFlip" && n == 2) return image::RandomHorizontalFlip(d(1));
  if (name == "ToTensor" && n == 3)
    return image::ToTensor(parse_image_dtype(nb::cast<std::string>(t[1])),
                           parse_layout(nb::cast<std::string>(t[2])));
  if (name == "Normalize" && n == 3)
    return image::Normalize(nb::cast<std::array<float, 3>>(t[1]),
                            nb::cast<std::array<float, 3>>(t[2]));
  throw InvalidArgument("unknown transform spec '" + name + "' with " + std::to_string(n - 1) +
                        " arguments");
}

nb::ndarray<nb::numpy, uint8_t> to_numpy(image::DecodedImage img) {
  auto* rgb = new std::vector<uint8_t>(std::move(img.rgb));
  nb::capsule owner(rgb, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  const size_t shape[3] = {static_cast<size_t>(img.height), static_cast<size_t>(img.width), 3};
  return nb::ndarray<nb::numpy, uint8_t>(rgb->data(), 3, shape, owner);
}

}  // namespace

std::vector<std::byte> read_whole_file(const std::string& path) {
  auto files = ImageFolderFiles({{path, 0}});
  std::vector<std::byte> bytes;
  files.read(0, bytes);
  return bytes;
}

std::vector<image::Transform> parse_transforms(const nb::list& spec) {
  std::vector<image::Transform> transforms;
  for (nb::handle h : spec) transforms.push_back(parse_transform(nb::cast<nb::tuple>(h)));
  return transforms;
}

std::shared_ptr<const image::ImagePipeline> make_pipeline(const nb::list& spec,
                                                          uint64_t max_pixels) {
  std::vector<image::Transform> transforms = parse_transforms(spec);
  image::PipelineOptions options;
  options.max_pixels = max_pixels;
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

  m.def(
      "decode_file",
      [](const std::string& path, uint64_t max_pixels) {
        image::DecodedImage img;
        {
          nb::gil_scoped_release release;
          img = image::decode(read_whole_file(path), max_pixels);
        }
        return to_numpy(std::move(img));
      },
      nb::arg("path"), nb::arg("max_pixels") = image::kDefaultMaxPixels);
  m.def(
      "decode_file",
      [](nb::bytes data, uint64_t max_pixels) {
        std::span<const std::byte> bytes(static_cast<const std::byte*>(data.data()), data.size());
        image::DecodedImage img;
        {
          nb::gil_scoped_release release;
          img = image::decode(bytes, max_pixels);
        }
        return to_numpy(std::move(img));
      },
      nb::arg("data"), nb::arg("max_pixels") = image::kDefaultMaxPixels,
      "Decodes a whole image to an HWC uint8 RGB array.");

}

}  // namespace stoker::python
