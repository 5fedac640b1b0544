// Batches by a budget (stoker/budget.h), in stoker._native.engine: BudgetPlan and its epochs,
// which the Python front makes once per loader (the plan) and once per iteration (the epoch), and
// gives to Engine.iterate_budget.
#include "stoker/budget.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "stoker/errors.h"

namespace stoker::python {
namespace {

using Lengths = nb::ndarray<const double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using UInt64Array = nb::ndarray<nb::numpy, uint64_t, nb::ndim<1>>;

UInt64Array as_array(std::span<const uint64_t> values) {
  return to_array(std::vector<uint64_t>(values.begin(), values.end()));
}

BudgetCost parse_cost(const std::string& s) {
  if (s == "padded") return BudgetCost::kPadded;
  if (s == "sum") return BudgetCost::kSum;
  if (s == "quadratic") return BudgetCost::kQuadratic;
  throw InvalidArgument("cost must be \"padded\", \"sum\" or \"quadratic\", got \"" + s + "\"");
}

BudgetRemainder parse_remainder(const std::string& s) {
  if (s == "drop") return BudgetRemainder::kDrop;
  if (s == "repeat") return BudgetRemainder::kRepeat;
  throw InvalidArgument("remainder must be \"drop\" or \"repeat\", got \"" + s + "\"");
}

}  // namespace

void register_budget(nb::module_& m) {
  m.attr("AUTO_BUCKETS") = kAutoBuckets;
  nb::class_<BudgetEpoch>(m, "BudgetEpoch",
                          "One rank's batches of one epoch of a BudgetPlan (stoker/budget.h).")
      .def_prop_ro("epoch", &BudgetEpoch::epoch)
      .def_prop_ro("rank", &BudgetEpoch::rank)
      .def_prop_ro("world_size", &BudgetEpoch::world_size)
      .def_prop_ro("num_batches", &BudgetEpoch::num_batches)
      .def("__len__", &BudgetEpoch::num_batches)
      .def(
          "batch", [](const BudgetEpoch& e, uint64_t b) { return as_array(e.batch(b)); },
          nb::arg("batch"), "The samples of batch `batch`, in batch order (a uint64 array).")
      .def("bucket_of", &BudgetEpoch::bucket_of, nb::arg("batch"))
      .def_prop_ro("consumed", &BudgetEpoch::consumed,
                   "The buckets' batches consumed before this epoch's plan started.")
      .def("consumed_after", &BudgetEpoch::consumed_after, nb::arg("batches"),
           "The buckets' batches consumed once every rank delivered `batches` batches.")
      .def(
          "step",
          [](const BudgetEpoch& e, uint64_t b) {
            std::vector<UInt64Array> out;
            for (std::span<const uint64_t> s : e.step(b)) out.push_back(as_array(s));
            return out;
          },
          nb::arg("batch"), "Every rank's batch of step `batch`, rank by rank.")
      .def_prop_ro("repeated_batches", &BudgetEpoch::repeated_batches)
      .def_prop_ro("dropped_batches", &BudgetEpoch::dropped_batches)
      .def_prop_ro("dropped_samples", &BudgetEpoch::dropped_samples)
      .def_prop_ro("real_length", &BudgetEpoch::real_length)
      .def_prop_ro("padded_length", &BudgetEpoch::padded_length)
      .def_prop_ro("mean_cost_spread", &BudgetEpoch::mean_cost_spread)
      .def_prop_ro("max_cost_spread", &BudgetEpoch::max_cost_spread);

  nb::class_<BudgetPlan>(m, "BudgetPlan",
                         "Batches by a budget over the samples' lengths (stoker/budget.h).")
      .def(nb::new_([](Lengths lengths, double budget, const std::string& cost,
                       double quadratic_length, std::vector<double> bucket_bounds,
                       uint64_t max_batch_size, const std::string& remainder,
                       std::vector<uint32_t> bucket_of) {
             BudgetOptions o;
             o.budget = budget;
             o.cost = parse_cost(cost);
             o.quadratic_length = quadratic_length;
             o.bucket_bounds = std::move(bucket_bounds);
             o.max_batch_size = max_batch_size;
             o.remainder = parse_remainder(remainder);
             o.bucket_of = std::move(bucket_of);
             std::vector<double> values(lengths.data(), lengths.data() + lengths.shape(0));
             nb::gil_scoped_release release;  // O(n log n)
             return std::make_shared<BudgetPlan>(std::move(values), std::move(o));
           }),
           nb::arg("lengths"), nb::arg("budget"), nb::arg("cost") = "padded",
           nb::arg("quadratic_length") = 0.0, nb::arg("bucket_bounds") = std::vector<double>{},
           nb::arg("max_batch_size") = 0, nb::arg("remainder") = "drop",
           nb::arg("bucket_of") = std::vector<uint32_t>{},
           "`lengths`: a float64 array, one length a sample, in the budget's unit; `bucket_of`: "
           "each sample's bucket, where the buckets are given (no bounds then).")
      .def_prop_ro("num_samples", &BudgetPlan::num_samples)
      .def_prop_ro("num_buckets", &BudgetPlan::num_buckets)
      .def_prop_ro("bucket_bounds", &BudgetPlan::bucket_bounds)
      .def_prop_ro(
          "oversized", [](const BudgetPlan& p) { return as_array(p.oversized()); },
          nb::rv_policy::move)
      .def_prop_ro("max_batch_size", &BudgetPlan::max_batch_size)
      .def_prop_ro("budget", [](const BudgetPlan& p) { return p.options().budget; })
      .def(
          "bucket", [](const BudgetPlan& p, uint64_t j) { return as_array(p.bucket(j)); },
          nb::arg("bucket"))
      .def("cost", &BudgetPlan::cost, nb::arg("count"), nb::arg("sum"), nb::arg("longest"))
      .def("epoch", &BudgetPlan::epoch, nb::arg("seed"), nb::arg("epoch"),
           nb::arg("shuffle") = true, nb::arg("rank") = 0, nb::arg("world_size") = 1,
           nb::arg("consumed") = std::vector<uint64_t>{}, nb::call_guard<nb::gil_scoped_release>(),
           "Rank `rank`'s batches of epoch `epoch`, from the buckets' `consumed` counts (a "
           "BudgetEpoch).");
}

}  // namespace stoker::python
