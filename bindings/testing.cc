// The testing wing (stoker._native.testing): test doubles and benchmark helpers, compiled only
// with STOKER_TESTING=ON (never in a plain wheel). Production code knows none of these types: the
// fence provider turns what it does not recognize into fences through the test hooks this module
// installs (set_fence_test_hooks: FakeCopy, pageable fencing), and the emulated GPU decoder is a
// production GpuBatchDecoder on the test-only CPU backend (stoker/gpu/emulated.h).
//
// Also here: bindings of production functions that only tests and bench/ call, as oracles
// (position_key, random_resized_crop_box, classify_jpeg), and the decode-only throughput bound of
// the benchmark (stoker/image/decode_only.h: the binding reads the files and translates).
#include <nanobind/stl/pair.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstring>
#include <memory>

#include "bindings.h"
#include "stoker/pydata/sample_fetcher.h"
#include "stoker/testing/faulty.h"
#include "stoker/testing/test_documents.h"
#include "stoker/errors.h"
#include "stoker/fence.h"
#include "stoker/gpu/decode.h"
#include "stoker/gpu/emulated.h"
#include "stoker/image/decode.h"
#include "stoker/image/decode_only.h"
#include "stoker/image/pipeline.h"
#include "stoker/random.h"

namespace stoker::python {
namespace {

// A fence whose completion a test controls. With a source and a destination it is a copy of a
// fake copy stage: complete() copies the bytes first, as a DMA that runs late reads the buffer
// only when it runs. A pool destroyed while it is pending drops it (wait() copies nothing: the
// destination may be gone).
struct FakeCopyState {
  std::atomic<bool> done{false};
  std::atomic<int> polls{0};
  uintptr_t src = 0, dst = 0;
  size_t bytes = 0;
};

class FakeCopyFence final : public Fence {
 public:
  explicit FakeCopyFence(std::shared_ptr<FakeCopyState> s) : s_(std::move(s)) {}
  bool completed() override {
    ++s_->polls;
    return s_->done;
  }
  void wait() override { s_->done = true; }

 private:
  std::shared_ptr<FakeCopyState> s_;
};

struct FakeCopy {
  std::shared_ptr<FakeCopyState> state = std::make_shared<FakeCopyState>();
  void complete() {
    if (state->done) return;
    if (state->bytes > 0)
      std::memcpy(reinterpret_cast<void*>(state->dst), reinterpret_cast<const void*>(state->src),
                  state->bytes);
    state->done = true;
  }
};

std::unique_ptr<Fence> fake_fence(nb::handle item) {
  if (!nb::isinstance<FakeCopy>(item)) return nullptr;
  return std::make_unique<FakeCopyFence>(nb::cast<FakeCopy&>(item).state);
}

FenceTestHooks fence_hooks{&fake_fence, false};

nb::dict decode_only(const std::vector<std::string>& paths, int threads, double min_seconds) {
  image::DecodeOnly r;
  {
    nb::gil_scoped_release release;
    std::vector<std::vector<std::byte>> files;
    files.reserve(paths.size());
    for (const auto& p : paths) files.push_back(read_whole_file(p));
    r = image::decode_only(files, threads, min_seconds);
  }
  nb::dict d;
  d["images"] = r.images;
  d["failures"] = r.failures;
  d["seconds"] = r.seconds;
  d["threads"] = threads;
  d["images_per_s"] = r.seconds > 0 ? r.images / r.seconds : 0.0;
  d["megapixels_per_s"] = r.seconds > 0 ? r.pixels / r.seconds / 1e6 : 0.0;
  return d;
}

}  // namespace

void register_testing(nb::module_& m) {
  set_fence_test_hooks(&fence_hooks);
  nb::class_<FakeCopy>(m, "FakeCopy",
                       "A fence for tests that completes when complete() is called; given "
                       "addresses, complete() first copies nbytes from src to dst (a fake DMA).")
      .def(
          "__init__",
          [](FakeCopy* self, uint64_t src, uint64_t dst, uint64_t nbytes) {
            new (self) FakeCopy();
            self->state->src = static_cast<uintptr_t>(src);
            self->state->dst = static_cast<uintptr_t>(dst);
            self->state->bytes = static_cast<size_t>(nbytes);
          },
          nb::arg("src") = 0, nb::arg("dst") = 0, nb::arg("nbytes") = 0)
      .def("complete", &FakeCopy::complete)
      .def_prop_ro("completed", [](const FakeCopy& f) { return f.state->done.load(); })
      .def_prop_ro("polls", [](const FakeCopy& f) { return f.state->polls.load(); });

  m.def(
      "fence_pageable_buffers", [](bool on) { fence_hooks.pageable = on; }, nb::arg("on"),
      "on=True: the fence provider fences pageable batches too, so the recycling protocol runs "
      "without CUDA; False: pinned ones only, as in the product.");

  m.def(
      "emulated_gpu_decoder",
      [](std::shared_ptr<image::gpu::GpuDecodeSource> source, bool skip,
         std::vector<uint64_t> reject) {
        return image::gpu::make_emulated_decoder(
            std::move(source), skip ? OnError::kSkip : OnError::kRaise, std::move(reject));
      },
      nb::arg("source"), nb::arg("skip") = false, nb::arg("reject") = std::vector<uint64_t>{},
      "A gpu.GpuBatchDecoder whose device is emulated on the CPU: images/labels are host "
      "addresses, the stream is ignored. skip: on_error=\"skip\" (else \"raise\"); `reject`: "
      "sample indices whose \"GPU\" decode fails.");

  nb::class_<FaultySource, Source>(m, "FaultySource")
      .def(nb::new_([](uint64_t size, int64_t width, std::set<uint64_t> fail, int64_t delay_us,
                       std::vector<uint64_t> shards) {
             return std::make_shared<FaultySource>(size, width, std::move(fail), delay_us,
                                                   std::move(shards));
           }),
           nb::arg("size"), nb::arg("width") = 1, nb::arg("fail") = std::set<uint64_t>{},
           nb::arg("delay_us") = 0, nb::arg("shards") = std::vector<uint64_t>{},
           "Sample i holds i; `shards` (sizes): it declares its samples in those shards, as a "
           "remote source does (shuffle=\"shards\").");

  nb::class_<stoker::testing::VectorDocuments, DocumentSet>(
      m, "VectorDocuments", "A DocumentSet over documents held in memory (lists of token ids).")
      .def(nb::new_([](std::vector<std::vector<int64_t>> documents) {
             return std::make_shared<stoker::testing::VectorDocuments>(std::move(documents));
           }),
           nb::arg("documents"));

  m.def("decode_only", &decode_only, nb::arg("paths"), nb::arg("threads"), nb::arg("min_seconds"),
        "Decode-only throughput bound: every file in memory, full-size decodes on `threads` "
        "threads for at least min_seconds.");

  m.def("position_key", &position_key, nb::arg("seed"), nb::arg("epoch"), nb::arg("batch"),
        nb::arg("row"), "The key of a sample fetched by a non-integer index, from its place.");

  m.def(
      "random_resized_crop_box",
      [](int height, int width, std::pair<int, int> size, std::pair<double, double> scale,
         std::pair<double, double> ratio, uint64_t seed, uint64_t epoch, uint64_t index) {
        SampleRng rng(seed, epoch, index);
        const image::CropBox b = image::random_resized_crop_params(
            height, width, image::RandomResizedCrop(size.first, size.second, scale, ratio), rng);
        return std::make_tuple(b.top, b.left, b.height, b.width);
      },
      nb::arg("height"), nb::arg("width"), nb::arg("size"), nb::arg("scale"), nb::arg("ratio"),
      nb::arg("seed"), nb::arg("epoch"), nb::arg("index"),
      "(top, left, height, width) that RandomResizedCrop draws for sample `index` of `epoch` "
      "when it is the pipeline's first random transform.");

  m.def(
      "classify_jpeg",
      [](nb::bytes data) {
        return image::gpu::route_name(
            image::gpu::classify_jpeg({static_cast<const std::byte*>(data.data()), data.size()}));
      },
      nb::arg("data"), "Where GPU decode sends this file: \"gpu\", or why not.");

  register_testing_image_ops(m);
}

}  // namespace stoker::python
