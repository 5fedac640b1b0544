// TEST-ONLY: a GpuBatchDecoder whose device is emulated on the CPU, so that the GPU stage's logic
// (chunks, descriptors, fallbacks, errors, replacement) runs without a GPU. Built only for the C++
// tests and the testing module (STOKER_TESTING), in its own library (stoker_gpu_emulation, from
// src/gpu/emulated_backend.cc): never in a wheel, and no production code may include it.
//
// "Device" memory is host memory: decode()'s images and labels are host addresses, and its stream
// is ignored. JPEGs are decoded by libjpeg and the kernels' own thread functions render on the
// host. The decoder's stats name the backend "emulated".
//
// Thread safety: as GpuBatchDecoder (one thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "stoker/gpu/decode.h"

namespace stoker::image::gpu {

// `reject` lists sample indices whose "GPU" decode fails (a GPU decoder refusing a file the CPU
// takes), which then go to the CPU path as on a device.
std::unique_ptr<GpuBatchDecoder> make_emulated_decoder(
    std::shared_ptr<const GpuDecodeSource> source, OnError on_error,
    std::vector<uint64_t> reject = {});

}  // namespace stoker::image::gpu
