#include "image_stage.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>

#include "convert.h"
#include "stoker/errors.h"

namespace stoker::image::internal {
namespace {

// Python's round() and int(): half to even, and truncation toward zero.
int py_round(double v) { return static_cast<int>(std::nearbyint(v)); }

// A standard normal draw (Box-Muller; the second value is not kept, so every draw costs two
// uniforms and the stream stays a pure function of the counter).
float normal(SampleRng& rng) {
  const double u1 = 1.0 - rng.uniform();  // (0, 1]
  const double u2 = rng.uniform();
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

// --- Auto-augment (torchvision/transforms/v2/_auto_augment.py) ----------------------------

enum class AugOp {
  kIdentity,
  kShearX,
  kShearY,
  kTranslateX,
  kTranslateY,
  kRotate,
  kBrightness,
  kColor,
  kContrast,
  kSharpness,
  kPosterize,
  kSolarize,
  kAutoContrast,
  kEqualize,
  kInvert,
};

// The operations of TrivialAugmentWide's and RandAugment's spaces, in their dict order (the
// uniform draw picks an index into it).
constexpr AugOp kSpaceOps[] = {
    AugOp::kIdentity,     AugOp::kShearX,    AugOp::kShearY,     AugOp::kTranslateX,
    AugOp::kTranslateY,   AugOp::kRotate,    AugOp::kBrightness, AugOp::kColor,
    AugOp::kContrast,     AugOp::kSharpness, AugOp::kPosterize,  AugOp::kSolarize,
    AugOp::kAutoContrast, AugOp::kEqualize,
};

// The magnitude ranges of one augmentation space.
struct Space {
  double shear;      // linspace(0, shear, bins)
  double translate;  // absolute pixels, or a fraction of the side with translate_relative
  bool translate_relative;
  double rotate;         // degrees
  double enhance;        // brightness, colour, contrast, sharpness: 1 +- this
  double posterize_div;  // bits = round(8 - i / ((bins - 1) / div))
};

// TrivialAugmentWide's "wide" space; RandAugment's and AutoAugment's.
constexpr Space kWide{0.99, 32.0, false, 135.0, 0.99, 6.0};
constexpr Space kStandard{0.3, 150.0 / 331.0, true, 30.0, 0.9, 4.0};

bool is_signed(AugOp op) {
  switch (op) {
    case AugOp::kShearX:
    case AugOp::kShearY:
    case AugOp::kTranslateX:
    case AugOp::kTranslateY:
    case AugOp::kRotate:
    case AugOp::kBrightness:
    case AugOp::kColor:
    case AugOp::kContrast:
    case AugOp::kSharpness:
      return true;
    default:
      return false;
  }
}

bool has_magnitude(AugOp op) {
  return op != AugOp::kIdentity && op != AugOp::kAutoContrast && op != AugOp::kEqualize &&
         op != AugOp::kInvert;
}

// torch.linspace(start, end, steps)[i] in float32 (computed exactly, then rounded once: torch's
// own kernel may differ in the last bit, which changes no parameter but a truncated one that
// lands exactly on an integer).
double linspace(double start, double end, int steps, int i) {
  return static_cast<float>(start + (end - start) * i / (steps - 1));
}

// The magnitude of `op` at bin `bin` of `bins`, for an image height x width, before its sign.
double magnitude(AugOp op, const Space& sp, int bins, int bin, int height, int width) {
  switch (op) {
    case AugOp::kShearX:
    case AugOp::kShearY:
      return linspace(0.0, sp.shear, bins, bin);
    case AugOp::kTranslateX:
      return linspace(0.0, sp.translate_relative ? sp.translate * width : sp.translate, bins, bin);
    case AugOp::kTranslateY:
      return linspace(0.0, sp.translate_relative ? sp.translate * height : sp.translate, bins, bin);
    case AugOp::kRotate:
      return linspace(0.0, sp.rotate, bins, bin);
    case AugOp::kBrightness:
    case AugOp::kColor:
    case AugOp::kContrast:
    case AugOp::kSharpness:
      return linspace(0.0, sp.enhance, bins, bin);
    case AugOp::kPosterize: {
      // (8 - (arange(bins) / ((bins - 1) / div))).round().int(), in float32.
      const float q = static_cast<float>(bin) / static_cast<float>((bins - 1) / sp.posterize_div);
      return std::nearbyint(8.0f - q);
    }
    case AugOp::kSolarize:
      return linspace(1.0, 0.0, bins, bin);
    default:
      return 0.0;
  }
}

// _AutoAugmentBase._apply_image_or_video_transform.
void apply_aug(AugOp op, double m, Interpolation interp, const internal::Fill& fill,
               StageScratch& s) {
  RgbImage& img = s.image();
  const RgbView v = img.view();
  auto warp = [&](auto&& f) {
    s.spare().reset(img.height(), img.width());
    f(v, s.spare().view());
    s.swap();
  };
  const double deg = 180.0 / std::numbers::pi;
  switch (op) {
    case AugOp::kIdentity:
      return;
    case AugOp::kShearX:
      return warp([&](RgbView src, RgbView dst) {
        affine(src, dst, 0.0, {0, 0}, 1.0, {std::atan(m) * deg, 0.0}, interp, fill,
               std::array<double, 2>{0, 0});
      });
    case AugOp::kShearY:
      return warp([&](RgbView src, RgbView dst) {
        affine(src, dst, 0.0, {0, 0}, 1.0, {0.0, std::atan(m) * deg}, interp, fill,
               std::array<double, 2>{0, 0});
      });
    case AugOp::kTranslateX:
      return warp([&](RgbView src, RgbView dst) {
        affine(src, dst, 0.0, {std::trunc(m), 0}, 1.0, {0, 0}, interp, fill);
      });
    case AugOp::kTranslateY:
      return warp([&](RgbView src, RgbView dst) {
        affine(src, dst, 0.0, {0, std::trunc(m)}, 1.0, {0, 0}, interp, fill);
      });
    case AugOp::kRotate:
      return warp([&](RgbView src, RgbView dst) { rotate(src, dst, m, interp, fill); });
    case AugOp::kBrightness:
      return adjust_brightness(v, 1.0 + m);
    case AugOp::kColor:
      return adjust_saturation(v, 1.0 + m);
    case AugOp::kContrast:
      return adjust_contrast(v, 1.0 + m);
    case AugOp::kSharpness:
      return adjust_sharpness(v, 1.0 + m, s.ops);
    case AugOp::kPosterize:
      return posterize(v, static_cast<int>(m));
    case AugOp::kSolarize:
      return solarize(v, 255.0 * m);
    case AugOp::kAutoContrast:
      return autocontrast(v);
    case AugOp::kEqualize:
      return equalize(v);
    case AugOp::kInvert:
      return invert(v);
  }
}

// A drawn magnitude with its random sign (torchvision: negated when rand() <= 0.5).
double signed_magnitude(AugOp op, double m, SampleRng& rng) {
  if (is_signed(op) && rng.uniform() <= 0.5) return -m;
  return m;
}

void trivial_augment_wide(const TrivialAugmentWide& t, SampleRng& rng, StageScratch& s) {
  const AugOp op = kSpaceOps[rng.uniform_int(0, std::size(kSpaceOps))];
  double m = 0.0;
  if (has_magnitude(op)) {
    const int bin = static_cast<int>(rng.uniform_int(0, t.num_magnitude_bins));
    m = signed_magnitude(
        op, magnitude(op, kWide, t.num_magnitude_bins, bin, s.image().height(), s.image().width()),
        rng);
  }
  apply_aug(op, m, t.interpolation, t.fill, s);
}

void rand_augment(const RandAugment& t, SampleRng& rng, StageScratch& s) {
  for (int k = 0; k < t.num_ops; ++k) {
    const AugOp op = kSpaceOps[rng.uniform_int(0, std::size(kSpaceOps))];
    double m = 0.0;
    if (has_magnitude(op)) {
      m = signed_magnitude(op,
                           magnitude(op, kStandard, t.num_magnitude_bins, t.magnitude,
                                     s.image().height(), s.image().width()),
                           rng);
    }
    apply_aug(op, m, t.interpolation, t.fill, s);
  }
}

struct PolicyOp {
  AugOp op;
  double p;
  int bin;  // of 10 bins; -1 where the operation has no magnitude
};
using SubPolicy = std::array<PolicyOp, 2>;

constexpr AugOp kPost = AugOp::kPosterize, kRot = AugOp::kRotate, kSol = AugOp::kSolarize,
                kAC = AugOp::kAutoContrast, kEq = AugOp::kEqualize, kCol = AugOp::kColor,
                kInv = AugOp::kInvert, kCon = AugOp::kContrast, kSha = AugOp::kSharpness,
                kShX = AugOp::kShearX, kShY = AugOp::kShearY, kTX = AugOp::kTranslateX,
                kTY = AugOp::kTranslateY, kBri = AugOp::kBrightness;

// AutoAugment._get_policies, policy by policy.
constexpr SubPolicy kImageNetPolicy[] = {
    {{{kPost, 0.4, 8}, {kRot, 0.6, 9}}}, {{{kSol, 0.6, 5}, {kAC, 0.6, -1}}},
    {{{kEq, 0.8, -1}, {kEq, 0.6, -1}}},  {{{kPost, 0.6, 7}, {kPost, 0.6, 6}}},
    {{{kEq, 0.4, -1}, {kSol, 0.2, 4}}},  {{{kEq, 0.4, -1}, {kRot, 0.8, 8}}},
    {{{kSol, 0.6, 3}, {kEq, 0.6, -1}}},  {{{kPost, 0.8, 5}, {kEq, 1.0, -1}}},
    {{{kRot, 0.2, 3}, {kSol, 0.6, 8}}},  {{{kEq, 0.6, -1}, {kPost, 0.4, 6}}},
    {{{kRot, 0.8, 8}, {kCol, 0.4, 0}}},  {{{kRot, 0.4, 9}, {kEq, 0.6, -1}}},
    {{{kEq, 0.0, -1}, {kEq, 0.8, -1}}},  {{{kInv, 0.6, -1}, {kEq, 1.0, -1}}},
    {{{kCol, 0.6, 4}, {kCon, 1.0, 8}}},  {{{kRot, 0.8, 8}, {kCol, 1.0, 2}}},
    {{{kCol, 0.8, 8}, {kSol, 0.8, 7}}},  {{{kSha, 0.4, 7}, {kInv, 0.6, -1}}},
    {{{kShX, 0.6, 5}, {kEq, 1.0, -1}}},  {{{kCol, 0.4, 0}, {kEq, 0.6, -1}}},
    {{{kEq, 0.4, -1}, {kSol, 0.2, 4}}},  {{{kSol, 0.6, 5}, {kAC, 0.6, -1}}},
    {{{kInv, 0.6, -1}, {kEq, 1.0, -1}}}, {{{kCol, 0.6, 4}, {kCon, 1.0, 8}}},
    {{{kEq, 0.8, -1}, {kEq, 0.6, -1}}},
};

constexpr SubPolicy kCifar10Policy[] = {
    {{{kInv, 0.1, -1}, {kCon, 0.2, 6}}}, {{{kRot, 0.7, 2}, {kTX, 0.3, 9}}},
    {{{kSha, 0.8, 1}, {kSha, 0.9, 3}}},  {{{kShY, 0.5, 8}, {kTY, 0.7, 9}}},
    {{{kAC, 0.5, -1}, {kEq, 0.9, -1}}},  {{{kShY, 0.2, 7}, {kPost, 0.3, 7}}},
    {{{kCol, 0.4, 3}, {kBri, 0.6, 7}}},  {{{kSha, 0.3, 9}, {kBri, 0.7, 9}}},
    {{{kEq, 0.6, -1}, {kEq, 0.5, -1}}},  {{{kCon, 0.6, 7}, {kSha, 0.6, 5}}},
    {{{kCol, 0.7, 7}, {kTX, 0.5, 8}}},   {{{kEq, 0.3, -1}, {kAC, 0.4, -1}}},
    {{{kTY, 0.4, 3}, {kSha, 0.2, 6}}},   {{{kBri, 0.9, 6}, {kCol, 0.2, 8}}},
    {{{kSol, 0.5, 2}, {kInv, 0.0, -1}}}, {{{kEq, 0.2, -1}, {kAC, 0.6, -1}}},
    {{{kEq, 0.2, -1}, {kEq, 0.6, -1}}},  {{{kCol, 0.9, 9}, {kEq, 0.6, -1}}},
    {{{kAC, 0.8, -1}, {kSol, 0.2, 8}}},  {{{kBri, 0.1, 3}, {kCol, 0.7, 0}}},
    {{{kSol, 0.4, 5}, {kAC, 0.9, -1}}},  {{{kTY, 0.9, 9}, {kTY, 0.7, 9}}},
    {{{kAC, 0.9, -1}, {kSol, 0.8, 3}}},  {{{kEq, 0.8, -1}, {kInv, 0.1, -1}}},
    {{{kTY, 0.7, 9}, {kAC, 0.9, -1}}},
};

constexpr SubPolicy kSvhnPolicy[] = {
    {{{kShX, 0.9, 4}, {kInv, 0.2, -1}}}, {{{kShY, 0.9, 8}, {kInv, 0.7, -1}}},
    {{{kEq, 0.6, -1}, {kSol, 0.6, 6}}},  {{{kInv, 0.9, -1}, {kEq, 0.6, -1}}},
    {{{kEq, 0.6, -1}, {kRot, 0.9, 3}}},  {{{kShX, 0.9, 4}, {kAC, 0.8, -1}}},
    {{{kShY, 0.9, 8}, {kInv, 0.4, -1}}}, {{{kShY, 0.9, 5}, {kSol, 0.2, 6}}},
    {{{kInv, 0.9, -1}, {kAC, 0.8, -1}}}, {{{kEq, 0.6, -1}, {kRot, 0.9, 3}}},
    {{{kShX, 0.9, 4}, {kSol, 0.3, 3}}},  {{{kShY, 0.8, 8}, {kInv, 0.7, -1}}},
    {{{kEq, 0.9, -1}, {kTY, 0.6, 6}}},   {{{kInv, 0.9, -1}, {kEq, 0.6, -1}}},
    {{{kCon, 0.3, 3}, {kRot, 0.8, 4}}},  {{{kInv, 0.8, -1}, {kTY, 0.0, 2}}},
    {{{kShY, 0.7, 6}, {kSol, 0.4, 8}}},  {{{kInv, 0.6, -1}, {kRot, 0.8, 4}}},
    {{{kShY, 0.3, 7}, {kTX, 0.9, 3}}},   {{{kShX, 0.1, 6}, {kInv, 0.6, -1}}},
    {{{kSol, 0.7, 2}, {kTY, 0.6, 7}}},   {{{kShY, 0.8, 4}, {kInv, 0.8, -1}}},
    {{{kShX, 0.7, 9}, {kTY, 0.8, 3}}},   {{{kShY, 0.8, 5}, {kAC, 0.7, -1}}},
    {{{kShX, 0.7, 2}, {kInv, 0.1, -1}}},
};

std::span<const SubPolicy> policy_table(AutoAugmentPolicy p) {
  switch (p) {
    case AutoAugmentPolicy::kCifar10:
      return kCifar10Policy;
    case AutoAugmentPolicy::kSvhn:
      return kSvhnPolicy;
    default:
      return kImageNetPolicy;
  }
}

void auto_augment(const AutoAugment& t, SampleRng& rng, StageScratch& s) {
  const std::span<const SubPolicy> table = policy_table(t.policy);
  const SubPolicy& sub = table[rng.uniform_int(0, static_cast<int64_t>(table.size()))];
  for (const PolicyOp& o : sub) {
    if (!(rng.uniform() <= o.p)) continue;
    double m = 0.0;
    if (o.bin >= 0) {
      m = signed_magnitude(
          o.op, magnitude(o.op, kStandard, 10, o.bin, s.image().height(), s.image().width()), rng);
    }
    apply_aug(o.op, m, t.interpolation, t.fill, s);
  }
}

// --- The other image transforms ------------------------------------------------------------

void color_jitter(const ColorJitter& t, SampleRng& rng, StageScratch& s) {
  // torch.randperm(4), then each factor drawn (in brightness, contrast, saturation, hue order)
  // only if its range is set.
  int order[4] = {0, 1, 2, 3};
  for (int i = 3; i > 0; --i) std::swap(order[i], order[rng.uniform_int(0, i + 1)]);
  auto draw = [&](const ColorJitter::Range& r) {
    return r ? std::optional<double>(rng.uniform(r->first, r->second)) : std::nullopt;
  };
  const auto b = draw(t.brightness), c = draw(t.contrast), sa = draw(t.saturation), h = draw(t.hue);
  const RgbView v = s.image().view();
  for (int id : order) {
    if (id == 0 && b) adjust_brightness(v, *b);
    if (id == 1 && c) adjust_contrast(v, *c);
    if (id == 2 && sa) adjust_saturation(v, *sa);
    if (id == 3 && h) adjust_hue(v, *h, s.ops);
  }
}

void pad_image(const Pad& p, StageScratch& s) {
  if (p.left == 0 && p.top == 0 && p.right == 0 && p.bottom == 0) return;
  const RgbImage& img = s.image();
  if (p.mode == image::PadMode::kReflect || p.mode == image::PadMode::kSymmetric) {
    const bool reflect = p.mode == image::PadMode::kReflect;
    const auto fits = [&](int pad, int side) { return reflect ? pad < side : pad <= side; };
    if (!fits(p.left, img.width()) || !fits(p.right, img.width()) || !fits(p.top, img.height()) ||
        !fits(p.bottom, img.height())) {
      throw InvalidArgument(std::string(reflect ? "reflect" : "symmetric") + " padding (" +
                            std::to_string(p.left) + ", " + std::to_string(p.top) + ", " +
                            std::to_string(p.right) + ", " + std::to_string(p.bottom) +
                            ") must be " + (reflect ? "smaller than" : "at most") +
                            " the side it mirrors of the " + std::to_string(img.height()) + "x" +
                            std::to_string(img.width()) + " image");
    }
  }
  s.spare().reset(img.height() + p.top + p.bottom, img.width() + p.left + p.right);
  pad(s.image().view(), s.spare().view(), p.left, p.top, p.right, p.bottom, p.mode, p.fill);
  s.swap();
}

void crop_image(int top, int left, int height, int width, StageScratch& s) {
  const RgbView src = s.image().view();
  if (top == 0 && left == 0 && height == src.height && width == src.width) return;
  s.spare().reset(height, width);
  const RgbView dst = s.spare().view();
  for (int y = 0; y < height; ++y)
    std::memcpy(dst.row(y), src.row(top + y) + 3 * left, static_cast<size_t>(width) * 3);
  s.swap();
}

void random_crop(const RandomCrop& t, SampleRng& rng, StageScratch& s) {
  Pad pad = t.padding;
  int height = s.image().height() + pad.top + pad.bottom;
  int width = s.image().width() + pad.left + pad.right;
  if (t.pad_if_needed) {
    if (height < t.height) {
      const int diff = t.height - height;
      pad.top += diff;
      pad.bottom += diff;
      height += 2 * diff;
    }
    if (width < t.width) {
      const int diff = t.width - width;
      pad.left += diff;
      pad.right += diff;
      width += 2 * diff;
    }
  }
  if (height < t.height || width < t.width) {
    throw InvalidArgument(
        "RandomCrop: the crop " + std::to_string(t.height) + "x" + std::to_string(t.width) +
        " is larger than the " +
        (t.padding.left + t.padding.top + t.padding.right + t.padding.bottom ? "padded " : "") +
        "image " + std::to_string(height) + "x" + std::to_string(width) +
        " (pad_if_needed pads it)");
  }
  const int top =
      height > t.height ? static_cast<int>(rng.uniform_int(0, height - t.height + 1)) : 0;
  const int left = width > t.width ? static_cast<int>(rng.uniform_int(0, width - t.width + 1)) : 0;
  pad_image(pad, s);
  crop_image(top, left, t.height, t.width, s);
}

void random_rotation(const RandomRotation& t, SampleRng& rng, StageScratch& s) {
  const double angle = rng.uniform(t.degrees.first, t.degrees.second);
  s.spare().reset(s.image().height(), s.image().width());
  rotate(s.image().view(), s.spare().view(), angle, t.interpolation, t.fill, t.center);
  s.swap();
}

void random_affine(const RandomAffine& t, SampleRng& rng, StageScratch& s) {
  const int height = s.image().height(), width = s.image().width();
  const double angle = rng.uniform(t.degrees.first, t.degrees.second);
  std::array<double, 2> translate{0, 0};
  if (t.translate) {
    const double max_dx = t.translate->first * width, max_dy = t.translate->second * height;
    translate[0] = py_round(rng.uniform(-max_dx, max_dx));
    translate[1] = py_round(rng.uniform(-max_dy, max_dy));
  }
  const double scale = t.scale ? rng.uniform(t.scale->first, t.scale->second) : 1.0;
  std::array<double, 2> shear{0, 0};
  if (t.shear_x) shear[0] = rng.uniform(t.shear_x->first, t.shear_x->second);
  if (t.shear_y) shear[1] = rng.uniform(t.shear_y->first, t.shear_y->second);
  s.spare().reset(height, width);
  affine(s.image().view(), s.spare().view(), angle, translate, scale, shear, t.interpolation,
         t.fill, t.center);
  s.swap();
}

// RandomErasing's parameters (torchvision's make_params): the box, or nothing after 10 misses.
struct EraseBox {
  int top, left, height, width;
};
std::optional<EraseBox> erase_box(const RandomErasing& t, int img_h, int img_w, SampleRng& rng) {
  const double area = static_cast<double>(img_h) * img_w;
  const double log_lo = std::log(t.ratio.first), log_hi = std::log(t.ratio.second);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double erase_area = area * rng.uniform(t.scale.first, t.scale.second);
    const double aspect = std::exp(rng.uniform(log_lo, log_hi));
    const int h = py_round(std::sqrt(erase_area * aspect));
    const int w = py_round(std::sqrt(erase_area / aspect));
    if (!(h < img_h && w < img_w)) continue;
    const int top = static_cast<int>(rng.uniform_int(0, img_h - h + 1));
    const int left = static_cast<int>(rng.uniform_int(0, img_w - w + 1));
    return EraseBox{top, left, h, w};
  }
  return std::nullopt;
}

uint8_t to_u8(float v) {  // a float assigned into a uint8 tensor (truncated), kept in range
  return static_cast<uint8_t>(std::clamp(v, 0.0f, 255.0f));
}

void erase_image(const RandomErasing& t, SampleRng& rng, StageScratch& s) {
  if (!(rng.uniform() < t.p)) return;
  const RgbView v = s.image().view();
  const auto box = erase_box(t, v.height, v.width, rng);
  if (!box) return;
  for (int y = box->top; y < box->top + box->height; ++y) {
    uint8_t* p = v.row(y) + 3 * box->left;
    for (int x = 0; x < box->width; ++x, p += 3)
      for (int c = 0; c < 3; ++c) p[c] = to_u8(t.random_value ? normal(rng) : t.value[c]);
  }
}

// Runs one image transform; returns how many transforms it covered (RandomApply: its own and
// the ones it guards).
size_t run_one(std::span<const Transform> ts, size_t i, SampleRng& rng, StageScratch& s) {
  const Transform& t = ts[i];
  if (stage_of(t, false) == Stage::kFused) {
    // A run of crops, resizes and flips: one resample from memory.
    size_t end = i;
    while (end < ts.size() && stage_of(ts[end], false) == Stage::kFused) ++end;
    const RgbView src = s.image().view();
    const GeometryPlan plan = plan_geometry(ts.subspan(i, end - i), src.width, src.height, rng);
    resample_into(plan, src, s.spare(), s);
    s.swap();
    return end - i;
  }
  if (const auto* ra = std::get_if<RandomApply>(&t)) {
    // torchvision: `if self.p < torch.rand(1): return inputs`.
    const size_t covered = 1 + static_cast<size_t>(ra->count);
    if (ra->p < rng.uniform()) return covered;
    run_image_stage(ts.subspan(i + 1, ra->count), rng, s);
    return covered;
  }
  const RgbView v = s.image().view();
  if (const auto* cj = std::get_if<ColorJitter>(&t)) {
    color_jitter(*cj, rng, s);
  } else if (const auto* g = std::get_if<RandomGrayscale>(&t)) {
    if (rng.uniform() < g->p) rgb_to_grayscale(v);
  } else if (const auto* b = std::get_if<GaussianBlur>(&t)) {
    const double sigma = rng.uniform(b->sigma.first, b->sigma.second);
    gaussian_blur(v, b->kernel_width, b->kernel_height, sigma, sigma, s.ops);
  } else if (const auto* p = std::get_if<Pad>(&t)) {
    pad_image(*p, s);
  } else if (const auto* rc = std::get_if<RandomCrop>(&t)) {
    random_crop(*rc, rng, s);
  } else if (const auto* rr = std::get_if<RandomRotation>(&t)) {
    random_rotation(*rr, rng, s);
  } else if (const auto* af = std::get_if<RandomAffine>(&t)) {
    random_affine(*af, rng, s);
  } else if (const auto* ta = std::get_if<TrivialAugmentWide>(&t)) {
    trivial_augment_wide(*ta, rng, s);
  } else if (const auto* ra2 = std::get_if<RandAugment>(&t)) {
    rand_augment(*ra2, rng, s);
  } else if (const auto* aa = std::get_if<AutoAugment>(&t)) {
    auto_augment(*aa, rng, s);
  } else if (const auto* re = std::get_if<RandomErasing>(&t)) {
    erase_image(*re, rng, s);
  } else {
    throw InvalidArgument(
        "ImagePipeline: a transform of the output (ToTensor, Normalize) in "
        "the image stage");
  }
  return 1;
}

}  // namespace

void image_sink(void* c, int y, const uint8_t* rgb) {
  const auto* s = static_cast<const ImageSink*>(c);
  uint8_t* out = s->dst.row(s->vflip ? s->dst.height - 1 - y : y);
  const int w = s->dst.width;
  if (!s->flip) {
    std::memcpy(out, rgb, static_cast<size_t>(w) * 3);
    return;
  }
  for (int x = 0; x < w; ++x) std::memcpy(out + 3 * (w - 1 - x), rgb + 3 * x, 3);
}

void run_image_stage(std::span<const Transform> transforms, SampleRng& rng, StageScratch& s) {
  for (size_t i = 0; i < transforms.size();) i += run_one(transforms, i, rng, s);
}

std::optional<std::pair<int, int>> size_after(std::span<const Transform> transforms,
                                              std::optional<std::pair<int, int>> size) {
  for (size_t i = 0; i < transforms.size(); ++i) {
    const Transform& t = transforms[i];
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
    } else if (const auto* cv = std::get_if<CoverCrop>(&t)) {
      size = {cv->height, cv->width};
    } else if (const auto* rc = std::get_if<RandomCrop>(&t)) {
      size = {rc->height, rc->width};
    } else if (const auto* p = std::get_if<Pad>(&t)) {
      if (size) size = {size->first + p->top + p->bottom, size->second + p->left + p->right};
    } else if (const auto* ra = std::get_if<RandomApply>(&t)) {
      const auto covered = transforms.subspan(i + 1, ra->count);
      if (size_after(covered, size) != size) size.reset();  // depends on the draw
      i += ra->count;
    }
  }
  return size;
}

void resample_into(const GeometryPlan& plan, RgbView src, RgbImage& dst, StageScratch& s) {
  s.h.prepare(plan.x.spec());
  s.v.prepare(plan.y.spec());
  s.h.move(plan.x.lo);
  s.v.move(plan.y.lo);
  dst.reset(plan.y.size, plan.x.size);
  ImageSink ctx{dst.view(), plan.flip, plan.vflip};
  resample_rgb8(src.data, src.stride, s.h.coeffs(), s.v.coeffs(), s.tmp, s.row, image_sink, &ctx,
                pil_vertical_first(plan.x.spec(), plan.y.spec()));
}

void erase_output(
    const RandomErasing& t, OutputView out, SampleRng& rng,
    const std::optional<std::pair<std::array<float, 3>, std::array<float, 3>>>& normalize_after) {
  if (!(rng.uniform() < t.p)) return;
  const auto box = erase_box(t, out.height, out.width, rng);
  if (!box) return;
  const size_t es = element_size(out.dtype);
  for (int c = 0; c < 3; ++c) {
    for (int y = box->top; y < box->top + box->height; ++y) {
      for (int x = box->left; x < box->left + box->width; ++x) {
        float v = t.random_value ? normal(rng) : t.value[c];
        if (normalize_after) v = (v - normalize_after->first[c]) / normalize_after->second[c];
        const size_t at = out.layout == Layout::kCHW
                              ? (static_cast<size_t>(c) * out.height + y) * out.width + x
                              : (static_cast<size_t>(y) * out.width + x) * 3 + c;
        std::byte* p = out.data + at * es;
        switch (out.dtype) {
          case DType::kUInt8: {
            const uint8_t u = to_u8(v);
            std::memcpy(p, &u, 1);
            break;
          }
          case DType::kFloat32:
            std::memcpy(p, &v, 4);
            break;
          case DType::kFloat16: {
            const uint16_t h = float_to_half(v);
            std::memcpy(p, &h, 2);
            break;
          }
          case DType::kBFloat16: {
            const uint16_t h = float_to_bf16(v);
            std::memcpy(p, &h, 2);
            break;
          }
        }
      }
    }
  }
}

}  // namespace stoker::image::internal
