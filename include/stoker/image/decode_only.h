// BENCHMARK-ONLY: the decode-only throughput bound of bench/bench_images.py, what the CPU image
// path cannot beat: full-size decodes of files held in memory, no resize, no transform, no batch.
// Built only with the C++ tests or STOKER_TESTING (stoker_image_bench; from Python:
// stoker._native.testing.decode_only): never in a wheel.
//
// On `threads` threads, each with its own Decoder (as a loader's worker has), the files are
// decoded in turn, in whole passes over them, until at least `min_seconds` have passed.
//
// Thread safety: a free function; it runs its own threads and returns when they are joined.
// Errors: InvalidArgument for threads < 1 or no files; a file that fails to decode is counted
// (failures), not thrown.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace stoker::image {

struct DecodeOnly {
  uint64_t images = 0;    // decoded
  uint64_t pixels = 0;    // of the decoded images
  uint64_t failures = 0;  // decodes that threw DecodeError
  double seconds = 0;     // wall time
};

DecodeOnly decode_only(const std::vector<std::vector<std::byte>>& files, int threads,
                       double min_seconds);

}  // namespace stoker::image
