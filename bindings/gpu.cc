// The GPU wing (stoker._native.gpu).
//
// GPU support for the Python front: the fences a pinned batch buffer gets when its last exported
// array dies, and the CUDA driver figures the front needs.
//
// Fences on export. A pinned batch handed to torch can be the source of a copy that is queued but
// not done when its last tensor dies (`x = x.to("cuda", non_blocking=True)` drops the CPU tensor
// at once). The capsule that owns a batch calls fence_released_buffer() from its destructor (with
// the GIL): it asks the Python front's fence provider (stoker/gpu/feed.py) which streams may
// still read the buffer, records a CUDA event on each, and adds them to the buffer's pool as
// fences (stoker/batch_pool.h), so the pool hands the buffer out again only when they have
// completed. The provider is registered only when CUDA is in use; without it this costs a pointer
// check.
//
// GPU JPEG decode for the Python front (stoker/gpu/decode.py): the staging source the loader's
// workers run, and the GPU stage the copy stage calls once per batch. The decode logic lives in
// src/gpu/; this file converts arguments and releases the GIL.
//
// Test doubles are not here: the testing module (testing.cc) adds fake fences and pageable
// fencing through set_fence_test_hooks, and a GpuBatchDecoder on the CPU emulation.
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "bindings.h"
#include "stoker/cuda/cuda.h"
#include "stoker/gpu/decode.h"
#include "stoker/batch_pool.h"
#include "stoker/errors.h"
#include "stoker/sources/image_files.h"

namespace stoker::python {
namespace {

// The front's fence provider: provider(active CUDA devices) -> iterable of (device, stream handle)
// pairs, or of the testing module's fakes (test_hooks turns those into fences). A strong
// reference, until set_fence_provider(None) (the front does that at exit, before modules are torn
// down).
PyObject* fence_provider = nullptr;
const FenceTestHooks* test_hooks = nullptr;  // null but in a STOKER_TESTING build's tests

void add_fences(BatchPool& pool, const std::byte* buffer, const std::vector<int>& devices) {
  nb::object items = nb::borrow(fence_provider)(devices);
  for (nb::handle item : items) {
    std::unique_ptr<Fence> fake =
        test_hooks && test_hooks->make_fence ? test_hooks->make_fence(item) : nullptr;
    if (fake) {
      pool.add_fence(buffer, std::move(fake));
    } else {
      auto [device, stream] = nb::cast<std::pair<int, uint64_t>>(item);
      pool.add_fence(buffer, cuda::record_fence(device, static_cast<uintptr_t>(stream)));
    }
  }
}

using image::gpu::GpuBatchDecoder;
using image::gpu::GpuDecodeSource;
using image::gpu::Route;
using HostArray = nb::ndarray<nb::device::cpu, nb::c_contig>;

OnError parse_on_error(const std::string& s) {
  if (s == "raise") return OnError::kRaise;
  if (s == "skip") return OnError::kSkip;
  throw InvalidArgument("on_error must be \"raise\" or \"skip\", got \"" + s + "\"");
}

const char* dtype_name(image::DType d) {
  switch (d) {
    case image::DType::kUInt8:
      return "uint8";
    case image::DType::kFloat32:
      return "float32";
    case image::DType::kFloat16:
      return "float16";
    case image::DType::kBFloat16:
      return "bfloat16";
  }
  return "?";
}

nb::dict stats_dict(const image::gpu::GpuDecodeStats& s) {
  nb::dict routes;
  for (int r = 0; r < image::gpu::kNumRoutes; ++r)
    if (s.routes[r] > 0) routes[image::gpu::route_name(Route(r))] = s.routes[r];
  nb::dict d;
  d["backend"] = s.backend;
  d["batches"] = s.batches;
  d["routes"] = routes;
  d["hardware_samples"] = s.hardware_samples;
  d["skipped"] = s.skipped;
  d["skipped_samples"] = s.skipped_samples;
  d["chunks"] = s.chunks;
  d["device_bytes"] = s.device_bytes;
  d["device_bytes_peak"] = s.device_bytes_peak;
  d["pinned_bytes"] = s.pinned_bytes;
  d["host_seconds"] = s.host_seconds;
  return d;
}

void decode_batch(GpuBatchDecoder& dec, HostArray payload, HostArray labels, HostArray records,
                  uint64_t images, uint64_t out_labels, uint64_t stream) {
  const size_t n = labels.size();
  const GpuDecodeSource& src = dec.source();
  if (payload.nbytes() != n * src.payload_bytes() ||
      records.nbytes() != n * sizeof(image::gpu::StagedSample) ||
      labels.nbytes() != n * sizeof(int64_t))
    throw InvalidArgument("GpuBatchDecoder.decode: not a batch of this dataset's staging source");
  image::gpu::StagedBatch b{n, static_cast<std::byte*>(payload.data()),
                            static_cast<int64_t*>(labels.data()),
                            static_cast<image::gpu::StagedSample*>(records.data())};
  nb::gil_scoped_release release;
  dec.decode(b, reinterpret_cast<std::byte*>(images), reinterpret_cast<std::byte*>(out_labels),
             static_cast<uintptr_t>(stream));
}

}  // namespace

void set_fence_test_hooks(const FenceTestHooks* hooks) { test_hooks = hooks; }

void fence_released_buffer(BatchPool& pool, const std::byte* buffer) {
  if (fence_provider == nullptr) return;
  if (pool.kind() != MemoryKind::kPinned && !(test_hooks && test_hooks->pageable)) return;
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
  m.attr("DEFAULT_DECODE_BUFFER_BYTES") = image::gpu::GpuDecodeOptions{}.decode_buffer_bytes;
  m.def("cuda_available", &cuda_available, "True when a CUDA driver and device are present.");

  m.def(
      "set_fence_provider",
      [](nb::object provider) {
        Py_XDECREF(fence_provider);
        fence_provider = provider.is_none() ? nullptr : provider.release().ptr();
      },
      nb::arg("provider").none(),
      "Registers provider(devices) -> [(device, stream handle), ...], called (with the GIL) when "
      "the last array of a pinned batch dies: a fence is recorded for each item, and the buffer "
      "is reused only once all have completed. None unregisters.");

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

  nb::class_<GpuDecodeSource, Source>(m, "GpuDecodeSource")
      .def(nb::new_([](std::shared_ptr<ImageFiles> files, const nb::list& spec, uint64_t max_pixels,
                       uint64_t file_bytes, uint64_t decode_buffer_bytes) {
             image::gpu::GpuDecodeOptions o;
             o.max_pixels = max_pixels;
             o.file_bytes = static_cast<size_t>(file_bytes);
             o.decode_buffer_bytes = decode_buffer_bytes;
             return std::make_shared<GpuDecodeSource>(std::move(files), parse_transforms(spec), o);
           }),
           nb::arg("files"), nb::arg("pipeline"), nb::arg("max_pixels"), nb::arg("file_bytes"),
           nb::arg("decode_buffer_bytes"))
      .def_prop_ro("output_shape",
                   [](const GpuDecodeSource& s) {
                     const auto a = s.output_shape();
                     return std::vector<int64_t>(a.begin(), a.end());
                   })
      .def_prop_ro("output_dtype", [](const GpuDecodeSource& s) { return dtype_name(s.dtype()); })
      .def_prop_ro("payload_bytes", &GpuDecodeSource::payload_bytes)
      .def_prop_ro("decode_buffer_bytes",
                   [](const GpuDecodeSource& s) { return s.options().decode_buffer_bytes; });

  nb::class_<GpuBatchDecoder>(m, "GpuBatchDecoder",
                              "The GPU stage of decode=\"cuda\": one call per staged batch.")
      .def(
          "__init__",
          [](GpuBatchDecoder* self, std::shared_ptr<GpuDecodeSource> source, int device,
             const std::string& on_error, const std::vector<std::string>& library_dirs) {
            const OnError e = parse_on_error(on_error);
            const image::gpu::DecodeDevice d{device, library_dirs};
            nb::gil_scoped_release release;  // NVRTC compiles for about a second
            new (self) GpuBatchDecoder(std::move(source), d, e);
          },
          nb::arg("source"), nb::arg("device"), nb::arg("on_error"), nb::arg("library_dirs"))
      .def("decode", &decode_batch, nb::arg("payload"), nb::arg("labels"), nb::arg("records"),
           nb::arg("images"), nb::arg("out_labels"), nb::arg("stream"),
           "Queues the batch's decode on `stream` into the device addresses images/out_labels.")
      .def("stats", [](const GpuBatchDecoder& d) { return stats_dict(d.stats()); });

  m.def(
      "gpu_decode_libraries",
      [](const std::vector<std::string>& dirs) {
        nb::gil_scoped_release release;
        return image::gpu::find_gpu_decode_libraries(dirs);
      },
      nb::arg("library_dirs"),
      "(libnvjpeg path, libnvrtc path); RuntimeError saying what is missing and what was tried.");
}

}  // namespace stoker::python
