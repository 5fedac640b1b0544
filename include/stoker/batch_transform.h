// Batch transforms: augmentation that mixes the samples of a batch (MixUp, CutMix, or a random
// choice between them), run by the loader on each finished batch of an image source.
//
// Semantics are torchvision.transforms.v2's MixUp and CutMix applied to a batch (images, labels):
// - the labels become one-hot float32 rows of num_classes, each mixed with the row before it in
//   the batch (the batch rolled by one, so row 0 with the last row): lambda' * its own one-hot
//   plus (1 - lambda') * the previous one;
// - MixUp: every image becomes lambda * itself + (1 - lambda) * the previous image, with
//   lambda' = lambda;
// - CutMix: a box of the previous image is pasted over each image: centre (r_x, r_y) uniform over
//   the image, half-sides int(r * W) and int(r * H) for r = sqrt(1 - lambda) / 2, clamped to the
//   image; lambda' = 1 - box area / image area.
// lambda is drawn from Beta(alpha, alpha), once per batch, and so is the box: every sample of a
// batch mixes with the same parameters, as torchvision's transforms do when given a batch.
// A random choice (torchvision's RandomChoice) picks one of its transforms per batch, with
// probability proportional to its weight, before that transform draws its parameters.
//
// Arithmetic: torchvision's, in the images' dtype. float32: float(1 - lambda) * previous, then
// float(lambda) * own, each product rounded to float32, then their sum (torch's mul_ then add_).
// float16 and bfloat16: the same in float, each product and the sum rounded to the dtype, as
// torch's CPU kernels round them. So the result is bit-identical to torchvision's formula on the
// same batch and parameters. CutMix copies elements, so it works on uint8 too; MixUp on uint8 is
// refused, as torch refuses to blend uint8 in place.
//
// Randomness: draw() takes a SampleRng keyed by (stream(seed), epoch, batch key), a stream of its
// own, never one of the samples' (seed, epoch, index). The loader keys batch b of a plan by
// BatchPlan::first_position(b), so a batch's parameters depend on nothing but (seed, epoch, plan,
// b): not on the worker count, and a resumed epoch draws them again exactly.
//
// Contract:
// - Thread safety: immutable after construction; draw() and apply() may run concurrently, on
//   different batches, from any threads.
// - Errors: the constructor throws InvalidArgument for no choices, alpha <= 0 or not finite,
//   negative or non-finite weights or weights summing to 0, num_classes < 1. check() throws
//   InvalidArgument when a source's fields are not ("image" of 3 channels in the layout, in a
//   dtype the choices can mix; "label", an int64 scalar). apply() throws LabelOutOfRange for a
//   label outside [0, num_classes) before it writes anything.
// - Memory: apply() mixes the images in place, with one sample of scratch per thread (the last
//   image, which the roll needs after it has been overwritten), kept for the thread's next batch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "stoker/errors.h"
#include "stoker/engine.h"
#include "stoker/source.h"

namespace stoker {

enum class ImageLayout { kCHW, kHWC };

// One transform of a batch transform, and its weight in a random choice.
struct BatchMix {
  enum class Kind { kMixUp, kCutMix };
  Kind kind = Kind::kMixUp;
  double alpha = 1.0;   // of Beta(alpha, alpha)
  double weight = 1.0;  // relative probability of being picked (one choice: any positive value)
};

// What one batch draws.
struct BatchMixParams {
  size_t choice = 0;  // index of the transform picked
  BatchMix::Kind kind = BatchMix::Kind::kMixUp;
  double lambda = 1.0;        // the Beta(alpha, alpha) draw
  double label_lambda = 1.0;  // lambda' of the labels: lambda (MixUp), area-adjusted (CutMix)
  // CutMix's box, pasted from the previous image: rows [y1, y2), columns [x1, x2).
  int64_t x1 = 0, y1 = 0, x2 = 0, y2 = 0;
};

// A label that is not a class of the transform; row is its place in the batch.
class LabelOutOfRange : public InvalidArgument {
 public:
  LabelOutOfRange(uint64_t row, int64_t label, int64_t num_classes, const std::string& who);
  uint64_t row() const { return row_; }
  int64_t label() const { return label_; }

 private:
  uint64_t row_;
  int64_t label_;
};

class BatchTransform {
 public:
  // The fields of a source that the transform reads: indices into its fields().
  struct Fields {
    size_t image = 0;
    size_t label = 0;
  };
  static constexpr const char* kSoftLabelField = "soft_label";

  BatchTransform(std::vector<BatchMix> choices, int64_t num_classes, ImageLayout layout);

  const std::vector<BatchMix>& choices() const { return choices_; }
  int64_t num_classes() const { return num_classes_; }
  ImageLayout layout() const { return layout_; }
  // "MixUp(alpha=0.8, num_classes=10)", or "RandomChoice([...], p=[...])", for messages.
  std::string describe() const;

  // The image and label fields of a source with these fields (InvalidArgument otherwise).
  Fields check(const std::vector<FieldSpec>& fields) const;
  // The field the transform adds to every batch: "soft_label", float32 [num_classes].
  FieldSpec soft_label_field() const;

  // The parameters of the batch keyed by (seed, epoch, batch_key), for images of height x width.
  // REQUIRES: height, width >= 1.
  BatchMixParams draw(uint64_t seed, uint64_t epoch, uint64_t batch_key, int64_t height,
                      int64_t width) const;

  // Applies `params` to one batch: `image` ([length, image shape], mixed in place), `label`
  // (int64 [length]) into `soft_label` (float32 [length, num_classes]). REQUIRES: image and
  // label as check() accepts them, equal lengths >= 1, params drawn for this image size.
  void apply(const BatchMixParams& params, const BatchField& image, const BatchField& label,
             const BatchField& soft_label) const;

 private:
  std::vector<BatchMix> choices_;
  int64_t num_classes_;
  ImageLayout layout_;
  double total_weight_ = 0;
};

}  // namespace stoker
