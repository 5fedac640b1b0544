// stoker._native.testing.image_op: one image-stage operation (stoker/image/ops.h, or resize.h's
// PIL resize) on an HWC uint8 RGB array with explicit parameters, so that tests can hold every
// kernel against torchvision's (or PIL's) on the same pixels
// (tests/python/test_vision_color_ops.py, test_vision_warp_ops.py, test_image_processors.py).
// Test-only (STOKER_TESTING).
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <string>

#include "bindings.h"
#include "stoker/errors.h"
#include "stoker/image/ops.h"
#include "stoker/image/resize.h"

namespace stoker::python {
namespace {

using namespace image::internal;
using Image = nb::ndarray<uint8_t, nb::shape<-1, -1, 3>, nb::c_contig, nb::device::cpu>;

double number(const nb::dict& p, const char* key) {
  if (!p.contains(key)) throw InvalidArgument(std::string("image_op: missing parameter ") + key);
  return nb::cast<double>(p[key]);
}

template <size_t N>
std::array<double, N> numbers(const nb::dict& p, const char* key) {
  if (!p.contains(key)) throw InvalidArgument(std::string("image_op: missing parameter ") + key);
  const nb::sequence seq = nb::cast<nb::sequence>(p[key]);
  if (nb::len(seq) != N) throw InvalidArgument(std::string("image_op: wrong length of ") + key);
  std::array<double, N> out{};
  for (size_t i = 0; i < N; ++i) out[i] = nb::cast<double>(seq[i]);
  return out;
}

Interpolation interpolation(const nb::dict& p) {
  const std::string s = p.contains("interpolation") ? nb::cast<std::string>(p["interpolation"])
                                                    : std::string("nearest");
  if (s == "nearest") return Interpolation::kNearest;
  if (s == "bilinear") return Interpolation::kBilinear;
  throw InvalidArgument("image_op: interpolation must be \"nearest\" or \"bilinear\"");
}

// fill: None (absent) or a sequence of 3 numbers.
Fill fill(const nb::dict& p) {
  if (!p.contains("fill") || p["fill"].is_none()) return std::nullopt;
  const auto v = numbers<3>(p, "fill");
  return std::array<float, 3>{float(v[0]), float(v[1]), float(v[2])};
}

std::optional<std::array<double, 2>> center(const nb::dict& p) {
  if (!p.contains("center") || p["center"].is_none()) return std::nullopt;
  return numbers<2>(p, "center");
}

PadMode pad_mode(const nb::dict& p) {
  const std::string s =
      p.contains("mode") ? nb::cast<std::string>(p["mode"]) : std::string("constant");
  if (s == "constant") return PadMode::kConstant;
  if (s == "edge") return PadMode::kEdge;
  if (s == "reflect") return PadMode::kReflect;
  if (s == "symmetric") return PadMode::kSymmetric;
  throw InvalidArgument("image_op: mode must be constant, edge, reflect or symmetric");
}

nb::ndarray<nb::numpy, uint8_t> to_array(RgbImage&& img) {
  auto* owned = new RgbImage(std::move(img));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<RgbImage*>(p); });
  const size_t shape[3] = {static_cast<size_t>(owned->height()),
                           static_cast<size_t>(owned->width()), 3};
  return nb::ndarray<nb::numpy, uint8_t>(owned->view().data, 3, shape, owner);
}

nb::ndarray<nb::numpy, uint8_t> image_op(const std::string& name, Image in, const nb::dict& p) {
  const int h = static_cast<int>(in.shape(0)), w = static_cast<int>(in.shape(1));
  RgbImage src;
  src.reset(h, w);
  std::memcpy(src.view().data, in.data(), static_cast<size_t>(h) * w * 3);
  RgbImage dst;
  OpScratch scratch;  // the GIL stays held: parameters are read from the dict as needed
  RgbView v = src.view();
  if (name == "brightness") {
    adjust_brightness(v, number(p, "factor"));
  } else if (name == "contrast") {
    adjust_contrast(v, number(p, "factor"));
  } else if (name == "saturation") {
    adjust_saturation(v, number(p, "factor"));
  } else if (name == "hue") {
    adjust_hue(v, number(p, "factor"), scratch);
  } else if (name == "sharpness") {
    adjust_sharpness(v, number(p, "factor"), scratch);
  } else if (name == "grayscale") {
    rgb_to_grayscale(v);
  } else if (name == "posterize") {
    posterize(v, static_cast<int>(number(p, "bits")));
  } else if (name == "solarize") {
    solarize(v, number(p, "threshold"));
  } else if (name == "autocontrast") {
    autocontrast(v);
  } else if (name == "equalize") {
    equalize(v);
  } else if (name == "invert") {
    invert(v);
  } else if (name == "gaussian_blur") {
    const auto k = numbers<2>(p, "kernel_size");
    const auto s = numbers<2>(p, "sigma");
    gaussian_blur(v, static_cast<int>(k[0]), static_cast<int>(k[1]), s[0], s[1], scratch);
  } else if (name == "affine") {
    dst.reset(h, w);
    affine(v, dst.view(), number(p, "angle"), numbers<2>(p, "translate"), number(p, "scale"),
           numbers<2>(p, "shear"), interpolation(p), fill(p), center(p));
    return to_array(std::move(dst));
  } else if (name == "rotate") {
    dst.reset(h, w);
    rotate(v, dst.view(), number(p, "angle"), interpolation(p), fill(p), center(p));
    return to_array(std::move(dst));
  } else if (name == "resize") {  // resize.h's PIL resize: size (w, h), box, filter
    const auto size = numbers<2>(p, "size");
    const auto box = numbers<4>(p, "box");
    const std::string f = p.contains("filter") ? nb::cast<std::string>(p["filter"]) : "bilinear";
    if (f != "bilinear" && f != "bicubic")
      throw InvalidArgument("image_op: filter must be \"bilinear\" or \"bicubic\"");
    const int ow = static_cast<int>(size[0]), oh = static_cast<int>(size[1]);
    if (ow <= 0 || oh <= 0) throw InvalidArgument("image_op: size must be positive");
    dst.reset(oh, ow);
    image::resize_rgb(
        {in.data(), static_cast<size_t>(h) * w * 3}, w, h,
        {float(box[0]), float(box[1]), float(box[2]), float(box[3])}, ow, oh,
        {dst.view().data, static_cast<size_t>(oh) * ow * 3},
        f == "bicubic" ? image::ResizeFilter::kBicubic : image::ResizeFilter::kBilinear);
    return to_array(std::move(dst));
  } else if (name == "pad") {
    const auto pads = numbers<4>(p, "padding");  // left, top, right, bottom
    const auto f = p.contains("fill") ? numbers<3>(p, "fill") : std::array<double, 3>{};
    dst.reset(h + int(pads[1]) + int(pads[3]), w + int(pads[0]) + int(pads[2]));
    pad(v, dst.view(), int(pads[0]), int(pads[1]), int(pads[2]), int(pads[3]), pad_mode(p),
        {uint8_t(f[0]), uint8_t(f[1]), uint8_t(f[2])});
    return to_array(std::move(dst));
  } else {
    throw InvalidArgument("image_op: unknown operation \"" + name + "\"");
  }
  return to_array(std::move(src));
}

}  // namespace

void register_testing_image_ops(nb::module_& m) {
  m.def("image_op", &image_op, nb::arg("name"), nb::arg("image"), nb::arg("params"),
        "One image-stage operation (stoker/image/ops.h) on a copy of an HWC uint8 RGB array, with "
        "its parameters as a dict (names as torchvision's functional API); returns the result.");
}

}  // namespace stoker::python
