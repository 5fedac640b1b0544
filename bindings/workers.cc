// What the Python-dataset front (python/stoker/) needs from the engine, besides seeding
// (seeding.cc): the epoch's batch order (so a Python dataset visits samples exactly as a native one
// does), the column check of a batch's samples, the batch buffers in shared memory, and the
// constants the front must not write again. The engine code is in src/pydata/.
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

#include "bindings.h"
#include "pydata/column_gatherer.h"
#include "pydata/shared_pool.h"
#include "stoker/errors.h"
#include "stoker/image/decode.h"
#include "stoker/loader.h"
#include "engine/shared_arena.h"

namespace stoker::python {
namespace {

// One uint8 array over `bytes` at `data`, owned by `owner` (a capsule keeping the memory alive).
nb::object byte_array(std::byte* data, size_t bytes, nb::handle owner, bool torch) {
  size_t shape[1] = {bytes};
  auto* p = reinterpret_cast<uint8_t*>(data);
  if (torch) return nb::ndarray<nb::pytorch, uint8_t>(p, 1, shape, owner).cast();
  return nb::ndarray<nb::numpy, uint8_t>(p, 1, shape, owner).cast();
}

// One uint8 array per (offset, nbytes) region of the lease's buffer; all share one owner that
// returns the buffer to the pool when the last of them dies.
nb::list lease_views(const SharedPool& pool, const Lease& lease,
                     const std::vector<std::pair<size_t, size_t>>& regions, bool torch) {
  for (const auto& [offset, bytes] : regions)
    if (offset > pool.pool().buffer_bytes() || bytes > pool.pool().buffer_bytes() - offset)
      throw InvalidArgument("region outside the batch buffer");
  // The owner of the views: when the last of them dies, a pinned buffer is fenced on the streams
  // that may still copy from it (gpu.cc) before it can return to the pool.
  struct Owner {
    Buffer buffer;
    std::shared_ptr<BatchPool> pool;
  };
  nb::capsule owner(new Owner{lease.buffer, pool.shared_pool()}, [](void* p) noexcept {
    auto* o = static_cast<Owner*>(p);
    fence_released_buffer(*o->pool, o->buffer.get());
    delete o;
  });
  nb::list out;
  for (const auto& [offset, bytes] : regions)
    out.append(byte_array(lease.buffer.get() + offset, bytes, owner, torch));
  return out;
}

// The whole arena as one writable uint8 array (what a worker writes batches into).
nb::object arena_array(const std::shared_ptr<SharedArena>& arena, bool torch) {
  nb::capsule owner(new std::shared_ptr<SharedArena>(arena),
                    [](void* p) noexcept { delete static_cast<std::shared_ptr<SharedArena>*>(p); });
  return byte_array(arena->base(), arena->size(), owner, torch);
}

}  // namespace

void register_workers(nb::module_& m) {
  // Batches are exported zero-copy: a tensor the program still holds at exit may outlive this
  // module's teardown (torch frees it later). That is not a leak of the bindings.
  nb::set_leak_warnings(false);
  m.attr("MAX_WORKERS") = kMaxWorkers;
  m.attr("MAX_PREFETCH_FACTOR") = kMaxPrefetchFactor;
  m.attr("DEFAULT_MAX_PIXELS") = image::kDefaultMaxPixels;
  m.attr("LEAF_ALIGNMENT") = kLeafAlignment;

  m.def(
      "gather_columns",
      [](nb::handle structure, nb::handle samples, nb::handle array_types, nb::handle object_types,
         nb::handle np_dtypes) -> nb::object {
        try {
          return nb::steal(gather_columns(structure.ptr(), samples.ptr(), array_types.ptr(),
                                          object_types.ptr(), np_dtypes.ptr())
                               .release());
        } catch (const PythonError&) {
          throw nb::python_error();
        }
      },
      nb::arg("structure"), nb::arg("samples"), nb::arg("array_types"), nb::arg("object_types"),
      nb::arg("np_dtypes"),
      "(array columns, object columns) of a batch whose samples all have `structure` "
      "(batch_structure.flatten's tree of sample 0) with leaves of the same types, else None "
      "(src/pydata/column_gatherer.h).");

  nb::class_<SharedArena>(m, "SharedArena",
                          "Shared memory for batches: one memfd (include/stoker/shared_arena.h).")
      .def_static(
          "attach", [](int fd) { return SharedArena::attach(fd); }, nb::arg("fd"),
          "Maps the arena of another process's memfd `fd` (this arena owns and closes it).")
      .def_prop_ro("fd", &SharedArena::fd)
      .def_prop_ro("size", &SharedArena::size)
      .def(
          "array",
          [](const std::shared_ptr<SharedArena>& a, bool torch) { return arena_array(a, torch); },
          nb::arg("torch"), "The whole arena as one writable uint8 tensor (or NumPy array).")
      .def("drop_pages", &SharedArena::drop_pages, nb::arg("offset"), nb::arg("bytes"),
           "Drops this process's mapping of the whole pages in [offset, offset + bytes).");

  nb::class_<Lease>(m, "Lease").def_ro("offset", &Lease::offset);

  nb::class_<SharedPool>(m, "SharedPool",
                         "Batch buffers carved from a SharedArena (src/pydata/shared_pool.h).")
      .def(nb::init<size_t, size_t, bool>(), nb::arg("buffer_bytes"), nb::arg("budget_bytes"),
           nb::arg("pinned") = false)
      .def(
          "acquire",
          [](SharedPool& p, int64_t timeout_ms) {
            return p.acquire(std::chrono::milliseconds(timeout_ms));
          },
          nb::arg("timeout_ms"), nb::call_guard<nb::gil_scoped_release>(),
          "A free buffer, or None after timeout_ms milliseconds.")
      .def(
          "view",
          [](const SharedPool& p, const Lease& lease,
             const std::vector<std::pair<size_t, size_t>>& regions,
             bool torch) { return lease_views(p, lease, regions, torch); },
          nb::arg("lease"), nb::arg("regions"), nb::arg("torch"),
          "uint8 arrays over (offset, nbytes) regions of the lease's buffer, without a copy; "
          "the buffer returns to the pool when the last of them (and the lease) dies.")
      .def_prop_ro("arena", [](const SharedPool& p) { return p.arena(); })
      .def_prop_ro("buffer_bytes", [](const SharedPool& p) { return p.pool().buffer_bytes(); })
      .def_prop_ro("capacity", [](const SharedPool& p) { return p.pool().capacity(); })
      .def_prop_ro("bytes_allocated",
                   [](const SharedPool& p) { return p.pool().bytes_allocated(); })
      .def_prop_ro("peak_bytes_allocated",
                   [](const SharedPool& p) { return p.pool().peak_bytes_allocated(); })
      .def_prop_ro("pinned", &SharedPool::pinned)
      .def_prop_ro("pinned_bytes", [](const SharedPool& p) { return p.pool().pinned_bytes(); })
      .def_prop_ro("fenced_buffers",
                   [](const SharedPool& p) { return p.pool().fenced_buffers(); });
}

}  // namespace stoker::python
