// Registration functions of the Python extension, one per subsystem (see module.cc).
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

#include "stoker/batch_pool.h"
#include "stoker/image/transforms.h"
#include "stoker/loader.h"

namespace stoker::python {

namespace nb = nanobind;

void register_errors(nb::module_& m);
void register_sources(nb::module_& m);
void register_loader(nb::module_& m);
void register_images(nb::module_& m);
void register_tune(nb::module_& m);
void register_order(nb::module_& m);
void register_workers(nb::module_& m);
void register_seeding(nb::module_& m);
void register_gpu(nb::module_& m);
void register_stratified(nb::module_& m);
void register_gpu_decode(nb::module_& m);

// A pipeline spec (the private list of tuples stoker/transforms.py writes) as transforms
// (images.cc). Throws InvalidArgument for an unknown or invalid transform.
std::vector<image::Transform> parse_transforms(const nb::list& spec);

// For the destructor of a capsule that owns exported batch memory (GIL held): records the fences
// a pinned buffer needs before its pool may reuse it (gpu.cc). Call it before dropping the last
// reference to the buffer.
void fence_released_buffer(BatchPool& pool, const std::byte* buffer);
void fence_released_batch(const Batch& batch);

}  // namespace stoker::python
