// Registration functions of the Python extension, one per wing of src/, each filling the
// submodule stoker._native.<wing> (see module.cc).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "stoker/batch_pool.h"
#include "stoker/fence.h"
#include "stoker/image/pipeline.h"
#include "stoker/image/transforms.h"
#include "stoker/engine.h"

namespace stoker::python {

namespace nb = nanobind;

void register_errors(nb::module_& m);  // the exception translator, for the whole module
void register_engine(nb::module_& m);
void register_budget(nb::module_& m);  // into the engine's submodule (budget.cc)
void register_sources(nb::module_& m);
void register_image(nb::module_& m);
void register_gpu(nb::module_& m);
void register_tuning(nb::module_& m);
void register_pydata(nb::module_& m);
void register_remote(nb::module_& m);
void register_build_info(nb::module_& m);  // build_info(): for `stoker info`
// Test doubles and benchmark helpers: only with STOKER_TESTING=ON (testing.cc).
void register_testing(nb::module_& m);
// image_op: the image-stage kernels on arrays, for tests (testing_image_ops.cc).
void register_testing_image_ops(nb::module_& m);

// A pipeline spec (the private list of tuples the transforms' _specs() write, stoker/transforms/)
// as transforms (image.cc). Throws InvalidArgument for an unknown or invalid transform.
std::vector<image::Transform> parse_transforms(const nb::list& spec);
// "drop" or "white" as image::Alpha (image.cc). Throws InvalidArgument for anything else.
image::Alpha parse_alpha(const std::string& alpha);
// The pipeline of such a spec (image.cc).
std::shared_ptr<const image::ImagePipeline> make_pipeline(const nb::list& spec, uint64_t max_pixels,
                                                          image::Alpha alpha = image::Alpha::kDrop);

// A vector as a NumPy uint64 array that owns it, no copy (engine.cc).
nb::ndarray<nb::numpy, uint64_t, nb::ndim<1>> to_array(std::vector<uint64_t> values);

// A whole file's bytes (image.cc).
std::vector<std::byte> read_whole_file(const std::string& path);

// The fences' one seam for tests (gpu.cc): set only by the testing module (testing.cc), so a
// wheel, which has no testing module, never has one. Production code knows no fake fence.
struct FenceTestHooks {
  // Turns an item of the fence provider's list into a fence (testing.FakeCopy), or returns nullptr
  // when the item is not one it makes (then the item must be a (device, stream handle) pair).
  std::unique_ptr<Fence> (*make_fence)(nb::handle item) = nullptr;
  // Fence pageable buffers too, so that the recycling protocol runs without CUDA.
  bool pageable = false;
};
void set_fence_test_hooks(const FenceTestHooks* hooks);

// For the destructor of a capsule that owns exported batch memory (GIL held): records the fences
// a pinned buffer needs before its pool may reuse it (gpu.cc). Call it before dropping the last
// reference to the buffer.
void fence_released_buffer(BatchPool& pool, const std::byte* buffer);
void fence_released_batch(const Batch& batch);

}  // namespace stoker::python
