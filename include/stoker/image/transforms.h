// torchvision-style transforms, as values for ImagePipeline: the crops, resizes, flips and the
// output conversion here; the augmentations (colour, blur, warps, auto-augment, erasing) in
// augment.h.
//
// Each type validates its arguments on construction and throws stoker::InvalidArgument saying
// what is allowed (validate() repeats the check; ImagePipeline calls it, since members are
// public). The crops and resizes follow torchvision on PIL images with BILINEAR (the default) or
// BICUBIC interpolation (PIL's antialiased filters, bit for bit: resize.h); antialias=false is
// torch's plain bilinear interpolation of tensors (no filter widening when downscaling), and
// bilinear only.
//
// Thread safety: plain values; the free functions are reentrant.
#pragma once

#include <array>
#include <cstddef>
#include <utility>
#include <variant>
#include <vector>

#include "stoker/image/augment.h"
#include "stoker/image/resize.h"
#include "stoker/random.h"

namespace stoker::image {

// torchvision RandomResizedCrop(size=(height, width), scale, ratio): a random crop of random
// area fraction `scale` and aspect ratio (w/h) `ratio`, resized to height x width.
struct RandomResizedCrop {
  RandomResizedCrop(int height, int width, std::pair<double, double> scale = {0.08, 1.0},
                    std::pair<double, double> ratio = {3.0 / 4.0, 4.0 / 3.0}, bool antialias = true,
                    ResizeFilter interpolation = ResizeFilter::kBilinear);
  void validate() const;
  int height, width;
  std::pair<double, double> scale, ratio;
  bool antialias;
  ResizeFilter interpolation;
};

// torchvision Resize: Resize(n) scales the shorter side to n (the longer becomes
// int(n * long / short)); Resize(h, w) resizes to exactly h x w.
struct Resize {
  explicit Resize(int shorter_side, bool antialias = true,
                  ResizeFilter interpolation = ResizeFilter::kBilinear);
  Resize(int height, int width, bool antialias = true,
         ResizeFilter interpolation = ResizeFilter::kBilinear);
  void validate() const;
  bool exact() const { return shorter_side == 0; }
  int shorter_side = 0;       // 0 for an exact size
  int height = 0, width = 0;  // 0 unless exact
  bool antialias = true;
  ResizeFilter interpolation = ResizeFilter::kBilinear;
};

// torchvision CenterCrop: top = int(round((H - h) / 2.0)), likewise left; zero padding where the
// crop is larger than the image. floor = true: top = (H - h) // 2 (floor), as Hugging Face's image
// processors crop (the two differ when H - h is 3 mod 4).
struct CenterCrop {
  explicit CenterCrop(int size) : CenterCrop(size, size) {}
  CenterCrop(int height, int width, bool floor = false);
  void validate() const;
  int height, width;
  bool floor = false;
};

// SDXL's aspect-ratio buckets: resize keeping the aspect ratio to the smallest size that covers
// height x width (scale max(height / H, width / W), each side rounded, at least the target), then
// crop height x width from it, at a random offset (random = true: top uniform in
// [0, resized height - height], left likewise) or centred (CenterCrop's rounding).
struct CoverCrop {
  CoverCrop(int height, int width, bool random = true, bool antialias = true);
  void validate() const;
  int height, width;
  bool random;
  bool antialias;
};

// torchvision RandomHorizontalFlip: flips when a uniform draw is < p.
struct RandomHorizontalFlip {
  explicit RandomHorizontalFlip(double p = 0.5);
  void validate() const;
  double p;
};

enum class DType { kUInt8, kFloat32, kFloat16, kBFloat16 };
enum class Layout { kCHW, kHWC };

// Conversion to the output tensor: uint8 keeps 0..255; float types hold value / 255 (torchvision
// ToDtype(scale=True)), or the value itself with scale = false (ToDtype(scale=False)).
struct ToTensor {
  explicit ToTensor(DType dtype = DType::kFloat32, Layout layout = Layout::kCHW, bool scale = true)
      : dtype(dtype), layout(layout), scale(scale) {}
  void validate() const {}
  DType dtype;
  Layout layout;
  bool scale;
};

// (x - mean) / std per channel, in float32, after a float ToTensor. std must be non-zero.
struct Normalize {
  Normalize(std::array<float, 3> mean, std::array<float, 3> std);
  void validate() const;
  std::array<float, 3> mean, std;
};

using Transform =
    std::variant<RandomResizedCrop, Resize, CenterCrop, CoverCrop, RandomHorizontalFlip, ToTensor,
                 Normalize, RandomVerticalFlip, Pad, RandomCrop, ColorJitter, RandomGrayscale,
                 GaussianBlur, RandomRotation, RandomAffine, TrivialAugmentWide, RandAugment,
                 AutoAugment, RandomErasing, RandomApply>;

// Where a transform runs in ImagePipeline (pipeline.h):
// - kFused: crops, resizes and flips that compose into the one resample from the decoder's
//   pixels (as a leading run; after an image operation they run on the image in memory);
// - kImage: operations on the 8-bit image (colour, blur, warps, padding, random crops,
//   auto-augment, RandomApply, and RandomErasing before ToTensor);
// - kOutput: ToTensor and Normalize, fused into the write to the batch;
// - kTensor: RandomErasing after ToTensor, on the output tensor.
enum class Stage { kFused, kImage, kOutput, kTensor };
// The stage of `t` at its place: RandomErasing is kTensor once a ToTensor came before it.
Stage stage_of(const Transform& t, bool after_to_tensor);

// Bytes of one output element of `dtype`.
size_t element_size(DType dtype);

// What ToTensor and Normalize make of 8-bit RGB: the output dtype and layout, and per channel and
// 8-bit value the output element, so that the CPU pipeline and the GPU decoder write the same
// values by one table look-up.
struct OutputTable {
  DType dtype = DType::kUInt8;  // without ToTensor: uint8, CHW
  Layout layout = Layout::kCHW;
  std::vector<std::byte> table;  // element (c * 256 + v): element_size(dtype) bytes each
};

// The output table of a transform list, which it validates in order, each transform's own check
// first (InvalidArgument): image transforms before ToTensor and Normalize, RandomErasing anywhere;
// ToTensor at most once; Normalize at most once, after a float ToTensor; RandomApply's count
// within the list and covering image transforms only. Values: torchvision's, v / 255 (v with
// ToTensor's scale = false) then (x - mean) / std, all in float32, then converted to the dtype
// (uint8 keeps v).
OutputTable output_table(const std::vector<Transform>& transforms);

// A crop in integer pixels of the image it applies to; may extend outside it (padding).
struct CropBox {
  int top, left, height, width;
};

// torchvision RandomResizedCrop.get_params: 10 attempts, then the central fallback. Draws from
// rng in torchvision's order (scale, log-ratio, then top, left).
CropBox random_resized_crop_params(int image_height, int image_width, const RandomResizedCrop& t,
                                   SampleRng& rng);

// torchvision's output size (height, width) of Resize on an image_height x image_width image.
std::pair<int, int> resize_output_size(int image_height, int image_width, const Resize& t);

CropBox center_crop_box(int image_height, int image_width, const CenterCrop& t);

// CoverCrop's draw on an image_height x image_width image: the resized size, and the crop's
// top-left corner in the resized image (what SDXL conditions on as crop_top_left).
struct CoverBox {
  int resized_height, resized_width, top, left;
};
CoverBox cover_crop_params(int image_height, int image_width, const CoverCrop& t, SampleRng& rng);

}  // namespace stoker::image
