// The epoch's order and how it is cut into a rank's batches (include/stoker/order.h): what the
// Python fronts need to visit the same samples as the native loader, resume a state saved with
// another world size, and share a rank's epoch among offload actors.
#include "stoker/order.h"

#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "stoker/errors.h"

namespace stoker::python {
namespace {

std::vector<uint64_t> indices(const BatchPlan& plan, bool shuffle, uint64_t seed, uint64_t epoch,
                              uint64_t batch) {
  if (batch >= plan.num_batches())
    throw InvalidArgument("batch " + std::to_string(batch) + " is out of range: the plan has " +
                          std::to_string(plan.num_batches()) + " batches");
  std::vector<uint64_t> out(plan.batch_length(batch));
  for (uint64_t s = 0; s < out.size(); ++s)
    out[s] = plan.global_position(batch * plan.batch_size() + s);
  EpochOrder(plan.num_samples(), shuffle, seed, epoch).map(out, out);
  return out;
}

}  // namespace

void register_order(nb::module_& m) {
  nb::class_<BatchPlan>(m, "BatchPlan")
      .def(nb::init<uint64_t, uint64_t, bool, uint64_t, uint64_t, uint64_t>(), nb::arg("n"),
           nb::arg("batch_size"), nb::arg("drop_last"), nb::arg("rank"), nb::arg("world_size"),
           nb::arg("start") = 0,
           "A rank's batches of an epoch of n samples, from global position `start` on.")
      .def_prop_ro("num_samples", &BatchPlan::num_samples)
      .def_prop_ro("batch_size", &BatchPlan::batch_size)
      .def_prop_ro("start", &BatchPlan::start)
      .def_prop_ro("num_batches", &BatchPlan::num_batches)
      .def_prop_ro("samples_per_rank", &BatchPlan::samples_per_rank)
      .def("__len__", &BatchPlan::num_batches)
      .def("batch_length", &BatchPlan::batch_length, nb::arg("batch"))
      .def("position_after", &BatchPlan::position_after, nb::arg("batches"),
           "The global position the job reached once each of its ranks delivered `batches` "
           "batches of this plan (num_samples when that finishes it).")
      .def("strided", &BatchPlan::strided, nb::arg("first"), nb::arg("step"),
           "The view whose batch j is this plan's batch first + j * step.")
      .def("indices", &indices, nb::arg("shuffle"), nb::arg("seed"), nb::arg("epoch"),
           nb::arg("batch"), "The sample indices of batch `batch` of the plan in `epoch`.");

  m.def(
      "plan_num_batches",
      [](uint64_t n, uint64_t batch_size, bool drop_last, uint64_t rank, uint64_t world_size,
         uint64_t start) {
        return BatchPlan(n, batch_size, drop_last, rank, world_size, start).num_batches();
      },
      nb::arg("n"), nb::arg("batch_size"), nb::arg("drop_last"), nb::arg("rank"),
      nb::arg("world_size"), nb::arg("start") = 0);

  m.def(
      "batch_indices",
      [](uint64_t n, uint64_t batch_size, bool shuffle, uint64_t seed, uint64_t epoch,
         bool drop_last, uint64_t rank, uint64_t world_size, uint64_t batch, uint64_t start) {
        return indices(BatchPlan(n, batch_size, drop_last, rank, world_size, start), shuffle, seed,
                       epoch, batch);
      },
      nb::arg("n"), nb::arg("batch_size"), nb::arg("shuffle"), nb::arg("seed"), nb::arg("epoch"),
      nb::arg("drop_last"), nb::arg("rank"), nb::arg("world_size"), nb::arg("batch"),
      nb::arg("start") = 0,
      "The sample indices of batch `batch` of an epoch, exactly as the native loader visits them "
      "(from global position `start` on, for an elastic resume).");
}

}  // namespace stoker::python
