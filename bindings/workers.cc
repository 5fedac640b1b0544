// What the Python-dataset front (python/stoker/workers.py) needs from the engine: the epoch order
// (so a Python dataset visits samples exactly as a native one does), the per-sample seed, and a
// pool of batch buffers in shared memory that worker processes write and the consumer exports
// without a copy.
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "stoker/batch_pool.h"
#include "stoker/errors.h"
#include "stoker/order.h"
#include "stoker/random.h"
#include "stoker/shared_arena.h"

namespace stoker::python {
namespace {

// One buffer of a SharedPool, held by the consumer while a worker fills it.
struct Lease {
  Buffer buffer;
  size_t offset = 0;
};

class SharedPool {
 public:
  SharedPool(size_t buffer_bytes, size_t budget_bytes)
      : arena_(SharedArena::create(budget_bytes / buffer_bytes * ((buffer_bytes + 4095) / 4096) *
                                   4096)),
        pool_(BatchPool::create_shared(buffer_bytes, budget_bytes, arena_)) {}

  std::shared_ptr<Lease> acquire(int64_t timeout_ms) {
    Buffer b = pool_->acquire_for(std::stop_token(), std::chrono::milliseconds(timeout_ms));
    if (!b) return nullptr;
    auto lease = std::make_shared<Lease>();
    lease->offset = arena_->offset_of(b.get());
    lease->buffer = std::move(b);
    return lease;
  }

  // One uint8 array per (offset, nbytes) region of the lease's buffer; all share one owner that
  // returns the buffer to the pool when the last of them dies.
  nb::list view(const Lease& lease, const std::vector<std::pair<size_t, size_t>>& regions,
                bool torch) const {
    for (const auto& [offset, bytes] : regions)
      if (offset + bytes > pool_->buffer_bytes())
        throw InvalidArgument("region outside the batch buffer");
    nb::capsule owner(new Buffer(lease.buffer),
                      [](void* p) noexcept { delete static_cast<Buffer*>(p); });
    nb::list out;
    for (const auto& [offset, bytes] : regions) {
      size_t shape[1] = {bytes};
      std::byte* data = lease.buffer.get() + offset;
      if (torch)
        out.append(nb::ndarray<nb::pytorch, uint8_t>(data, 1, shape, owner).cast());
      else
        out.append(nb::ndarray<nb::numpy, uint8_t>(data, 1, shape, owner).cast());
    }
    return out;
  }

  // The whole arena as one writable uint8 array (for worker processes, which inherit the mapping).
  nb::object arena_array(bool torch) const {
    size_t shape[1] = {arena_->size()};
    nb::capsule owner(new std::shared_ptr<SharedArena>(arena_), [](void* p) noexcept {
      delete static_cast<std::shared_ptr<SharedArena>*>(p);
    });
    if (torch) return nb::ndarray<nb::pytorch, uint8_t>(arena_->base(), 1, shape, owner).cast();
    return nb::ndarray<nb::numpy, uint8_t>(arena_->base(), 1, shape, owner).cast();
  }

  const BatchPool& pool() const { return *pool_; }

 private:
  std::shared_ptr<SharedArena> arena_;
  std::shared_ptr<BatchPool> pool_;
};

}  // namespace

void register_workers(nb::module_& m) {
  m.def("sample_seed", &hash_key, nb::arg("seed"), nb::arg("epoch"), nb::arg("index"),
        "The per-sample key of (seed, epoch, index): random.h's hash_key.");

  m.def(
      "plan_num_batches",
      [](uint64_t n, uint64_t batch_size, bool drop_last, uint64_t rank, uint64_t world_size) {
        return BatchPlan(n, batch_size, drop_last, rank, world_size).num_batches();
      },
      nb::arg("n"), nb::arg("batch_size"), nb::arg("drop_last"), nb::arg("rank"),
      nb::arg("world_size"));

  m.def(
      "batch_indices",
      [](uint64_t n, uint64_t batch_size, bool shuffle, uint64_t seed, uint64_t epoch,
         bool drop_last, uint64_t rank, uint64_t world_size, uint64_t batch) {
        const BatchPlan plan(n, batch_size, drop_last, rank, world_size);
        if (batch >= plan.num_batches()) throw InvalidArgument("batch number out of range");
        const EpochOrder order(n, shuffle, seed, epoch);
        std::vector<uint64_t> out;
        const uint64_t first = batch * batch_size;
        for (uint64_t k = first; k < first + plan.batch_length(batch); ++k)
          out.push_back(order[plan.global_position(k)]);
        return out;
      },
      nb::arg("n"), nb::arg("batch_size"), nb::arg("shuffle"), nb::arg("seed"), nb::arg("epoch"),
      nb::arg("drop_last"), nb::arg("rank"), nb::arg("world_size"), nb::arg("batch"),
      "The sample indices of batch `batch` of an epoch, exactly as the native loader visits them.");

  nb::class_<Lease>(m, "Lease").def_ro("offset", &Lease::offset);

  nb::class_<SharedPool>(m, "SharedPool")
      .def(nb::init<size_t, size_t>(), nb::arg("buffer_bytes"), nb::arg("budget_bytes"))
      .def("acquire", &SharedPool::acquire, nb::arg("timeout_ms"),
           nb::call_guard<nb::gil_scoped_release>(),
           "A free buffer, or None after timeout_ms milliseconds.")
      .def("view", &SharedPool::view, nb::arg("lease"), nb::arg("regions"), nb::arg("torch"))
      .def("arena_array", &SharedPool::arena_array, nb::arg("torch"))
      .def_prop_ro("buffer_bytes", [](const SharedPool& p) { return p.pool().buffer_bytes(); })
      .def_prop_ro("capacity", [](const SharedPool& p) { return p.pool().capacity(); })
      .def_prop_ro("bytes_allocated",
                   [](const SharedPool& p) { return p.pool().bytes_allocated(); })
      .def_prop_ro("peak_bytes_allocated",
                   [](const SharedPool& p) { return p.pool().peak_bytes_allocated(); });
}

}  // namespace stoker::python
