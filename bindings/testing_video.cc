// stoker._video.testing: the video wing's benchmark helpers, compiled only with STOKER_TESTING=ON
// (never in a plain wheel), as stoker._native.testing is for the rest.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "stoker/ffmpeg/decode_bound.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace stoker::python {

void register_video_testing(nb::module_& m) {
  m.def(
      "decode_bound",
      [](const std::vector<std::tuple<std::string, uint64_t, uint64_t>>& jobs, int threads,
         int decoder_threads) {
        std::vector<video::DecodeJob> js;
        js.reserve(jobs.size());
        for (const auto& [path, first, last] : jobs) js.push_back({path, first, last});
        video::DecodeBound b;
        {
          nb::gil_scoped_release release;
          b = video::decode_bound(js, threads, decoder_threads);
        }
        return std::make_tuple(b.seconds, b.frames);
      },
      "jobs"_a, "threads"_a, "decoder_threads"_a = 1,
      "(seconds, frames decoded) of decoding each (path, first, last) from its keyframe, every "
      "frame, on `threads` threads: the bound of bench/bench_video.py (stoker/ffmpeg/"
      "decode_bound.h).");
}

}  // namespace stoker::python
