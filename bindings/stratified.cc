// Class-stratified orders: the samples grouped by class (ClassGroups, given to Loader), and the
// plan itself for orders made outside the native loader (Python datasets).
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/vector.h>

#include <mutex>
#include <optional>

#include "bindings.h"
#include "stoker/stratified_order.h"

namespace stoker::python {
namespace {

using Labels = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A plan that keeps the order of the epoch last asked for, so that asking for an epoch's batches
// one at a time makes the epoch's O(classes) state once.
class CachedPlan {
 public:
  explicit CachedPlan(StratifiedPlan plan) : plan_(std::move(plan)) {}

  const StratifiedPlan& plan() const { return plan_; }

  // The samples of batch b of `epoch`, and with `cycles` the cycle of each draw.
  std::vector<uint64_t> batch(uint64_t epoch, uint64_t b, std::vector<uint64_t>* cycles = nullptr) {
    std::vector<uint64_t> out(b < plan_.num_batches() ? plan_.batch_length(b) : 0);
    if (cycles) cycles->resize(out.size());
    std::lock_guard lock(mu_);
    if (!epoch_ || epoch_->epoch() != epoch) epoch_ = plan_.epoch(epoch);
    epoch_->batch(b, out, cycles ? std::span<uint64_t>(*cycles) : std::span<uint64_t>());
    return out;
  }

 private:
  const StratifiedPlan plan_;
  std::mutex mu_;
  std::optional<StratifiedEpoch> epoch_;  // guarded by mu_
};

}  // namespace

void register_stratified(nb::module_& m) {
  nb::class_<ClassGroups>(m, "ClassGroups")
      .def(nb::new_([](const Labels& labels) {
             const std::span<const int64_t> view(labels.data(), labels.shape(0));
             nb::gil_scoped_release release;
             return std::make_shared<ClassGroups>(view);
           }),
           nb::arg("labels"), "The samples grouped by their labels (an int64 array).")
      .def("__len__", &ClassGroups::num_samples)
      .def_prop_ro("num_classes", &ClassGroups::num_classes)
      .def_prop_ro("labels",
                   [](const ClassGroups& g) {
                     std::vector<int64_t> v(g.num_classes());
                     for (uint32_t c = 0; c < v.size(); ++c) v[c] = g.label(c);
                     return v;
                   })
      .def_prop_ro("counts",
                   [](const ClassGroups& g) {
                     std::vector<uint64_t> v(g.num_classes());
                     for (uint32_t c = 0; c < v.size(); ++c) v[c] = g.count(c);
                     return v;
                   })
      .def_prop_ro("memory_bytes", &ClassGroups::memory_bytes);

  nb::class_<CachedPlan>(m, "StratifiedPlan")
      .def(nb::new_([](std::shared_ptr<ClassGroups> classes, std::vector<double> weights,
                       uint64_t seed, uint64_t batch_size, bool drop_last, uint64_t rank,
                       uint64_t world_size) {
             return std::make_shared<CachedPlan>(
                 StratifiedPlan(std::move(classes), std::move(weights), seed, batch_size, drop_last,
                                rank, world_size));
           }),
           nb::arg("classes"), nb::arg("class_weights"), nb::arg("seed"), nb::arg("batch_size"),
           nb::arg("drop_last"), nb::arg("rank"), nb::arg("world_size"))
      .def("__len__", [](const CachedPlan& p) { return p.plan().num_batches(); })
      .def("batch_length", [](const CachedPlan& p, uint64_t b) { return p.plan().batch_length(b); })
      .def_prop_ro("class_draws",
                   [](const CachedPlan& p) {
                     std::vector<uint64_t> v(p.plan().classes().num_classes());
                     for (uint32_t c = 0; c < v.size(); ++c) v[c] = p.plan().class_draws(c);
                     return v;
                   })
      .def(
          "batch_indices",
          [](CachedPlan& p, uint64_t epoch, uint64_t b) { return p.batch(epoch, b); },
          nb::arg("epoch"), nb::arg("batch"), nb::call_guard<nb::gil_scoped_release>(),
          "The sample indices of batch `batch` of an epoch, as the native loader visits them.")
      .def(
          "batch_draws",
          [](CachedPlan& p, uint64_t epoch, uint64_t b) {
            std::vector<uint64_t> cycles;
            std::vector<uint64_t> indices = p.batch(epoch, b, &cycles);
            return std::make_pair(std::move(indices), std::move(cycles));
          },
          nb::arg("epoch"), nb::arg("batch"), nb::call_guard<nb::gil_scoped_release>(),
          "(indices, cycles) of batch `batch`: a draw's randomness is keyed by (seed, cycle, "
          "index), as the native loader keys it (the cycle is the epoch without class weights; "
          "the repeats of an oversampled sample have different cycles).");
}

}  // namespace stoker::python
