// Internal: what the GPU stage (batch_decoder.cc) asks of a device. The product's one
// implementation is nvJPEG + NVRTC kernels on a CUDA device (nvjpeg_backend.cc); the tests add an
// emulation on the CPU that runs the kernels' own code (emulated_backend.h, never in a wheel), so
// that the stage's logic is tested without a GPU.
//
// One batch is begin(stream) ... end(); everything in between is queued on that stream in call
// order. Pointers called "device" are device memory for nvJPEG, host memory for the emulation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "render.h"

namespace stoker::image::gpu {

struct JpegJob {
  uint64_t index = 0;               // the sample (the emulation rejects chosen indices)
  const std::byte* data = nullptr;  // host (the staged batch's pinned payload slot)
  size_t bytes = 0;
  uint8_t* dst = nullptr;  // device: height rows of `pitch` bytes, interleaved RGB
  int pitch = 0, width = 0, height = 0;
};

class DecodeBackend {
 public:
  virtual ~DecodeBackend() = default;
  virtual std::string name() const = 0;

  // Device memory for the output table: uploaded once, lives as long as the backend.
  virtual const uint8_t* upload_table(const std::vector<std::byte>& table) = 0;

  // Starts a batch on `stream`. When it throws, it leaves nothing held (no context current):
  // end() is then not called.
  virtual void begin(uintptr_t stream) = 0;
  // Device memory of at least `bytes`, reused by every chunk (the stream orders the reuse).
  // Grows when asked for more; never shrinks.
  virtual uint8_t* arena(size_t bytes) = 0;
  // Host memory of `bytes` for this batch's descriptors, not reused before the batch's queued
  // copies from it are done.
  virtual std::byte* host_staging(size_t bytes) = 0;
  // Queues a host-to-device copy (from host_staging or the pinned batch).
  virtual void upload(void* device_dst, const void* host_src, size_t bytes) = 0;
  // Decodes the jobs; ok[i] = 0 when job i failed. On return nothing queued reads a failed job's
  // data. `hardware` counts the jobs the hardware decoder took. Called once per chunk: decoder
  // state a call shares with the previous chunk's is reused only once that chunk's work is done.
  virtual void decode(std::span<const JpegJob> jobs, std::vector<uint8_t>& ok,
                      uint64_t* hardware) = 0;
  // The coefficient, horizontal and vertical kernels over p.n samples (max_rows: the most
  // horizontal-pass rows of one sample; 0 when every sample is pixels).
  virtual void render(const internal::k::KParams& p, int32_t max_rows) = 0;
  // Ends the batch (also when decode() throws): host staging may be reused once the stream has
  // passed this point.
  virtual void end() = 0;

  virtual uint64_t device_bytes() const = 0;
  virtual uint64_t pinned_bytes() const = 0;
};

}  // namespace stoker::image::gpu
