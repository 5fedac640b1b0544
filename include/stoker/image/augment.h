// Augmentation transforms beyond crop and resize, as values for ImagePipeline (the list type,
// Transform, is in transforms.h): torchvision.transforms.v2's flips, padding, random crops,
// colour jitter, grayscale, blur, affine warps, the auto-augment family and random erasing.
//
// Semantics are torchvision v2's on uint8 images: each transform draws its random parameters
// with torchvision's rules (ranges, probabilities, the order of the draws within the transform)
// from the sample's SampleRng, and its pixels are those of v2's kernel for a uint8 tensor
// (stoker/image/ops.h says how closely). Transforms validate their arguments on construction and
// throw InvalidArgument saying what is allowed (validate() repeats the check).
//
// Thread safety: plain values.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <utility>

namespace stoker::image {

enum class Interpolation { kNearest, kBilinear };
enum class PadMode { kConstant, kEdge, kReflect, kSymmetric };

// The value warps write where the source lies outside the image: none (zero, as grid_sample pads;
// with bilinear sampling the border pixels blend towards it), or one value per channel (with
// bilinear sampling, torchvision's mask blend: border pixels move towards the fill). A fill of
// zeros is therefore not the same as no fill.
using Fill = std::optional<std::array<float, 3>>;

// torchvision RandomVerticalFlip: flips top-bottom when a uniform draw is < p.
struct RandomVerticalFlip {
  explicit RandomVerticalFlip(double p = 0.5);
  void validate() const;
  double p;
};

// torchvision Pad(padding=[left, top, right, bottom], fill, padding_mode). Reflect needs each
// padding smaller than the side it mirrors, symmetric no larger (checked per image: DecodeError
// otherwise, as torch raises).
struct Pad {
  Pad(int left, int top, int right, int bottom, std::array<uint8_t, 3> fill = {},
      PadMode mode = PadMode::kConstant);
  void validate() const;
  int left, top, right, bottom;
  std::array<uint8_t, 3> fill;
  PadMode mode;
};

// torchvision RandomCrop(size=(height, width), padding, pad_if_needed, fill, padding_mode): pads
// by `padding` (all zero: none), then, with pad_if_needed, pads a side shorter than the crop by
// the difference on both sides; then crops at a uniformly drawn offset. An image still smaller
// than the crop fails (InvalidArgument, as torchvision raises).
struct RandomCrop {
  RandomCrop(int height, int width, Pad padding = Pad(0, 0, 0, 0), bool pad_if_needed = false);
  void validate() const;
  int height, width;
  Pad padding;  // also gives pad_if_needed's fill and mode
  bool pad_if_needed;
};

// torchvision ColorJitter with its ranges after torchvision's parsing (brightness=b gives
// [max(0, 1 - b), 1 + b], hue=h gives [-h, h]); an absent range is not applied. The four
// adjustments run in a random order, each with a factor drawn uniformly from its range.
struct ColorJitter {
  using Range = std::optional<std::pair<double, double>>;
  ColorJitter(Range brightness, Range contrast, Range saturation, Range hue);
  void validate() const;
  Range brightness, contrast, saturation, hue;
};

// torchvision RandomGrayscale: with probability p every channel becomes the luma.
struct RandomGrayscale {
  explicit RandomGrayscale(double p = 0.1);
  void validate() const;
  double p;
};

// torchvision GaussianBlur(kernel_size=(width, height), sigma=(min, max)): sigma drawn uniformly,
// the same on both axes. Kernel sizes odd and positive; 0 < sigma.min <= sigma.max.
struct GaussianBlur {
  GaussianBlur(int kernel_width, int kernel_height, std::pair<double, double> sigma);
  void validate() const;
  int kernel_width, kernel_height;
  std::pair<double, double> sigma;
};

// torchvision RandomRotation(degrees=(min, max), interpolation, expand=False, center, fill).
struct RandomRotation {
  RandomRotation(std::pair<double, double> degrees, Interpolation interpolation,
                 Fill fill = std::nullopt,
                 std::optional<std::array<double, 2>> center = std::nullopt);
  void validate() const;
  std::pair<double, double> degrees;
  Interpolation interpolation;
  Fill fill;
  std::optional<std::array<double, 2>> center;
};

// torchvision RandomAffine(degrees, translate, scale, shear, interpolation, fill, center), its
// ranges after parsing: translate fractions of the width and height (absent: none), scale range
// (absent: 1), shear x and y ranges in degrees (absent: none).
struct RandomAffine {
  using Range = std::optional<std::pair<double, double>>;
  RandomAffine(std::pair<double, double> degrees, Range translate, Range scale, Range shear_x,
               Range shear_y, Interpolation interpolation, Fill fill = std::nullopt,
               std::optional<std::array<double, 2>> center = std::nullopt);
  void validate() const;
  std::pair<double, double> degrees;
  Range translate, scale, shear_x, shear_y;
  Interpolation interpolation;
  Fill fill;
  std::optional<std::array<double, 2>> center;
};

// torchvision TrivialAugmentWide(num_magnitude_bins, interpolation, fill): one operation of its
// wide augmentation space, uniformly, at a uniformly drawn magnitude bin.
struct TrivialAugmentWide {
  explicit TrivialAugmentWide(int num_magnitude_bins = 31,
                              Interpolation interpolation = Interpolation::kNearest,
                              Fill fill = std::nullopt);
  void validate() const;
  int num_magnitude_bins;
  Interpolation interpolation;
  Fill fill;
};

// torchvision RandAugment(num_ops, magnitude, num_magnitude_bins, interpolation, fill).
// REQUIRES: num_ops >= 0, num_magnitude_bins >= 2, 0 <= magnitude < num_magnitude_bins.
struct RandAugment {
  RandAugment(int num_ops = 2, int magnitude = 9, int num_magnitude_bins = 31,
              Interpolation interpolation = Interpolation::kNearest, Fill fill = std::nullopt);
  void validate() const;
  int num_ops, magnitude, num_magnitude_bins;
  Interpolation interpolation;
  Fill fill;
};

enum class AutoAugmentPolicy { kImageNet, kCifar10, kSvhn };

// torchvision AutoAugment(policy, interpolation, fill): one of the policy's 25 sub-policies,
// uniformly; each of its two operations applied with its probability.
struct AutoAugment {
  explicit AutoAugment(AutoAugmentPolicy policy = AutoAugmentPolicy::kImageNet,
                       Interpolation interpolation = Interpolation::kNearest,
                       Fill fill = std::nullopt);
  void validate() const;
  AutoAugmentPolicy policy;
  Interpolation interpolation;
  Fill fill;
};

// torchvision RandomErasing(p, scale, ratio, value): with probability p, a rectangle of area
// fraction in `scale` and aspect ratio in `ratio` (10 attempts, else nothing) is set to `value`
// per channel, or with random_value to standard normal noise (value="random"). Values are in the
// units of the image where it stands: 0..255 before ToTensor; after a float ToTensor, [0, 1]
// (before Normalize) or normalized units (after it).
struct RandomErasing {
  RandomErasing(double p = 0.5, std::pair<double, double> scale = {0.02, 0.33},
                std::pair<double, double> ratio = {0.3, 3.3},
                std::array<float, 3> value = {0, 0, 0}, bool random_value = false);
  void validate() const;
  double p;
  std::pair<double, double> scale, ratio;
  std::array<float, 3> value;
  bool random_value;
};

// torchvision RandomApply(transforms, p): the next `count` transforms of the list run together
// with probability p, or none of them (they then draw no random numbers). They must be
// transforms of the image (not ToTensor or Normalize).
struct RandomApply {
  RandomApply(double p, int count);
  void validate() const;
  double p;
  int count;
};

}  // namespace stoker::image
