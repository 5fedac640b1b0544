// GPU support for the Python front: the fences a pinned batch buffer gets when its last exported
// array dies, the CUDA driver figures the front needs, and the GPU sampler of stoker.diagnose.
//
// Fences on export. A pinned batch handed to torch can be the source of a copy that is queued but
// not done when its last tensor dies (`x = x.to("cuda", non_blocking=True)` drops the CPU tensor
// at once). The capsule that owns a batch calls fence_released_buffer() from its destructor (with
// the GIL): it asks the Python front's fence provider (stoker/device.py) which streams may still
// read the buffer, records a CUDA event on each, and adds them to the buffer's pool as fences
// (batch_pool.h), so the pool hands the buffer out again only when they have completed. The
// provider is registered only when CUDA is in use; without it this costs a pointer check.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <cstring>
#include <memory>

#include "bindings.h"
#include "stoker/batch_pool.h"
#include "gpu/cuda.h"
#include "stoker/diagnosis.h"
#include "stoker/errors.h"

namespace stoker::python {
namespace {

// A fence whose completion a test controls. With a source and a destination it is a copy of a
// fake copy engine: complete() copies the bytes first, as a DMA that runs late reads the buffer
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

// The front's fence provider: provider(active CUDA devices) -> iterable of (device, stream handle)
// pairs or FakeCopy objects. A strong reference, until set_fence_provider(None) (the front does
// that at exit, before modules are torn down).
PyObject* fence_provider = nullptr;
bool fence_pageable = false;  // tests: fence pageable buffers too

void add_fences(BatchPool& pool, const std::byte* buffer, const std::vector<int>& devices) {
  nb::object items = nb::borrow(fence_provider)(devices);
  for (nb::handle item : items) {
    if (nb::isinstance<FakeCopy>(item)) {
      pool.add_fence(buffer, std::make_unique<FakeCopyFence>(nb::cast<FakeCopy&>(item).state));
    } else {
      auto [device, stream] = nb::cast<std::pair<int, uint64_t>>(item);
      pool.add_fence(buffer, cuda::record_fence(device, static_cast<uintptr_t>(stream)));
    }
  }
}

}  // namespace

void fence_released_buffer(BatchPool& pool, const std::byte* buffer) {
  if (fence_provider == nullptr) return;
  if (pool.kind() != MemoryKind::kPinned && !fence_pageable) return;
  nb::error_scope keep;  // an exception may be on its way out through the dying tensor
  const std::vector<int> devices = cuda::active_devices();
  bool fenced = false;
  try {
    add_fences(pool, buffer, devices);
    fenced = true;
  } catch (nb::python_error& e) {
    e.discard_as_unraisable("stoker: the fence provider of a pinned batch buffer");
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    PyErr_WriteUnraisable(nullptr);
  }
  if (fenced) return;
  // No fence could be recorded: the buffer must still not be rewritten while a copy may read it.
  // Wait for every device in use (slow, but only on this error path).
  for (int d : devices) {
    try {
      cuda::synchronize(d);
    } catch (const std::exception&) {
      // The context is dead: nothing runs on it any more.
    }
  }
}

void fence_released_batch(const Batch& batch) {
  if (fence_provider == nullptr || !batch.buffer) return;
  if (std::shared_ptr<BatchPool> pool = BatchPool::owner(batch.buffer))
    fence_released_buffer(*pool, batch.buffer.get());
}

void register_gpu(nb::module_& m) {
  m.def(
      "set_fence_provider",
      [](nb::object provider, bool pageable) {
        Py_XDECREF(fence_provider);
        fence_provider = provider.is_none() ? nullptr : provider.release().ptr();
        fence_pageable = fence_provider != nullptr && pageable;
      },
      nb::arg("provider").none(), nb::arg("pageable") = false,
      "Registers provider(devices) -> [(device, stream handle) | FakeCopy, ...], called (with the "
      "GIL) when the last array of a pinned batch dies: a fence is recorded for each item, and "
      "the buffer is reused only once all have completed. pageable=True (tests) fences pageable "
      "batches too. None unregisters.");

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

  m.def("cuda_device_count", &cuda::device_count);
  m.def("cuda_set_host_device", &cuda::set_host_device, nb::arg("device"),
        "The device whose primary context pins host memory (a loader's device=\"cuda:N\").");
  m.def("cuda_pinned_bytes", &cuda::pinned_bytes,
        "Bytes this process holds page-locked through Stoker (every pool).");
  m.def("cuda_active_devices", &cuda::active_devices);
  m.def(
      "cuda_device_memory",
      [](int device) {
        cuda::DeviceMemory mem = cuda::device_memory(device);
        return nb::make_tuple(mem.free, mem.total);
      },
      nb::arg("device"), "(free, total) bytes of a device in use.");

  nb::class_<GpuSampler>(m, "GpuSampler",
                         "Samples a GPU's utilization and memory through NVML on a thread until "
                         "stop(), which returns the figures.")
      .def(
          "__init__",
          [](GpuSampler* self, int cuda_device, int period_ms) {
            new (self)
                GpuSampler(GpuSampler::nvml(cuda_device), std::chrono::milliseconds(period_ms));
          },
          nb::arg("cuda_device"), nb::arg("period_ms") = 100)
      .def("stop", [](GpuSampler& s) {
        GpuFigures f;
        {
          nb::gil_scoped_release release;  // joins the sampling thread
          f = s.stop();
        }
        nb::dict d;
        d["gpu_present"] = f.present;
        d["gpu_samples"] = f.samples;
        d["gpu_utilization"] = f.utilization;
        d["gpu_memory_used"] = f.memory_used;
        d["gpu_memory_total"] = f.memory_total;
        return d;
      });
}

}  // namespace stoker::python
