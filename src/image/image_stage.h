// Internal: the image stage of ImagePipeline, the transforms that run on the 8-bit image in
// memory after the fused decode and resample (or after a full decode, for a list that starts
// with one of them), and random erasing on the output tensor.
//
// Each transform draws its parameters from the sample's SampleRng as torchvision draws them
// (the same distributions, in the same order within the transform), then runs the kernels of
// ops.h. A run of crops, resizes and flips composes into one resample from memory, as the fused
// prefix does from the decoder.
#pragma once

#include <optional>
#include <span>
#include <utility>

#include "geometry.h"
#include "stoker/image/ops.h"
#include "resample.h"
#include "stoker/image/pipeline.h"
#include "stoker/image/transforms.h"
#include "stoker/random.h"

namespace stoker::image::internal {

// The stage's working images and buffers: one per thread, reused from image to image.
struct StageScratch {
  RgbImage images[2];
  int current = 0;
  OpScratch ops;
  CachedCoeffs h, v;
  std::vector<uint8_t> tmp, row;

  RgbImage& image() { return images[current]; }
  RgbImage& spare() { return images[current ^ 1]; }
  void swap() { current ^= 1; }
};

// Runs `transforms` (each of stage kFused or kImage, RandomApply's count within them) on
// s.image(), which holds the image when called and the result when it returns. Throws
// InvalidArgument for an image a transform cannot take (a RandomCrop larger than it, a
// reflection padding wider than it).
void run_image_stage(std::span<const Transform> transforms, SampleRng& rng, StageScratch& s);

// The image's (height, width) after `t` given the size before it (nullopt: depends on the
// image). RandomApply of transforms that change the size makes it depend on the draw: nullopt.
std::optional<std::pair<int, int>> size_after(std::span<const Transform> transforms,
                                              std::optional<std::pair<int, int>> size);

// A RowSink (resample.h) that writes rows into an image, flips applied.
struct ImageSink {
  RgbView dst;
  bool flip, vflip;
};
void image_sink(void* ctx, int y, const uint8_t* rgb);  // ctx: an ImageSink

// Resamples `src` (the image `plan` was drawn for) through `plan` into `dst`, flips applied.
void resample_into(const GeometryPlan& plan, RgbView src, RgbImage& dst, StageScratch& s);

// The output tensor of one sample, for random erasing after ToTensor.
struct OutputView {
  std::byte* data;
  int height, width;
  DType dtype;
  Layout layout;
};

// Random erasing on the output tensor (RandomErasing after ToTensor). `mean`/`std` give the
// Normalize that follows it in the list, if any (the erased values are normalized too); the
// values of a uint8 output are truncated, as torch's assignment does.
void erase_output(const RandomErasing& t, OutputView out, SampleRng& rng,
                  const std::optional<std::pair<std::array<float, 3>, std::array<float, 3>>>&
                      normalize_after);

}  // namespace stoker::image::internal
