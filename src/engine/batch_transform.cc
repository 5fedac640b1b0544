#include "stoker/batch_transform.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <sstream>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "engine/batch_mix_kernels.h"
#include "stoker/random.h"

namespace stoker {
namespace {

// Separates the batch stream from the samples' (seed, epoch, index) streams.
constexpr uint64_t kBatchStream = 0xba7c'43a7'e5ee'd001ULL;

const char* kind_name(BatchMix::Kind kind) {
  return kind == BatchMix::Kind::kMixUp ? "MixUp" : "CutMix";
}

std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// float16 and bfloat16 <-> float, rounding to nearest even as torch does. Written with selects,
// not branches, so that the blend loops over them vectorize (a branchy conversion costs about 30x
// the float32 blend).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t bits = static_cast<uint32_t>(h & 0x7fffu) << 13;  // exponent and mantissa
  const uint32_t exponent = bits & 0x0f800000u;
  const uint32_t normal = bits + (uint32_t{127 - 15} << 23);
  const uint32_t inf_nan = normal + (uint32_t{128 - 16} << 23);
  // Subnormal: m * 2^-24, as (2^-14 + m * 2^-24) - 2^-14, both exact in float.
  const float sub = std::bit_cast<float>(normal + (uint32_t{1} << 23)) -
                    std::bit_cast<float>(uint32_t{113} << 23);
  uint32_t out = exponent == 0x0f800000u ? inf_nan : normal;
  out = exponent == 0 ? std::bit_cast<uint32_t>(sub) : out;
  return std::bit_cast<float>(out | sign);
}

inline uint16_t float_to_half(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  const uint32_t odd = (x >> 13) & 1;
  const uint32_t normal = (x + (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd) >> 13;
  // Below the smallest normal half: float addition rounds the mantissa into place.
  const uint32_t sub =
      std::bit_cast<uint32_t>(std::bit_cast<float>(x) + 0.5f) - uint32_t{0x3f000000u};
  const uint32_t inf_nan = x > 0x7f800000u ? 0x7e00u : 0x7c00u;
  const uint32_t out = x >= 0x47800000u ? inf_nan : x < 0x38800000u ? sub : normal;
  return static_cast<uint16_t>((sign >> 16) | out);
}

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t{h} << 16); }

inline uint16_t float_to_bf16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

// The thread's scratch: one sample (MixUp) or one box (CutMix) of the batch's last image.
std::byte* scratch(size_t bytes) {
  thread_local std::vector<std::byte> buffer;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

// images[i] = blend(images[i - 1], images[i]), images[-1] the last image as it was: from the last
// image down, each reads its predecessor before that is overwritten.
template <typename T, typename Blend>
void mixup(std::byte* data, uint64_t length, size_t elements, Blend blend) {
  T* images = reinterpret_cast<T*>(data);
  T* last = reinterpret_cast<T*>(scratch(elements * sizeof(T)));
  std::memcpy(last, images + (length - 1) * elements, elements * sizeof(T));
  for (uint64_t i = length; i-- > 0;) {
    T* own = images + i * elements;
    blend(own, i > 0 ? own - elements : last, elements);
  }
}

}  // namespace

namespace internal {

void blend_float32(float* own, const float* previous, size_t n, float a, float b) {
  for (size_t e = 0; e < n; ++e) {
    const float p = previous[e] * a;  // separate statements: each product is rounded to float
    const float o = own[e] * b;
    own[e] = p + o;
  }
}

void blend_bfloat16(uint16_t* own, const uint16_t* previous, size_t n, float a, float b) {
  for (size_t e = 0; e < n; ++e) {
    const uint16_t p = float_to_bf16(bf16_to_float(previous[e]) * a);
    const uint16_t o = float_to_bf16(bf16_to_float(own[e]) * b);
    own[e] = float_to_bf16(bf16_to_float(p) + bf16_to_float(o));
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
namespace {

// F16C converts 8 values an instruction, rounding to nearest even as torch does.
__attribute__((target("avx,f16c"))) void blend_float16_f16c(uint16_t* own, const uint16_t* previous,
                                                            size_t n, float a, float b) {
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  size_t e = 0;
  for (; e + 8 <= n; e += 8) {
    const __m256 p =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(previous + e)));
    const __m256 o = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(own + e)));
    const __m128i pa = _mm256_cvtps_ph(_mm256_mul_ps(p, va), kNearest);
    const __m128i ob = _mm256_cvtps_ph(_mm256_mul_ps(o, vb), kNearest);
    const __m256 sum = _mm256_add_ps(_mm256_cvtph_ps(pa), _mm256_cvtph_ps(ob));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(own + e), _mm256_cvtps_ph(sum, kNearest));
  }
  blend_float16(own + e, previous + e, n - e, a, b, false);
}

}  // namespace

bool float16_hardware() {
  // F16C from CPUID leaf 1 (clang 14's __builtin_cpu_supports does not know "f16c"); "avx"
  // also checks that the OS saves the YMM registers.
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) != 0 &&
           (c & bit_F16C) != 0;
  }();
  return has;
}
#else
bool float16_hardware() { return false; }
#endif

void blend_float16(uint16_t* own, const uint16_t* previous, size_t n, float a, float b,
                   bool hardware) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (hardware) return blend_float16_f16c(own, previous, n, a, b);
#else
  (void)hardware;
#endif
  for (size_t e = 0; e < n; ++e) {
    const uint16_t p = float_to_half(half_to_float(previous[e]) * a);
    const uint16_t o = float_to_half(half_to_float(own[e]) * b);
    own[e] = float_to_half(half_to_float(p) + half_to_float(o));
  }
}

}  // namespace internal

LabelOutOfRange::LabelOutOfRange(uint64_t row, int64_t label, int64_t num_classes,
                                 const std::string& who)
    : InvalidArgument("label " + std::to_string(label) + " is not a class of " + who +
                      ": labels must lie in [0, num_classes) = [0, " + std::to_string(num_classes) +
                      ")"),
      row_(row),
      label_(label) {}

BatchTransform::BatchTransform(std::vector<BatchMix> choices, int64_t num_classes,
                               ImageLayout layout)
    : choices_(std::move(choices)), num_classes_(num_classes), layout_(layout) {
  if (choices_.empty()) throw InvalidArgument("a batch transform needs MixUp or CutMix, got none");
  for (const BatchMix& c : choices_) {
    if (!(c.alpha > 0) || !std::isfinite(c.alpha))
      throw InvalidArgument(std::string(kind_name(c.kind)) +
                            " alpha must be a positive finite number (Beta(alpha, alpha)), got " +
                            number(c.alpha));
    if (!(c.weight >= 0) || !std::isfinite(c.weight))
      throw InvalidArgument("RandomChoice p must be non-negative finite numbers, got " +
                            number(c.weight));
    total_weight_ += c.weight;
  }
  if (!(total_weight_ > 0)) throw InvalidArgument("RandomChoice p must not sum to 0");
  if (num_classes_ < 1)
    throw InvalidArgument(std::string(kind_name(choices_[0].kind)) +
                          " num_classes must be a positive integer, got " +
                          std::to_string(num_classes_));
}

std::string BatchTransform::describe() const {
  auto one = [&](const BatchMix& c) {
    return std::string(kind_name(c.kind)) + "(alpha=" + number(c.alpha) +
           ", num_classes=" + std::to_string(num_classes_) + ")";
  };
  if (choices_.size() == 1) return one(choices_[0]);
  std::string s = "RandomChoice([", p = "p=[";
  for (size_t i = 0; i < choices_.size(); ++i) {
    if (i > 0) {
      s += ", ";
      p += ", ";
    }
    s += one(choices_[i]);
    p += number(choices_[i].weight / total_weight_);
  }
  return s + "], " + p + "])";
}

BatchTransform::Fields BatchTransform::check(const std::vector<FieldSpec>& fields) const {
  Fields out;
  bool image = false, label = false;
  for (size_t f = 0; f < fields.size(); ++f) {
    if (fields[f].name == "image") {
      out.image = f;
      image = true;
    }
    if (fields[f].name == "label") {
      out.label = f;
      label = true;
    }
    if (fields[f].name == kSoftLabelField)
      throw InvalidArgument(describe() + " writes the field \"" + kSoftLabelField +
                            "\", which the source already has");
  }
  if (!image || !label)
    throw InvalidArgument(describe() +
                          " transforms batches of (images, labels): the source needs the fields "
                          "\"image\" and \"label\" (an image dataset with labels)");
  const FieldSpec& im = fields[out.image];
  const FieldSpec& lb = fields[out.label];
  if (lb.dtype != kInt64 || !lb.shape.empty())
    throw InvalidArgument(describe() + " needs one int64 class index per sample as the label");
  const bool chw = layout_ == ImageLayout::kCHW;
  if (im.shape.size() != 3 || im.shape[chw ? 0 : 2] != 3 || im.shape[chw ? 1 : 0] < 1 ||
      im.shape[chw ? 2 : 1] < 1)
    throw InvalidArgument(describe() + " needs RGB images of one size in " + (chw ? "CHW" : "HWC") +
                          " layout");
  const DType d = im.dtype;
  const bool floating = (d.code == DType::kFloat && (d.bits == 32 || d.bits == 16)) ||
                        (d.code == DType::kBFloat && d.bits == 16);
  if (!floating && d != kUInt8)
    throw InvalidArgument(describe() + " cannot mix images of dtype " + d.name());
  if (!floating)
    for (const BatchMix& c : choices_)
      if (c.kind == BatchMix::Kind::kMixUp)
        throw InvalidArgument(
            "MixUp blends images, which uint8 cannot hold (torchvision's MixUp fails on uint8 "
            "too): make float images, e.g. ToTensor(dtype=\"float32\"), or use CutMix alone");
  return out;
}

FieldSpec BatchTransform::soft_label_field() const {
  return {kSoftLabelField, kFloat32, {num_classes_}};
}

BatchMixParams BatchTransform::draw(uint64_t seed, uint64_t epoch, uint64_t batch_key,
                                    int64_t height, int64_t width) const {
  SampleRng rng(mix64(seed ^ kBatchStream), epoch, batch_key);
  BatchMixParams p;
  if (choices_.size() > 1) {
    // torchvision's RandomChoice: pick by the normalized weights, then the transform draws.
    const double u = rng.uniform() * total_weight_;
    double below = 0;
    p.choice = choices_.size() - 1;
    for (size_t i = 0; i + 1 < choices_.size(); ++i) {
      below += choices_[i].weight;
      if (u < below) {
        p.choice = i;
        break;
      }
    }
    while (choices_[p.choice].weight == 0) --p.choice;  // u landed on the rounding edge
  }
  const BatchMix& c = choices_[p.choice];
  p.kind = c.kind;
  p.lambda = sample_beta(rng, c.alpha, c.alpha);
  p.label_lambda = p.lambda;
  if (c.kind == BatchMix::Kind::kCutMix) {
    // torchvision's CutMix.make_params: the centre's x, then its y; truncated half-sides.
    const int64_t rx = rng.uniform_int(0, width);
    const int64_t ry = rng.uniform_int(0, height);
    const double r = 0.5 * std::sqrt(1.0 - p.lambda);
    const auto half_w = static_cast<int64_t>(r * static_cast<double>(width));
    const auto half_h = static_cast<int64_t>(r * static_cast<double>(height));
    p.x1 = std::max<int64_t>(rx - half_w, 0);
    p.y1 = std::max<int64_t>(ry - half_h, 0);
    p.x2 = std::min<int64_t>(rx + half_w, width);
    p.y2 = std::min<int64_t>(ry + half_h, height);
    p.label_lambda = 1.0 - static_cast<double>((p.x2 - p.x1) * (p.y2 - p.y1)) /
                               static_cast<double>(width * height);
  }
  return p;
}

void BatchTransform::apply(const BatchMixParams& p, const BatchField& image,
                           const BatchField& label, const BatchField& soft_label) const {
  const uint64_t length = static_cast<uint64_t>(image.shape.at(0));
  const auto* labels = reinterpret_cast<const int64_t*>(label.data);
  for (uint64_t i = 0; i < length; ++i)
    if (labels[i] < 0 || labels[i] >= num_classes_)
      throw LabelOutOfRange(i, labels[i], num_classes_, describe());

  // Labels: torch's roll(1).mul_(1 - lambda').add_(own.mul(lambda')) on one-hot float32 rows.
  const float a = static_cast<float>(1.0 - p.label_lambda);
  const float b = static_cast<float>(p.label_lambda);
  auto* soft = reinterpret_cast<float*>(soft_label.data);
  const auto classes = static_cast<size_t>(num_classes_);
  for (uint64_t i = 0; i < length; ++i) {
    float* row = soft + i * classes;
    std::fill(row, row + classes, 0.0f);
    const int64_t own = labels[i], previous = labels[i == 0 ? length - 1 : i - 1];
    row[previous] = a;
    row[own] = own == previous ? a + b : b;
  }

  const bool chw = layout_ == ImageLayout::kCHW;
  const int64_t height = image.shape[chw ? 2 : 1], width = image.shape[chw ? 3 : 2];
  const size_t elements = static_cast<size_t>(3 * height * width);
  const size_t element_bytes = image.dtype.bytes();
  if (p.kind == BatchMix::Kind::kMixUp) {
    const float a = static_cast<float>(1.0 - p.lambda), b = static_cast<float>(p.lambda);
    if (image.dtype == kFloat32)
      return mixup<float>(image.data, length, elements,
                          [&](float* own, const float* prev, size_t n) {
                            internal::blend_float32(own, prev, n, a, b);
                          });
    const bool hardware = internal::float16_hardware();
    if (image.dtype.code == DType::kFloat)
      return mixup<uint16_t>(image.data, length, elements,
                             [&](uint16_t* own, const uint16_t* prev, size_t n) {
                               internal::blend_float16(own, prev, n, a, b, hardware);
                             });
    if (image.dtype.code == DType::kBFloat)
      return mixup<uint16_t>(image.data, length, elements,
                             [&](uint16_t* own, const uint16_t* prev, size_t n) {
                               internal::blend_bfloat16(own, prev, n, a, b);
                             });
    throw InvalidArgument("MixUp cannot blend images of dtype " + image.dtype.name());
  }

  // CutMix: the previous image's box over each image's, from the last image down (the last
  // image's box is kept first, for image 0).
  if (p.x2 <= p.x1 || p.y2 <= p.y1) return;  // an empty box: nothing is pasted
  const size_t sample_bytes = elements * element_bytes;
  // A run: the contiguous bytes of one box row (of one channel, in CHW).
  const size_t run = static_cast<size_t>(p.x2 - p.x1) * element_bytes * (chw ? 1 : 3);
  const int64_t planes = chw ? 3 : 1, rows = p.y2 - p.y1;
  auto run_offset = [&](int64_t plane, int64_t y) {
    const int64_t pixel =
        chw ? plane * height * width + (p.y1 + y) * width + p.x1 : ((p.y1 + y) * width + p.x1) * 3;
    return static_cast<size_t>(pixel) * element_bytes;
  };
  std::byte* last = scratch(run * static_cast<size_t>(planes * rows));
  const std::byte* last_image = image.data + (length - 1) * sample_bytes;
  for (int64_t c = 0; c < planes; ++c)
    for (int64_t y = 0; y < rows; ++y)
      std::memcpy(last + (c * rows + y) * run, last_image + run_offset(c, y), run);
  for (uint64_t i = length; i-- > 0;) {
    std::byte* own = image.data + i * sample_bytes;
    for (int64_t c = 0; c < planes; ++c)
      for (int64_t y = 0; y < rows; ++y) {
        const std::byte* from =
            i > 0 ? own - sample_bytes + run_offset(c, y) : last + (c * rows + y) * run;
        std::memcpy(own + run_offset(c, y), from, run);
      }
  }
}

}  // namespace stoker
