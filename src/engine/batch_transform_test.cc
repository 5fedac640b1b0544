#include "stoker/batch_transform.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "engine/batch_mix_kernels.h"
#include "image/convert.h"
#include "stoker/errors.h"
#include "stoker/engine.h"
#include "stoker/random.h"

namespace stoker {
namespace {

constexpr DType kFloat16{DType::kFloat, 16};
constexpr DType kBFloat16{DType::kBFloat, 16};

BatchMix mixup(double alpha = 1.0, double weight = 1.0) {
  return {BatchMix::Kind::kMixUp, alpha, weight};
}
BatchMix cutmix(double alpha = 1.0, double weight = 1.0) {
  return {BatchMix::Kind::kCutMix, alpha, weight};
}

std::vector<FieldSpec> image_fields(DType dtype, ImageLayout layout, int64_t h, int64_t w) {
  const std::vector<int64_t> shape =
      layout == ImageLayout::kCHW ? std::vector<int64_t>{3, h, w} : std::vector<int64_t>{h, w, 3};
  return {{"image", dtype, shape}, {"label", kInt64, {}}};
}

// A batch of `length` images (element e of image i holds a value from (i, e)) with labels.
struct TestBatch {
  std::vector<std::byte> images, soft;
  std::vector<int64_t> labels;
  BatchField image, label, soft_label;

  TestBatch(DType dtype, ImageLayout layout, int64_t h, int64_t w, std::vector<int64_t> ls,
            int64_t classes)
      : labels(std::move(ls)) {
    const auto n = static_cast<int64_t>(labels.size());
    const size_t elements = static_cast<size_t>(n * 3 * h * w);
    images.resize(elements * dtype.bytes());
    soft.resize(static_cast<size_t>(n * classes) * 4, std::byte{0x7f});
    SampleRng rng(1, 2, 3);
    for (size_t e = 0; e < elements; ++e) {
      const float v = static_cast<float>(rng.uniform(-2, 2));
      if (dtype == kFloat32) {
        std::memcpy(images.data() + 4 * e, &v, 4);
      } else if (dtype == kFloat16) {
        const uint16_t x = image::internal::float_to_half(v);
        std::memcpy(images.data() + 2 * e, &x, 2);
      } else if (dtype == kBFloat16) {
        const uint16_t x = image::internal::float_to_bf16(v);
        std::memcpy(images.data() + 2 * e, &x, 2);
      } else {
        images[e] = static_cast<std::byte>(rng.uniform_int(0, 256));
      }
    }
    const std::vector<int64_t> sample =
        layout == ImageLayout::kCHW ? std::vector<int64_t>{3, h, w} : std::vector<int64_t>{h, w, 3};
    image = {images.data(), dtype, {n, sample[0], sample[1], sample[2]}, "image"};
    label = {reinterpret_cast<std::byte*>(labels.data()), kInt64, {n}, "label"};
    soft_label = {soft.data(), kFloat32, {n, classes}, "soft_label"};
  }

  float soft_at(int64_t i, int64_t c, int64_t classes) const {
    float v;
    std::memcpy(&v, soft.data() + 4 * static_cast<size_t>(i * classes + c), 4);
    return v;
  }
};

float to_float(const std::byte* p, DType dtype) {
  if (dtype == kFloat32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  uint16_t x;
  std::memcpy(&x, p, 2);
  if (dtype == kBFloat16) return std::bit_cast<float>(uint32_t{x} << 16);
  // float16: normal and subnormal values only (the tests' values are in [-2, 2]).
  const uint32_t exponent = (x >> 10) & 0x1f, mantissa = x & 0x3ff;
  const float v = exponent == 0 ? mantissa * 0x1.0p-24f
                                : std::ldexp(1.0f + mantissa / 1024.0f, int(exponent) - 15);
  return (x & 0x8000) ? -v : v;
}

TEST(BatchTransform, RejectsBadSettingsNamingThem) {
  const auto throws = [](std::vector<BatchMix> c, int64_t classes, const std::string& what) {
    try {
      BatchTransform(std::move(c), classes, ImageLayout::kCHW);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  throws({mixup(0)}, 10, "MixUp alpha must be a positive finite number");
  throws({cutmix(-1)}, 10, "CutMix alpha must be a positive finite number");
  throws({mixup(NAN)}, 10, "alpha must be a positive finite number");
  throws({mixup(INFINITY)}, 10, "alpha must be a positive finite number");
  throws({mixup(1, -1), cutmix()}, 10, "p must be non-negative");
  throws({mixup(1, 0), cutmix(1, 0)}, 10, "must not sum to 0");
  throws({mixup()}, 0, "num_classes must be a positive integer, got 0");
  throws({}, 10, "needs MixUp or CutMix");
}

TEST(BatchTransform, ChecksTheSourceFields) {
  const BatchTransform mix({mixup()}, 10, ImageLayout::kCHW);
  const BatchTransform cut({cutmix()}, 10, ImageLayout::kCHW);
  const BatchTransform both({mixup(), cutmix()}, 10, ImageLayout::kCHW);
  const BatchTransform::Fields f = mix.check(image_fields(kFloat32, ImageLayout::kCHW, 4, 5));
  EXPECT_EQ(f.image, 0u);
  EXPECT_EQ(f.label, 1u);
  // Fields found by name, in any order.
  std::vector<FieldSpec> swapped = image_fields(kFloat16, ImageLayout::kCHW, 4, 5);
  std::swap(swapped[0], swapped[1]);
  EXPECT_EQ(mix.check(swapped).image, 1u);
  EXPECT_NO_THROW(mix.check(image_fields(kBFloat16, ImageLayout::kCHW, 4, 5)));
  // uint8: CutMix copies, MixUp cannot blend (alone or as a choice).
  EXPECT_NO_THROW(cut.check(image_fields(kUInt8, ImageLayout::kCHW, 4, 5)));
  for (const BatchTransform* t : {&mix, &both}) {
    try {
      t->check(image_fields(kUInt8, ImageLayout::kCHW, 4, 5));
      ADD_FAILURE() << "MixUp accepted uint8 images";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("MixUp blends images, which uint8 cannot hold"),
                std::string::npos)
          << e.what();
    }
  }
  // No labels; labels that are not class indices; HWC images given as CHW; a clashing field.
  std::vector<FieldSpec> no_label = image_fields(kFloat32, ImageLayout::kCHW, 4, 5);
  no_label.pop_back();
  EXPECT_THROW(mix.check(no_label), InvalidArgument);
  std::vector<FieldSpec> float_label = image_fields(kFloat32, ImageLayout::kCHW, 4, 5);
  float_label[1].dtype = kFloat32;
  EXPECT_THROW(mix.check(float_label), InvalidArgument);
  EXPECT_THROW(mix.check(image_fields(kFloat32, ImageLayout::kHWC, 4, 5)), InvalidArgument);
  EXPECT_NO_THROW(BatchTransform({mixup()}, 10, ImageLayout::kHWC)
                      .check(image_fields(kFloat32, ImageLayout::kHWC, 4, 5)));
  std::vector<FieldSpec> clash = image_fields(kFloat32, ImageLayout::kCHW, 4, 5);
  clash.push_back({"soft_label", kFloat32, {10}});
  EXPECT_THROW(mix.check(clash), InvalidArgument);
  const FieldSpec soft = mix.soft_label_field();
  EXPECT_EQ(soft.name, "soft_label");
  EXPECT_EQ(soft.dtype, kFloat32);
  EXPECT_EQ(soft.shape, std::vector<int64_t>{10});
}

TEST(BatchTransform, DrawsDependOnlyOnTheKey) {
  const BatchTransform t({mixup(), cutmix()}, 10, ImageLayout::kCHW);
  std::set<double> lambdas;
  for (uint64_t key = 0; key < 200; ++key) {
    const BatchMixParams a = t.draw(7, 3, key, 224, 160), b = t.draw(7, 3, key, 224, 160);
    EXPECT_EQ(a.choice, b.choice);
    EXPECT_EQ(a.lambda, b.lambda);
    EXPECT_EQ(std::tie(a.x1, a.y1, a.x2, a.y2), std::tie(b.x1, b.y1, b.x2, b.y2));
    lambdas.insert(a.lambda);
  }
  EXPECT_EQ(lambdas.size(), 200u);
  EXPECT_NE(t.draw(7, 3, 5, 224, 160).lambda, t.draw(8, 3, 5, 224, 160).lambda);  // seed
  EXPECT_NE(t.draw(7, 3, 5, 224, 160).lambda, t.draw(7, 4, 5, 224, 160).lambda);  // epoch
}

TEST(BatchTransform, LambdaFollowsBetaAlphaAlpha) {
  for (double alpha : {0.2, 0.8, 1.0, 3.0}) {
    const BatchTransform t({mixup(alpha)}, 10, ImageLayout::kCHW);
    const int n = 40000;
    double sum = 0, sum2 = 0;
    int below_tenth = 0;
    for (int key = 0; key < n; ++key) {
      const double l = t.draw(1, 0, key, 8, 8).lambda;
      ASSERT_GE(l, 0.0);
      ASSERT_LE(l, 1.0);
      sum += l;
      sum2 += l * l;
      below_tenth += l < 0.1;
    }
    const double mean = sum / n, var = sum2 / n - mean * mean;
    // Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)).
    EXPECT_NEAR(mean, 0.5, 0.01) << alpha;
    EXPECT_NEAR(var, 1.0 / (4 * (2 * alpha + 1)), 0.006) << alpha;
    if (alpha == 1.0) {
      EXPECT_NEAR(below_tenth / double(n), 0.1, 0.006);  // uniform
    }
  }
}

TEST(BatchTransform, RandomChoicePicksByWeight) {
  const BatchTransform t({mixup(1, 1), cutmix(1, 3), mixup(0.5, 0)}, 10, ImageLayout::kCHW);
  std::map<size_t, int> picked;
  const int n = 20000;
  for (int key = 0; key < n; ++key) {
    const BatchMixParams p = t.draw(11, 2, key, 32, 32);
    ++picked[p.choice];
    EXPECT_EQ(p.kind, p.choice == 1 ? BatchMix::Kind::kCutMix : BatchMix::Kind::kMixUp);
  }
  EXPECT_NEAR(picked[0] / double(n), 0.25, 0.012);
  EXPECT_NEAR(picked[1] / double(n), 0.75, 0.012);
  EXPECT_EQ(picked.count(2), 0u);  // weight 0: never
}

TEST(BatchTransform, CutMixBoxFollowsTorchvisionsRule) {
  const BatchTransform t({cutmix(0.7)}, 10, ImageLayout::kCHW);
  const int64_t h = 37, w = 53;
  for (uint64_t key = 0; key < 2000; ++key) {
    const BatchMixParams p = t.draw(3, 1, key, h, w);
    // The centre is not returned: the box's clamped sides must be those of some centre.
    const double r = 0.5 * std::sqrt(1 - p.lambda);
    const auto hw = static_cast<int64_t>(r * w), hh = static_cast<int64_t>(r * h);
    bool some_centre = false;
    for (int64_t rx = 0; rx < w && !some_centre; ++rx)
      for (int64_t ry = 0; ry < h && !some_centre; ++ry)
        some_centre =
            p.x1 == std::max<int64_t>(rx - hw, 0) && p.x2 == std::min<int64_t>(rx + hw, w) &&
            p.y1 == std::max<int64_t>(ry - hh, 0) && p.y2 == std::min<int64_t>(ry + hh, h);
    ASSERT_TRUE(some_centre) << key;
    EXPECT_DOUBLE_EQ(p.label_lambda, 1.0 - double((p.x2 - p.x1) * (p.y2 - p.y1)) / double(h * w));
  }
}

// torchvision's MixUp on a copy: out[i] = f(previous * (1 - lambda)) + f(own * lambda).
TEST(BatchTransform, MixUpIsTorchvisionsFormulaInPlace) {
  for (DType dtype : {kFloat32, kFloat16, kBFloat16})
    for (uint64_t length : {1, 2, 5}) {
      TestBatch batch(dtype, ImageLayout::kCHW, 3, 4, std::vector<int64_t>(length, 2), 4);
      const std::vector<std::byte> before = batch.images;
      const BatchTransform t({mixup()}, 4, ImageLayout::kCHW);
      BatchMixParams p = t.draw(5, 0, length, 3, 4);
      t.apply(p, batch.image, batch.label, batch.soft_label);
      const size_t per = 36 * dtype.bytes();
      const float a = float(1 - p.lambda), b = float(p.lambda);
      // float16 and bfloat16: each product and the sum are rounded to the dtype; a bound of
      // three roundings of values below 2 in magnitude.
      const double tolerance = dtype == kFloat32   ? 0
                               : dtype == kFloat16 ? 3 * 0x1.0p-10
                                                   : 3 * 0x1.0p-7;
      for (uint64_t i = 0; i < length; ++i)
        for (size_t e = 0; e < 36; ++e) {
          const std::byte* own = before.data() + i * per + e * dtype.bytes();
          const std::byte* prev =
              before.data() + ((i + length - 1) % length) * per + e * dtype.bytes();
          const float got = to_float(batch.images.data() + i * per + e * dtype.bytes(), dtype);
          if (dtype == kFloat32) {
            const float pa = to_float(prev, dtype) * a;
            const float ob = to_float(own, dtype) * b;
            ASSERT_EQ(got, pa + ob) << i << " " << e;
          } else {
            const double want = double(to_float(prev, dtype)) * (1 - p.lambda) +
                                double(to_float(own, dtype)) * p.lambda;
            ASSERT_NEAR(got, want, tolerance) << dtype.name() << " " << i << " " << e;
          }
        }
    }
}

// The float16 and bfloat16 arithmetic on every non-NaN value of the type, against the image
// wing's rounding (src/image/convert.h: torch's round-to-nearest-even) and a plain decode: each
// product rounded to the dtype, then the sum. float16 both ways: portable and F16C.
TEST(BatchTransform, HalfPrecisionBlendsRoundAsTorchOnEveryValue) {
  const auto decode = [](uint16_t x, DType dtype) -> float {
    if (dtype == kBFloat16) return std::bit_cast<float>(uint32_t{x} << 16);
    const uint32_t exponent = (x >> 10) & 0x1f, mantissa = x & 0x3ff;
    const float v = exponent == 0x1f ? (mantissa ? NAN : INFINITY)
                    : exponent == 0  ? mantissa * 0x1.0p-24f
                                     : std::ldexp(1.0f + mantissa / 1024.0f, int(exponent) - 15);
    return (x & 0x8000) ? -v : v;
  };
  const auto encode = [](float f, DType dtype) {
    return dtype == kBFloat16 ? image::internal::float_to_bf16(f)
                              : image::internal::float_to_half(f);
  };
  const auto is_nan = [](uint16_t x, DType dtype) {
    return dtype == kBFloat16 ? (x & 0x7fff) > 0x7f80 : (x & 0x7fff) > 0x7c00;
  };
  struct Kernel {
    DType dtype;
    bool hardware;
  };
  std::vector<Kernel> kernels{{kFloat16, false}, {kBFloat16, false}};
  if (internal::float16_hardware()) kernels.push_back({kFloat16, true});
  for (const Kernel& k : kernels) {
    // Every bit pattern as `own`, the patterns reversed as `previous`; NaNs become 1. An odd
    // length, so the F16C loop's scalar tail runs too.
    const size_t n = 65537;
    std::vector<uint16_t> own(n), previous(n);
    for (size_t e = 0; e < n; ++e) {
      const auto x = static_cast<uint16_t>(e), y = static_cast<uint16_t>(~e);
      own[e] = is_nan(x, k.dtype) ? encode(1.0f, k.dtype) : x;
      previous[e] = is_nan(y, k.dtype) ? encode(1.0f, k.dtype) : y;
    }
    for (double lambda : {0.0, 0.3183098861837907, 0.5, 0.9999}) {
      const float a = float(1 - lambda), b = float(lambda);
      std::vector<uint16_t> got = own;
      if (k.dtype == kBFloat16) {
        internal::blend_bfloat16(got.data(), previous.data(), n, a, b);
      } else {
        internal::blend_float16(got.data(), previous.data(), n, a, b, k.hardware);
      }
      for (size_t e = 0; e < n; ++e) {
        const uint16_t pa = encode(decode(previous[e], k.dtype) * a, k.dtype);
        const uint16_t ob = encode(decode(own[e], k.dtype) * b, k.dtype);
        const uint16_t want = encode(decode(pa, k.dtype) + decode(ob, k.dtype), k.dtype);
        if (is_nan(want, k.dtype)) {  // inf - inf: any NaN
          ASSERT_TRUE(is_nan(got[e], k.dtype)) << k.dtype.name() << " " << k.hardware;
        } else {
          ASSERT_EQ(got[e], want) << k.dtype.name() << (k.hardware ? " F16C" : "") << " own "
                                  << own[e] << " previous " << previous[e] << " lambda " << lambda;
        }
      }
    }
  }
}

TEST(BatchTransform, CutMixPastesThePreviousImagesBox) {
  for (ImageLayout layout : {ImageLayout::kCHW, ImageLayout::kHWC})
    for (DType dtype : {kUInt8, kFloat32}) {
      const int64_t h = 9, w = 11;
      TestBatch batch(dtype, layout, h, w, {0, 1, 2, 3}, 4);
      const std::vector<std::byte> before = batch.images;
      const BatchTransform t({cutmix()}, 4, layout);
      // A key whose box is neither empty nor the whole image.
      BatchMixParams p;
      for (uint64_t key = 0;; ++key) {
        p = t.draw(1, 0, key, h, w);
        if (p.x2 - p.x1 > 1 && p.y2 - p.y1 > 1 && (p.x2 - p.x1) * (p.y2 - p.y1) < h * w) break;
      }
      t.apply(p, batch.image, batch.label, batch.soft_label);
      const size_t e_bytes = dtype.bytes();
      const size_t per = static_cast<size_t>(3 * h * w) * e_bytes;
      for (uint64_t i = 0; i < 4; ++i)
        for (int64_t c = 0; c < 3; ++c)
          for (int64_t y = 0; y < h; ++y)
            for (int64_t x = 0; x < w; ++x) {
              const size_t at =
                  static_cast<size_t>(layout == ImageLayout::kCHW ? (c * h + y) * w + x
                                                                  : (y * w + x) * 3 + c) *
                  e_bytes;
              const bool inside = x >= p.x1 && x < p.x2 && y >= p.y1 && y < p.y2;
              const uint64_t from = inside ? (i + 3) % 4 : i;
              ASSERT_EQ(std::memcmp(batch.images.data() + i * per + at,
                                    before.data() + from * per + at, e_bytes),
                        0)
                  << i << " " << c << " " << y << " " << x;
            }
    }
}

TEST(BatchTransform, SoftLabelsHoldTheTwoClassesWithLambdaAndItsComplement) {
  const int64_t classes = 6;
  for (BatchMix m : {mixup(0.4), cutmix(0.4)}) {
    TestBatch batch(kFloat32, ImageLayout::kCHW, 8, 8, {3, 3, 0, 5, 1}, classes);
    const BatchTransform t({m}, classes, ImageLayout::kCHW);
    const BatchMixParams p = t.draw(2, 9, 4, 8, 8);
    t.apply(p, batch.image, batch.label, batch.soft_label);
    const float a = float(1 - p.label_lambda), b = float(p.label_lambda);
    for (int64_t i = 0; i < 5; ++i) {
      const int64_t own = batch.labels[i], prev = batch.labels[(i + 4) % 5];
      double sum = 0;
      for (int64_t c = 0; c < classes; ++c) {
        const float v = batch.soft_at(i, c, classes);
        sum += v;
        if (c == own && c == prev) {
          EXPECT_EQ(v, a + b);
        } else if (c == own) {
          EXPECT_EQ(v, b);
        } else if (c == prev) {
          EXPECT_EQ(v, a);
        } else {
          EXPECT_EQ(v, 0.0f);
        }
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
    }
  }
}

TEST(BatchTransform, ALabelOutOfRangeIsNamedAndNothingIsWritten) {
  for (int64_t bad : {int64_t{6}, int64_t{-1}}) {
    TestBatch batch(kFloat32, ImageLayout::kCHW, 4, 4, {1, 2, bad, 0}, 6);
    const std::vector<std::byte> images = batch.images, soft = batch.soft;
    const BatchTransform t({mixup()}, 6, ImageLayout::kCHW);
    try {
      t.apply(t.draw(0, 0, 0, 4, 4), batch.image, batch.label, batch.soft_label);
      ADD_FAILURE() << "label " << bad << " accepted";
    } catch (const LabelOutOfRange& e) {
      EXPECT_EQ(e.row(), 2u);
      EXPECT_EQ(e.label(), bad);
      EXPECT_NE(std::string(e.what()).find("label " + std::to_string(bad) +
                                           " is not a class of MixUp(alpha=1, num_classes=6)"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(batch.images, images);
    EXPECT_EQ(batch.soft, soft);
  }
}

// ---- in the loader -------------------------------------------------------------------------

// Images of 3 x 6 x 5 float32 whose values come from (key, position), and labels index % 7, or
// 7 + index % 7 for the samples in `unknown`; samples in `fail` throw.
class ImageLikeSource final : public Source {
 public:
  explicit ImageLikeSource(uint64_t n, std::set<uint64_t> fail = {},
                           std::set<uint64_t> unknown = {})
      : n_(n),
        fail_(std::move(fail)),
        unknown_(std::move(unknown)),
        fields_{{"image", kFloat32, {3, 6, 5}}, {"label", kInt64, {}}} {}
  uint64_t size() const override { return n_; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  std::string path(uint64_t index) const override { return "img-" + std::to_string(index); }
  void read(const SampleKey& key, std::span<std::byte* const> slots, WorkerState*) const override {
    if (fail_.count(key.index)) throw DecodeError("broken image");
    SampleRng rng(key.seed, key.epoch, key.index);
    auto* image = reinterpret_cast<float*>(slots[0]);
    for (int e = 0; e < 90; ++e) image[e] = static_cast<float>(rng.uniform());
    const int64_t label = static_cast<int64_t>(key.index % 7 + (unknown_.count(key.index) ? 7 : 0));
    std::memcpy(slots[1], &label, 8);
  }

 private:
  uint64_t n_;
  std::set<uint64_t> fail_, unknown_;
  std::vector<FieldSpec> fields_;
};

struct Delivered {
  std::vector<float> images, soft;
  std::vector<int64_t> labels;
  bool operator==(const Delivered&) const = default;
};

std::vector<Delivered> drain(EpochIterator& it) {
  std::vector<Delivered> out;
  while (auto b = it.next()) {
    Delivered d;
    const auto* im = reinterpret_cast<const float*>(b->fields[0].data);
    d.images.assign(im, im + b->length * 90);
    const auto* lb = reinterpret_cast<const int64_t*>(b->fields[1].data);
    d.labels.assign(lb, lb + b->length);
    if (b->fields.size() > 2) {
      const auto* s = reinterpret_cast<const float*>(b->fields[2].data);
      d.soft.assign(s, s + b->length * b->fields[2].shape[1]);
    }
    out.push_back(std::move(d));
  }
  return out;
}

EngineOptions mixing(int workers) {
  EngineOptions o;
  o.batch_size = 8;
  o.shuffle = true;
  o.seed = 17;
  o.num_workers = workers;
  o.prefetch_factor = 2;
  o.batch_transform = std::make_shared<const BatchTransform>(
      std::vector<BatchMix>{mixup(0.8), cutmix(1.0)}, 7, ImageLayout::kCHW);
  return o;
}

TEST(EngineBatchTransform, BatchesAreTheTransformOfTheUnmixedBatch) {
  const auto src = std::make_shared<ImageLikeSource>(61);
  EngineOptions o = mixing(2);
  o.world_size = 2;
  o.rank = 1;
  Engine mixed(src, o);
  const BatchTransform& t = *o.batch_transform;
  o.batch_transform = nullptr;
  Engine plain(src, o);
  auto mixed_it = mixed.iterate(4);
  auto plain_it = plain.iterate(4);
  std::set<size_t> kinds;
  uint64_t b = 0;
  while (auto got = mixed_it->next()) {
    auto raw = plain_it->next();
    ASSERT_TRUE(raw);
    ASSERT_EQ(got->fields.size(), 3u);
    EXPECT_EQ(got->fields[2].name, "soft_label");
    EXPECT_EQ(got->fields[2].shape, (std::vector<int64_t>{int64_t(got->length), 7}));
    // The int labels stay as read.
    EXPECT_EQ(std::memcmp(got->fields[1].data, raw->fields[1].data, 8 * got->length), 0);
    const BatchMixParams p = t.draw(17, 4, mixed.plan().first_position(b), 6, 5);
    kinds.insert(p.choice);
    std::vector<float> soft(got->length * 7);
    BatchField soft_field{reinterpret_cast<std::byte*>(soft.data()),
                          kFloat32,
                          {int64_t(got->length), 7},
                          "soft_label"};
    t.apply(p, raw->fields[0], raw->fields[1], soft_field);
    EXPECT_EQ(std::memcmp(got->fields[0].data, raw->fields[0].data, 4 * 90 * got->length), 0)
        << "batch " << b;
    EXPECT_EQ(std::memcmp(got->fields[2].data, soft.data(), 4 * soft.size()), 0) << b;
    ++b;
  }
  EXPECT_EQ(b, mixed.num_batches());
  EXPECT_EQ(kinds.size(), 2u);  // both choices were drawn
  EXPECT_GT(mixed.stats().batch_transform_seconds, 0);
}

TEST(EngineBatchTransform, BatchesAreIdenticalForAnyWorkersAndOnResume) {
  const auto src = std::make_shared<ImageLikeSource>(83);
  const std::vector<Delivered> reference = drain(*Engine(src, mixing(0)).iterate(2));
  ASSERT_EQ(reference.size(), 11u);
  for (int workers : {1, 2, 4}) {
    EXPECT_EQ(drain(*Engine(src, mixing(workers)).iterate(2)), reference) << workers;
    const std::vector<Delivered> rest = drain(*Engine(src, mixing(workers)).iterate(2, 6));
    EXPECT_EQ(rest, std::vector<Delivered>(reference.begin() + 6, reference.end())) << workers;
  }
  EXPECT_NE(drain(*Engine(src, mixing(2)).iterate(3)), reference);
}

TEST(EngineBatchTransform, AFailedBatchIsNotTransformedAndTheNextOnesAre) {
  for (int workers : {0, 3}) {
    // Sample 15 has no class: the transform would fail batch 1 (8..15) naming it, but sample 13
    // fails first, and a failed batch is not transformed.
    const auto src =
        std::make_shared<ImageLikeSource>(40, std::set<uint64_t>{13}, std::set<uint64_t>{15});
    EngineOptions o = mixing(workers);
    o.shuffle = false;
    Engine loader(src, o);
    auto it = loader.iterate(0);
    int delivered = 0;
    bool failed = false;
    for (;;) {
      try {
        auto b = it->next();
        if (!b) break;
        ++delivered;
      } catch (const SampleError& e) {
        EXPECT_EQ(e.index(), 13u);
        EXPECT_NE(std::string(e.what()).find("broken image"), std::string::npos) << e.what();
        EXPECT_FALSE(failed);
        failed = true;
      }
    }
    EXPECT_TRUE(failed);
    EXPECT_EQ(delivered, 4);
  }
}

TEST(EngineBatchTransform, ALabelWithoutAClassFailsItsBatchNamingTheSample) {
  for (int workers : {0, 2}) {
    const auto src =
        std::make_shared<ImageLikeSource>(30, std::set<uint64_t>{}, std::set<uint64_t>{7, 15, 23});
    EngineOptions o = mixing(workers);
    o.shuffle = false;
    o.on_error = OnError::kSkip;  // a setting's error, not bad data: never skipped
    auto it = Engine(src, o).iterate(0);
    for (uint64_t index : {7, 15, 23}) {
      try {
        it->next();
        ADD_FAILURE() << "sample " << index << " was not named";
      } catch (const SampleError& e) {
        EXPECT_EQ(e.index(), index);
        EXPECT_EQ(e.path(), "img-" + std::to_string(index));
        const std::string label = std::to_string(7 + index % 7);
        EXPECT_NE(std::string(e.what()).find("label " + label +
                                             " is not a class of RandomChoice([MixUp("
                                             "alpha=0.8, num_classes=7), CutMix(alpha=1, "
                                             "num_classes=7)], p=[0.5, 0.5])"),
                  std::string::npos)
            << e.what();
      }
    }
    auto last = it->next();
    ASSERT_TRUE(last);
    EXPECT_EQ(last->length, 6u);
    EXPECT_FALSE(it->next());
  }
}

}  // namespace
}  // namespace stoker
