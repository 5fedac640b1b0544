// What the Python-dataset front (python/stoker/workers.py) needs from the engine: the epoch order
// (so a Python dataset visits samples exactly as a native one does), the check that a batch's
// samples share one structure (and their leaves as columns), and a pool of batch buffers in
// shared memory, with claim counters, that worker processes and the consumer write and the
// consumer exports without a copy. Per-sample seeding is in seeding.cc.
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <sys/mman.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <string>
#include <utility>

#include "bindings.h"
#include "stoker/batch_pool.h"
#include "stoker/errors.h"
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
  static constexpr size_t kControlBytes = 65536;

  SharedPool(size_t buffer_bytes, size_t budget_bytes)
      : arena_(SharedArena::create(kControlBytes + budget_bytes / buffer_bytes *
                                                       ((buffer_bytes + 4095) / 4096) * 4096)),
        control_(reinterpret_cast<uint64_t*>(arena_->carve(kControlBytes))),
        pool_(BatchPool::create_shared(buffer_bytes, budget_bytes, arena_)) {}

  // Counters in the shared control pages that every process forked after the pool sees: the
  // consumer resets counter c for a batch, then it and a worker claim the batch's samples with
  // claim(c, count): each call returns the first of `count` numbers no one else got.
  static constexpr size_t kCounters = kControlBytes / sizeof(uint64_t);
  void reset_claims(size_t c) { std::atomic_ref<uint64_t>(control_[counter(c)]).store(0); }
  uint64_t claim(size_t c, uint64_t count) {
    return std::atomic_ref<uint64_t>(control_[counter(c)]).fetch_add(count);
  }

  // Drops this process's mapping of the whole pages in arena bytes [offset, offset + bytes) (the
  // data stays in the shared memory for the other processes): a worker calls it after writing a
  // chunk of a batch, so the pages do not count in every worker that ever wrote the buffer.
  void unmap_pages(size_t offset, size_t bytes) const {
    if (offset + bytes <= arena_->size()) drop_pages(arena_->base() + offset, bytes);
  }

  // A buffer for the consumer. When its last owner here dies (the lease and every array
  // viewing it), this process drops its mapping of the buffer's pages, then the buffer returns
  // to the pool: its pages count in the consumer's RSS only while a batch in it is alive.
  std::shared_ptr<Lease> acquire(int64_t timeout_ms) {
    Buffer b = pool_->acquire_for(std::stop_token(), std::chrono::milliseconds(timeout_ms));
    if (!b) return nullptr;
    auto lease = std::make_shared<Lease>();
    lease->offset = arena_->offset_of(b.get());
    std::byte* data = b.get();
    lease->buffer = Buffer(data, [inner = std::move(b), bytes = pool_->buffer_bytes()](
                                     std::byte* p) { drop_pages(p, bytes); });
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
  static size_t counter(size_t c) {
    if (c >= kCounters) throw InvalidArgument("claim counter out of range");
    return c;
  }

  // Drops this process's mapping of the whole pages inside [p, p + bytes).
  static void drop_pages(std::byte* p, size_t bytes) {
    const auto at = reinterpret_cast<uintptr_t>(p);
    const uintptr_t start = (at + 4095) / 4096 * 4096;
    const uintptr_t end = (at + bytes) / 4096 * 4096;
    if (end > start) madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED);
  }

  std::shared_ptr<SharedArena> arena_;
  uint64_t* control_;
  std::shared_ptr<BatchPool> pool_;
};

// The columns of a batch whose samples share sample 0's structure (a tree of workers.flatten):
// array leaf k of every sample in array column k, object leaf k in object column k. Types must
// match sample 0's exactly (array leaves: array_types[k], and the same dtype for NumPy arrays;
// shapes are left to torch.stack/np.stack, which raise exactly as default_collate would). The
// structure is compiled once a batch, so a sample costs type checks and list appends (~30 ns
// for a (tensor, int) sample). REQUIRES: the GIL.
class ColumnGatherer {
 public:
  ColumnGatherer(nb::handle structure, const nb::tuple& array_types, const nb::tuple& object_types,
                 const nb::tuple& np_dtypes)
      : array_types_(array_types), object_types_(object_types), np_dtypes_(np_dtypes) {
    for (size_t k = 0; k < array_types.size(); ++k) array_cols_.append(nb::list());
    for (size_t k = 0; k < object_types.size(); ++k) object_cols_.append(nb::list());
    root_ = compile(structure);
  }

  // Appends the sample's leaves to the columns; false at the first difference (the columns are
  // then partial).
  bool add(nb::handle sample) const { return gather(root_, sample.ptr()); }

  nb::tuple columns() const { return nb::make_tuple(array_cols_, object_cols_); }

 private:
  struct Node {
    char tag = 0;                 // workers.flatten's: L, A, O, M, N, S or T
    PyObject* type = nullptr;     // the exact type (L, A, O: the leaf's; M, N, S: the node's)
    PyObject* column = nullptr;   // L, A, O: the list the leaf goes to
    PyObject* dtype = nullptr;    // A: the NumPy dtype it must have
    std::vector<PyObject*> keys;  // M: the keys, in order
    std::vector<Node> children;
  };

  // The objects referenced are the structure's and the argument tuples', alive for the call.
  Node compile(nb::handle node) {
    const nb::tuple n = nb::borrow<nb::tuple>(node);
    Node out;
    out.tag = nb::cast<std::string_view>(n[0])[0];
    switch (out.tag) {
      case 'L':
      case 'A':
      case 'O': {
        const size_t k = nb::cast<size_t>(n[1]);
        const bool array = out.tag != 'O';
        out.type = (array ? array_types_ : object_types_)[k].ptr();
        out.column = (array ? array_cols_ : object_cols_)[k].ptr();
        if (out.tag == 'A') out.dtype = np_dtypes_[k].ptr();
        return out;
      }
      case 'M':  // ("M", type, keys, children)
        for (nb::handle key : nb::borrow<nb::tuple>(n[2])) out.keys.push_back(key.ptr());
        [[fallthrough]];
      case 'N':    // ("N", type, children)
      case 'S':    // ("S", type, children)
      case 'T': {  // ("T", children)
        out.type = out.tag == 'T' ? reinterpret_cast<PyObject*>(&PyTuple_Type) : n[1].ptr();
        for (nb::handle child : nb::borrow<nb::tuple>(n[out.tag == 'M'   ? 3
                                                        : out.tag == 'T' ? 1
                                                                         : 2]))
          out.children.push_back(compile(child));
        return out;
      }
      default:
        throw InvalidArgument("gather_columns: unknown structure tag");
    }
  }

  static bool gather(const Node& node, PyObject* obj) {
    if (reinterpret_cast<PyObject*>(Py_TYPE(obj)) != node.type) return false;
    switch (node.tag) {
      case 'A': {
        const nb::object dtype = nb::steal(PyObject_GetAttrString(obj, "dtype"));
        if (!dtype.is_valid()) throw nb::python_error();
        if (!dtype.equal(nb::handle(node.dtype))) return false;
        [[fallthrough]];
      }
      case 'L':
      case 'O':
        if (PyList_Append(node.column, obj) != 0) throw nb::python_error();
        return true;
      case 'T': {
        if (PyTuple_Size(obj) != static_cast<Py_ssize_t>(node.children.size())) return false;
        for (size_t i = 0; i < node.children.size(); ++i)
          if (!gather(node.children[i], PyTuple_GetItem(obj, static_cast<Py_ssize_t>(i))))
            return false;
        return true;
      }
      case 'M': {
        if (PyObject_Length(obj) != static_cast<Py_ssize_t>(node.keys.size())) return false;
        size_t i = 0;
        for (nb::handle key : nb::handle(obj).attr("keys")())
          if (i >= node.keys.size() || !key.equal(nb::handle(node.keys[i++]))) return false;
        for (i = 0; i < node.keys.size(); ++i) {
          const nb::object child = nb::steal(PyObject_GetItem(obj, node.keys[i]));
          if (!child.is_valid()) throw nb::python_error();
          if (!gather(node.children[i], child.ptr())) return false;
        }
        return true;
      }
      default: {  // N, S: sequences
        if (PyObject_Length(obj) != static_cast<Py_ssize_t>(node.children.size())) return false;
        for (size_t i = 0; i < node.children.size(); ++i) {
          const nb::object child = nb::steal(PySequence_GetItem(obj, static_cast<Py_ssize_t>(i)));
          if (!child.is_valid()) throw nb::python_error();
          if (!gather(node.children[i], child.ptr())) return false;
        }
        return true;
      }
    }
  }

  nb::tuple array_types_, object_types_, np_dtypes_;
  nb::list array_cols_, object_cols_;
  Node root_;
};

}  // namespace

void register_workers(nb::module_& m) {
  m.def(
      "gather_columns",
      [](nb::handle structure, const nb::sequence& samples, const nb::tuple& array_types,
         const nb::tuple& object_types, const nb::tuple& np_dtypes) -> nb::object {
        const ColumnGatherer gatherer(structure, array_types, object_types, np_dtypes);
        for (nb::handle sample : samples)
          if (!gatherer.add(sample)) return nb::none();
        return gatherer.columns();
      },
      nb::arg("structure"), nb::arg("samples"), nb::arg("array_types"), nb::arg("object_types"),
      nb::arg("np_dtypes"),
      "The batch's leaves as columns (array columns, object columns) when every sample has "
      "`structure` (workers.flatten's tree of sample 0) with leaves of the same types, else "
      "None. np_dtypes[k]: the dtype NumPy leaf k must have (None for tensors).");

  nb::class_<Lease>(m, "Lease").def_ro("offset", &Lease::offset);

  nb::class_<SharedPool>(m, "SharedPool")
      .def(nb::init<size_t, size_t>(), nb::arg("buffer_bytes"), nb::arg("budget_bytes"))
      .def("acquire", &SharedPool::acquire, nb::arg("timeout_ms"),
           nb::call_guard<nb::gil_scoped_release>(),
           "A free buffer, or None after timeout_ms milliseconds.")
      .def("reset_claims", &SharedPool::reset_claims, nb::arg("counter"))
      .def("claim", &SharedPool::claim, nb::arg("counter"), nb::arg("count"),
           "The first of the next `count` unclaimed numbers of `counter` since its reset.")
      .def_prop_ro_static("counters", [](nb::handle) { return SharedPool::kCounters; })
      .def("unmap_pages", &SharedPool::unmap_pages, nb::arg("offset"), nb::arg("bytes"))
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
