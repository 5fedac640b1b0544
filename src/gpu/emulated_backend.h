// Test double: the GPU stage's device (backend.h) emulated on the CPU, so that the stage's logic is
// tested without a GPU. Built only for the C++ tests and the testing module (STOKER_TESTING), in
// its own library (stoker_gpu_emulation): never in a wheel. The stage's tests use the backend
// itself; the testing module gets a whole decoder through the public test-only header
// stoker/gpu/emulated.h.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gpu/backend.h"

namespace stoker::image::gpu {

// "Device" memory is host memory, streams are ignored, JPEGs are decoded by libjpeg, and the
// kernels' own thread functions (kernels.h) render on the host. `reject` lists sample indices
// whose decode it reports as failed (a GPU decoder refusing a file the CPU takes). Its stats name
// the backend "emulated".
std::unique_ptr<DecodeBackend> make_emulated_backend(std::vector<uint64_t> reject = {});

}  // namespace stoker::image::gpu
