// The image fuzz targets' shared body: one input through the whole decode + augment pipeline.
//
// An input is an encoded image followed by the pipeline's parameters: FuzzedDataProvider takes
// integers from the end of the input, so whether a primer image comes first (and how long it is),
// the transforms (kind, order, sizes, crop scale and ratio ranges, flip probability, output dtype
// and layout, Normalize), the pipeline options (DCT-scaling threshold, pixel limit) and the
// sample's random key (seed, epoch, index: the crop and flip parameters drawn) come from its last
// bytes; then the primer is taken from the front and the image is what is left. Seeds are images
// with parameter bytes appended (fuzz/make_seeds.py).
//
// Checked beyond "no crash, no sanitizer report": run() throws nothing but DecodeError; a
// scratch that decoded the primer first (as a worker's scratch decoded the images before) gives
// the same bytes as a fresh one, or the same error; decode() returns width x height x 3 bytes.
// Every input is reproducible from its bytes alone: nothing carries over from one to the next.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "stoker/errors.h"
#include "stoker/image/decode.h"
#include "stoker/image/pipeline.h"

namespace stoker::fuzz {

inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz check failed: %s\n", what);
    std::abort();
  }
}

inline image::Transform geometric(FuzzedDataProvider& p) {
  using namespace stoker::image;
  const int h = p.ConsumeIntegralInRange<int>(1, 300);
  const int w = p.ConsumeIntegralInRange<int>(1, 300);
  switch (p.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: {
      const double s0 = 0.01 + 0.99 * p.ConsumeProbability<double>();
      const double s1 = s0 + p.ConsumeProbability<double>();
      const double r0 = 0.05 + 5 * p.ConsumeProbability<double>();
      const double r1 = r0 + 15 * p.ConsumeProbability<double>();
      return RandomResizedCrop(h, w, {s0, s1}, {r0, r1});
    }
    case 1:
      return p.ConsumeBool() ? Resize(h) : Resize(h, w);
    case 2:
      return CenterCrop(h, w);
    default:
      return RandomHorizontalFlip(p.PickValueInArray({0.0, 0.5, 1.0}));
  }
}

inline std::vector<image::Transform> transforms(FuzzedDataProvider& p) {
  using namespace stoker::image;
  std::vector<Transform> t;
  const int n = p.ConsumeIntegralInRange<int>(1, 3);
  for (int i = 0; i < n; ++i) t.push_back(geometric(p));
  if (p.ConsumeBool()) {
    const DType dtype =
        p.PickValueInArray({DType::kUInt8, DType::kFloat32, DType::kFloat16, DType::kBFloat16});
    t.push_back(ToTensor(dtype, p.ConsumeBool() ? Layout::kCHW : Layout::kHWC));
    if (dtype != DType::kUInt8 && p.ConsumeBool()) {
      std::array<float, 3> mean{}, stdev{};
      for (int c = 0; c < 3; ++c) {
        mean[c] = p.ConsumeFloatingPointInRange<float>(-1, 1);
        stdev[c] = p.ConsumeFloatingPointInRange<float>(0.01f, 2);
      }
      t.push_back(Normalize(mean, stdev));
    }
  }
  return t;
}

inline int fuzz_image(const uint8_t* data, size_t size, image::ImageFormat format) {
  using namespace stoker::image;
  FuzzedDataProvider p(data, size);
  const bool primed = p.ConsumeIntegralInRange<int>(0, 3) == 0;
  const size_t primer_bytes = primed ? p.ConsumeIntegralInRange<size_t>(0, p.remaining_bytes()) : 0;
  const std::vector<Transform> t = transforms(p);
  PipelineOptions options;
  options.dct_min_ratio = p.PickValueInArray({0.0, 1.0, 2.0, 4.0});
  // Large enough for the seeds, small enough that no input asks for gigabytes.
  options.max_pixels = p.ConsumeBool() ? p.ConsumeIntegralInRange<uint64_t>(1, 1 << 22) : 1 << 22;
  const uint64_t seed = p.ConsumeIntegral<uint64_t>();
  const SampleRng key(seed, p.ConsumeIntegral<uint64_t>(), p.ConsumeIntegral<uint64_t>());
  // From a bit already drawn, so that the corpus and the regressions read as before.
  options.alpha = seed & 1 ? Alpha::kOverWhite : Alpha::kDrop;
  const bool full_decode = p.ConsumeBool();
  const std::vector<uint8_t> primer = p.ConsumeBytes<uint8_t>(primer_bytes);
  const std::vector<uint8_t> file = p.ConsumeRemainingBytes<uint8_t>();
  const std::span<const std::byte> bytes = std::as_bytes(std::span(file));
  try {
    if (sniff(bytes) != format) return 0;  // the other image target's input
  } catch (const DecodeError&) {
    return 0;
  }

  std::optional<ImagePipeline> pipeline;
  try {
    pipeline.emplace(t, options);
  } catch (const InvalidArgument&) {
    return 0;  // transforms without a fixed output size, or in an invalid order
  }
  // Floats: the output buffer is aligned for every output dtype.
  const size_t words = (pipeline->output_bytes() + 3) / 4;
  std::vector<float> reused_out(words, -1.0f), fresh_out(words, -1.0f);
  ImageScratch reused, fresh;
  std::optional<std::string> reused_error, fresh_error;
  SampleRng rng1 = key, rng2 = key;
  if (primed) {
    SampleRng rng0 = key;
    try {
      pipeline->run(std::as_bytes(std::span(primer)), rng0,
                    reinterpret_cast<std::byte*>(reused_out.data()), reused);
    } catch (const DecodeError&) {
    }
  }
  try {
    pipeline->run(bytes, rng1, reinterpret_cast<std::byte*>(reused_out.data()), reused);
  } catch (const DecodeError& e) {
    reused_error = e.what();
  }
  try {
    pipeline->run(bytes, rng2, reinterpret_cast<std::byte*>(fresh_out.data()), fresh);
  } catch (const DecodeError& e) {
    fresh_error = e.what();
  }
  if (reused_error != fresh_error) {
    std::fprintf(stderr, "reused scratch: %s\nfresh scratch: %s\n",
                 reused_error.value_or("no error").c_str(),
                 fresh_error.value_or("no error").c_str());
    require(false, "a reused scratch and a fresh one disagree on the error");
  }
  if (!reused_error)
    require(std::memcmp(reused_out.data(), fresh_out.data(), pipeline->output_bytes()) == 0,
            "a reused scratch and a fresh one give different pixels");

  if (full_decode) {
    try {
      const DecodedImage img = decode(bytes, options.max_pixels, options.alpha);
      require(img.rgb.size() == static_cast<size_t>(img.width) * img.height * 3,
              "decode() returned a buffer of the wrong size");
      const ImageInfo info = read_info(bytes, options.max_pixels);
      require(info.width == img.width && info.height == img.height,
              "read_info() and decode() disagree on the size");
    } catch (const DecodeError&) {
    }
  }
  return 0;
}

}  // namespace stoker::fuzz
