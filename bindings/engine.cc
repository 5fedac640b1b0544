// The engine wing (stoker._native.engine).
//
// The loader and its epoch iterator. Batches leave as zero-copy NumPy arrays or torch tensors (via
// DLPack) that share one owner: the batch buffer returns to the pool when the last of them dies.
//
// The epoch's order and how it is cut into a rank's batches (include/stoker/order.h; the block
// order of sources in shards, block_order.h): what the Python fronts need to visit the same
// samples as the native loader, resume a state saved with another world size, and share a rank's
// epoch among offload actors.
//
// Class-stratified orders: the samples grouped by class (ClassGroups, given to Engine), and the
// plan itself for orders made outside the native loader (Python datasets).
//
// Weighted mixtures: the plan of one iteration (mixture.h), made by the front from the schedule
// and the resume state, and given to Engine.iterate_mixture.
//
// Batch transforms (batch_transform.h): MixUp, CutMix and a random choice of them, given to Engine
// (run by its workers) or drawn and applied from Python (the GPU path draws the same parameters).
//
// hash_key of random.h, and the loader's limits.
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "bindings.h"
#include "stoker/block_order.h"
#include "stoker/budget.h"
#include "stoker/epoch_draws.h"
#include "stoker/mixture.h"
#include "stoker/batch_transform.h"
#include "stoker/errors.h"
#include "stoker/engine.h"
#include "stoker/order.h"
#include "stoker/random.h"
#include "stoker/stratified_order.h"

namespace stoker::python {
namespace {

enum class Output { kNumpy, kTorch };

template <typename Framework>
nb::object export_field(const BatchField& f, nb::handle owner) {
  std::vector<size_t> shape(f.shape.begin(), f.shape.end());
  const nb::dlpack::dtype dtype{static_cast<uint8_t>(f.dtype.code), f.dtype.bits, 1};
  return nb::ndarray<Framework>(f.data, shape.size(), shape.data(), owner, nullptr, dtype,
                                nb::device::cpu::value)
      .cast();
}

// The fields share one owner; when the last of them dies, a pinned buffer gets its fences (the
// copies still queued from it) before it goes back to the pool.
nb::tuple export_batch(std::shared_ptr<Batch> batch, Output output) {
  const Batch& b = *batch;
  nb::capsule owner(new std::shared_ptr<Batch>(std::move(batch)), [](void* p) noexcept {
    auto* held = static_cast<std::shared_ptr<Batch>*>(p);
    fence_released_batch(**held);
    delete held;
  });
  nb::list fields;
  for (const BatchField& f : b.fields)
    fields.append(output == Output::kTorch ? export_field<nb::pytorch>(f, owner)
                                           : export_field<nb::numpy>(f, owner));
  return nb::tuple(fields);
}

nb::dict decision_dict(const AutotuneDecision& d) {
  nb::dict out;
  out["time_s"] = d.time_s;
  out["num_workers"] = nb::make_tuple(d.workers_from, d.workers_to);
  out["prefetch_factor"] = nb::make_tuple(d.prefetch_from, d.prefetch_to);
  out["consumer_wait_fraction"] = d.figures.consumer_wait_fraction;
  out["worker_busy_fraction"] = d.figures.worker_busy_fraction;
  out["queue_occupancy"] = d.figures.queue_occupancy;
  out["worker_blocked_fraction"] = d.figures.worker_blocked_fraction;
  out["samples_per_s"] = d.figures.samples_per_s;
  out["reason"] = d.reason;
  return out;
}

// New autotune decisions go to the Python logger "stoker.autotune" (INFO).
void log_decisions(EpochIterator& it) {
  std::vector<AutotuneDecision> decisions = it.drain_decisions();
  if (decisions.empty()) return;
  nb::object logger = nb::module_::import_("logging").attr("getLogger")("stoker.autotune");
  for (const AutotuneDecision& d : decisions) {
    char msg[400];
    std::snprintf(msg, sizeof msg,
                  "t=%.2fs num_workers %d -> %d, prefetch_factor %d -> %d (%s; consumer wait "
                  "%.0f%%, workers busy %.0f%%, queue %.0f%%, %.0f samples/s)",
                  d.time_s, d.workers_from, d.workers_to, d.prefetch_from, d.prefetch_to,
                  d.reason.c_str(), 100 * d.figures.consumer_wait_fraction,
                  100 * d.figures.worker_busy_fraction, 100 * d.figures.queue_occupancy,
                  d.figures.samples_per_s);
    logger.attr("info")(msg);
  }
}

// Waits for the next batch without holding the GIL, checking for Ctrl-C between short waits.
nb::tuple next_batch(EpochIterator& it, Output output) {
  std::shared_ptr<Batch> batch;
  for (;;) {
    EpochIterator::Status status;
    {
      nb::gil_scoped_release release;
      status = it.next_for(std::chrono::milliseconds(50), &batch);
    }
    log_decisions(it);
    if (status == EpochIterator::Status::kBatch) return export_batch(std::move(batch), output);
    if (status == EpochIterator::Status::kEnd) throw nb::stop_iteration();
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
}

PinMemory parse_pin(const std::string& s) {
  if (s == "auto") return PinMemory::kAuto;
  if (s == "on") return PinMemory::kOn;
  if (s == "off") return PinMemory::kOff;
  throw InvalidArgument("pin_memory must be \"auto\", True or False");
}

OnError parse_on_error(const std::string& s) {
  if (s == "raise") return OnError::kRaise;
  if (s == "skip") return OnError::kSkip;
  throw InvalidArgument("on_error must be \"raise\" or \"skip\", got \"" + s + "\"");
}

nb::dict stats_dict(const EngineStats& s) {
  nb::dict d;
  d["batches"] = s.batches;
  d["samples"] = s.samples;
  d["skipped"] = s.skipped;
  d["ragged_rows"] = s.ragged_rows;
  d["ragged_padded_rows"] = s.ragged_padded_rows;
  d["skipped_samples"] = s.skipped_samples;
  d["read_s"] = s.read_seconds;
  d["buffer_wait_s"] = s.buffer_wait_seconds;
  d["consumer_wait_s"] = s.consumer_wait_seconds;
  d["buffer_bytes"] = s.buffer_bytes;
  d["buffer_bytes_peak"] = s.buffer_bytes_peak;
  d["pinned_bytes"] = s.pinned_bytes;
  d["fenced_buffers"] = s.fenced_buffers;
  d["memory_budget"] = s.memory_budget;
  d["batch_bytes"] = s.batch_bytes;
  d["worker_cpu_s"] = s.worker_cpu_seconds;
  d["batch_transform_s"] = s.batch_transform_seconds;
  d["active_workers"] = s.active_workers;
  d["prefetch_factor_now"] = s.prefetch_factor;
  d["autotune_enabled"] = s.autotune;
  nb::list decisions;
  for (const AutotuneDecision& a : s.autotune_decisions) decisions.append(decision_dict(a));
  d["autotune"] = decisions;
  if (!s.mixture_samples.empty()) d["mixture_samples"] = s.mixture_samples;
  return d;
}

using Schedule = std::vector<std::pair<uint64_t, std::vector<double>>>;

MixtureOrder mixture_order(std::vector<uint64_t> sizes, const Schedule& schedule) {
  MixtureOrder order{std::move(sizes), {}};
  for (const auto& [step, weights] : schedule) order.schedule.push_back({step, weights});
  return order;
}

using Labels = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Positions = nb::ndarray<const uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using UInt64Array = nb::ndarray<nb::numpy, uint64_t, nb::ndim<1>>;


// A batch's draws as Python takes them: (indices, cycles).
std::pair<std::vector<uint64_t>, std::vector<uint64_t>> as_pair(Draws d) {
  return {std::move(d.indices), std::move(d.cycles)};
}

BatchMix::Kind parse_mix_kind(const std::string& s) {
  if (s == "MixUp") return BatchMix::Kind::kMixUp;
  if (s == "CutMix") return BatchMix::Kind::kCutMix;
  throw InvalidArgument("a batch transform is \"MixUp\" or \"CutMix\", got \"" + s + "\"");
}

ImageLayout parse_image_layout(const std::string& s) {
  if (s == "CHW") return ImageLayout::kCHW;
  if (s == "HWC") return ImageLayout::kHWC;
  throw InvalidArgument("layout must be \"CHW\" or \"HWC\", got \"" + s + "\"");
}

using Images = nb::ndarray<nb::device::cpu, nb::c_contig>;

// Applies `params` to a batch held by Python (images mixed in place); returns the soft labels.
nb::object apply_batch_transform(const BatchTransform& t, const BatchMixParams& params,
                                 Images images, Labels labels) {
  if (images.ndim() != 4 || images.shape(0) != labels.shape(0) || labels.shape(0) == 0)
    throw InvalidArgument(
        "apply() takes a non-empty batch: images [n, 3, H, W] or [n, H, W, 3] and n labels");
  const nb::dlpack::dtype d = images.dtype();
  const DType dtype{static_cast<DType::Code>(d.code), d.bits};
  FieldSpec spec{"image", dtype, {}};
  for (size_t i = 1; i < 4; ++i) spec.shape.push_back(static_cast<int64_t>(images.shape(i)));
  t.check({spec, {"label", kInt64, {}}});
  const bool chw = t.layout() == ImageLayout::kCHW;
  if (params.x2 > spec.shape[chw ? 2 : 1] || params.y2 > spec.shape[chw ? 1 : 0])
    throw InvalidArgument("the parameters were drawn for larger images");
  const auto n = static_cast<int64_t>(labels.shape(0));
  auto* soft = new std::vector<float>(static_cast<size_t>(n * t.num_classes()));
  nb::capsule owner(soft, [](void* p) noexcept { delete static_cast<std::vector<float>*>(p); });
  BatchField image{static_cast<std::byte*>(images.data()), dtype, {n}, "image"};
  image.shape.insert(image.shape.end(), spec.shape.begin(), spec.shape.end());
  const BatchField label{
      reinterpret_cast<std::byte*>(const_cast<int64_t*>(labels.data())), kInt64, {n}, "label"};
  const BatchField soft_label{
      reinterpret_cast<std::byte*>(soft->data()), kFloat32, {n, t.num_classes()}, "soft_label"};
  {
    nb::gil_scoped_release release;
    t.apply(params, image, label, soft_label);
  }
  const size_t shape[2] = {static_cast<size_t>(n), static_cast<size_t>(t.num_classes())};
  return nb::ndarray<nb::numpy, float, nb::ndim<2>>(soft->data(), 2, shape, owner).cast();
}

}  // namespace

UInt64Array to_array(std::vector<uint64_t> values) {
  auto* v = new std::vector<uint64_t>(std::move(values));
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<uint64_t>*>(p); });
  return UInt64Array(v->data(), {v->size()}, owner);
}

void register_engine(nb::module_& m) {
  nb::class_<EpochIterator>(m, "EpochIterator")
      .def(
          "next",
          [](EpochIterator& it, bool torch) {
            return next_batch(it, torch ? Output::kTorch : Output::kNumpy);
          },
          nb::arg("torch"), "The next batch as a tuple of arrays; StopIteration at the end.")
      .def_prop_ro("position", &EpochIterator::position)
      .def_prop_ro("epoch", &EpochIterator::epoch);

  nb::class_<Engine>(m, "Engine")
      .def(nb::new_([](std::shared_ptr<Source> source, uint64_t batch_size, bool shuffle,
                       uint64_t seed, bool drop_last, int num_workers, int prefetch_factor,
                       const std::string& pin_memory, uint64_t memory_budget, uint64_t rank,
                       uint64_t world_size, const std::string& on_error, int cpu_budget,
                       std::shared_ptr<ClassGroups> classes, std::vector<double> class_weights,
                       std::vector<uint64_t> mixture_sizes, const Schedule& mixture_schedule,
                       uint64_t repeats, std::shared_ptr<BatchTransform> batch_transform,
                       uint64_t shard_window, uint64_t stripes, std::shared_ptr<BudgetPlan> budget,
                       uint64_t pad_to_multiple_of) {
             EngineOptions o;
             o.batch_size = batch_size;
             o.shuffle = shuffle;
             o.seed = seed;
             o.drop_last = drop_last;
             o.num_workers = num_workers;
             o.prefetch_factor = prefetch_factor;
             o.pin_memory = parse_pin(pin_memory);
             o.memory_budget = memory_budget;
             o.rank = rank;
             o.world_size = world_size;
             o.on_error = parse_on_error(on_error);
             o.cpu_budget = cpu_budget;
             o.classes = std::move(classes);
             o.class_weights = std::move(class_weights);
             if (!mixture_sizes.empty())
               o.mixture = std::make_shared<const MixtureOrder>(
                   mixture_order(std::move(mixture_sizes), mixture_schedule));
             o.repeats = repeats;
             o.batch_transform = std::move(batch_transform);
             o.shard_window = shard_window;
             o.stripes = stripes;
             o.budget = std::move(budget);
             o.pad_to_multiple_of = pad_to_multiple_of;
             nb::gil_scoped_release release;  // a budget sizes its buffers: O(samples)
             return std::make_shared<Engine>(std::move(source), o);
           }),
           nb::arg("source"), nb::arg("batch_size"), nb::arg("shuffle"), nb::arg("seed"),
           nb::arg("drop_last"), nb::arg("num_workers"), nb::arg("prefetch_factor"),
           nb::arg("pin_memory"), nb::arg("memory_budget"), nb::arg("rank"), nb::arg("world_size"),
           nb::arg("on_error"), nb::arg("cpu_budget") = 0, nb::arg("classes").none() = nb::none(),
           nb::arg("class_weights") = std::vector<double>{},
           nb::arg("mixture_sizes") = std::vector<uint64_t>{},
           nb::arg("mixture_schedule") = Schedule{}, nb::arg("repeats") = 1,
           nb::arg("batch_transform").none() = nb::none(), nb::arg("shard_window") = 0,
           nb::arg("stripes") = 0, nb::arg("budget").none() = nb::none(),
           nb::arg("pad_to_multiple_of") = 1)
      .def("__len__", &Engine::num_batches)
      .def_prop_ro("samples_per_rank", &Engine::samples_per_rank)
      .def_prop_ro("num_workers", [](const Engine& l) { return l.options().num_workers; })
      .def_prop_ro("prefetch_factor", [](const Engine& l) { return l.options().prefetch_factor; })
      .def_prop_ro("memory_budget", [](const Engine& l) { return l.options().memory_budget; })
      .def_prop_ro("pinned", &Engine::pinned)
      .def_prop_ro("pin_unavailable", &Engine::pin_unavailable)
      .def_prop_ro(
          "shard_window", [](const Engine& l) { return l.options().shard_window; },
          "Blocks a rank keeps open a window in the block order in use; 0: no block order.")
      .def_prop_ro(
          "stripes", [](const Engine& l) { return l.options().stripes; },
          "The world size a block order's epochs are arranged for, unless iterate says another.")
      .def(
          "iterate",
          [](const Engine& l, uint64_t epoch, uint64_t start_batch, const BatchPlan* plan,
             uint64_t stripes) {
            return l.iterate(epoch, start_batch, plan ? *plan : l.plan(), stripes);
          },
          nb::arg("epoch"), nb::arg("start_batch") = 0, nb::arg("plan") = nb::none(),
          nb::arg("stripes") = 0, nb::call_guard<nb::gil_scoped_release>(),
          "The batches of `epoch` from `start_batch` on, following `plan` (a "
          "_native.engine.BatchPlan: an elastic start, a strided view) or the loader's own; a "
          "block order arranged for `stripes` ranks (0: the loader's).")
      .def(
          "block_schedule",
          [](const Engine& l, uint64_t epoch, uint64_t start_batch, const BatchPlan* plan,
             uint64_t stripes) {
            std::vector<uint64_t> blocks;
            {
              nb::gil_scoped_release release;
              blocks = l.block_schedule(epoch, start_batch, plan ? *plan : l.plan(), stripes);
            }
            return to_array(std::move(blocks));
          },
          nb::arg("epoch"), nb::arg("start_batch") = 0, nb::arg("plan") = nb::none(),
          nb::arg("stripes") = 0,
          "The blocks (shards) that iterate() with the same arguments reads, each once, in order "
          "of first use, as a uint64 array: what a fetcher downloads. Empty without a block "
          "order.")
      .def(
          "iterate_mixture",
          [](const Engine& l, std::shared_ptr<MixturePlan> plan, uint64_t start_batch) {
            return l.iterate(std::move(plan), start_batch);
          },
          nb::arg("plan"), nb::arg("start_batch") = 0, nb::call_guard<nb::gil_scoped_release>(),
          "A mixture's batches as `plan` (a MixturePlan) lays them out, from `start_batch` on.")
      .def(
          "iterate_budget",
          [](const Engine& l, std::shared_ptr<BudgetEpoch> epoch, uint64_t start_batch) {
            return l.iterate(std::shared_ptr<const BudgetEpoch>(std::move(epoch)), start_batch);
          },
          nb::arg("epoch"), nb::arg("start_batch") = 0, nb::call_guard<nb::gil_scoped_release>(),
          "A budget's batches: those of `epoch` (a BudgetEpoch of the loader's BudgetPlan), from "
          "`start_batch` on.")
      .def("stats", [](const Engine& l) { return stats_dict(l.stats()); })
      .def(
          "epoch_indices",
          [](const Engine& l, uint64_t epoch) { return to_array(l.epoch_indices(epoch)); },
          nb::arg("epoch"), "The samples the epoch reads, batch after batch, as a uint64 array.");

  m.def("usable_cores", &usable_cores, "Cores this process may run on.");
  m.def("physical_memory_bytes", &physical_memory_bytes);
  // The option rules every producer shares (engine.h): the front asks them once, in
  // _options.parse, so that each rule and its message live in the engine.
  m.def("check_knobs", &check_knobs, nb::arg("num_workers").none(),
        nb::arg("prefetch_factor").none(), nb::arg("cpu_budget").none(),
        "InvalidArgument unless each knob given is in its range (None: \"auto\").");
  m.def(
      "check_repeats",
      [](uint64_t repeats, const std::string& order) {
        const SampleOrder o = order == "engine"       ? SampleOrder::kPlain
                              : order == "stratified" ? SampleOrder::kStratified
                              : order == "mixture"    ? SampleOrder::kMixture
                              : order == "budget"     ? SampleOrder::kBudget
                                                      : SampleOrder::kExternal;
        check_repeats(repeats, o);
      },
      nb::arg("repeats"), nb::arg("order"),
      "InvalidArgument unless `repeats` copies of every sample fit the order (\"engine\", "
      "\"stratified\", \"mixture\", \"budget\", \"sampler\" or \"iterable\").");
  m.def("resolve_memory_budget", &resolve_memory_budget, nb::arg("memory_budget"),
        "The batch buffers' bytes: memory_budget, or half of physical memory for 0.");

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
      .def(
          "first_position",
          [](const BatchPlan& p, uint64_t b) {
            check_batch(p, b);
            return p.first_position(b);
          },
          nb::arg("batch"),
          "Batch `batch`'s first global position, unwrapped: the key of its batch transform.")
      .def(
          "repeated_draws",
          [](const BatchPlan& p, bool shuffle, uint64_t seed, uint64_t epoch, uint64_t repeats,
             uint64_t b) {
            return as_pair(
                EpochDraws::for_plan(p, shuffle, seed, epoch, repeats).batch(p, b, true));
          },
          nb::arg("shuffle"), nb::arg("seed"), nb::arg("epoch"), nb::arg("repeats"),
          nb::arg("batch"),
          "(indices, cycles) of batch `batch` of an epoch of `repeats` copies of every sample "
          "(the plan is over their positions): a copy's randomness is keyed by its cycle.")
      .def(
          "indices",
          [](const BatchPlan& p, bool shuffle, uint64_t seed, uint64_t epoch, uint64_t b) {
            return EpochDraws::for_plan(p, shuffle, seed, epoch).batch(p, b, false).indices;
          },
          nb::arg("shuffle"), nb::arg("seed"), nb::arg("epoch"), nb::arg("batch"),
          "The sample indices of batch `batch` of the plan in `epoch`, exactly as the native "
          "loader visits them (a plan from global position `start` on: an elastic resume).");

  nb::class_<BlockOrder>(m, "BlockOrder")
      .def(nb::new_([](std::vector<uint64_t> block_sizes, uint64_t window, uint64_t stripes,
                       uint64_t seed, uint64_t epoch) {
             return std::make_shared<BlockOrder>(block_sizes, window, stripes, seed, epoch);
           }),
           nb::arg("block_sizes"), nb::arg("window"), nb::arg("stripes"), nb::arg("seed"),
           nb::arg("epoch"),
           "An epoch's order of samples in blocks (shards) that keeps `window` blocks open per "
           "rank of a `stripes`-rank job (stoker/block_order.h).")
      .def("__len__", &BlockOrder::size)
      .def_prop_ro("num_blocks", &BlockOrder::num_blocks)
      .def(
          "map",
          [](const BlockOrder& o, Positions positions) {
            std::vector<uint64_t> out(positions.shape(0));
            {
              nb::gil_scoped_release release;
              for (uint64_t p : std::span<const uint64_t>(positions.data(), out.size()))
                if (p >= o.size())
                  throw InvalidArgument("position " + std::to_string(p) + " is past the order's " +
                                        std::to_string(o.size()));
              o.map({positions.data(), out.size()}, out);
            }
            return to_array(std::move(out));
          },
          nb::arg("positions"), "The samples at `positions` (a uint64 array), as a uint64 array.")
      .def("block_of_sample", &BlockOrder::block_of_sample, nb::arg("sample"))
      .def(
          "blocks_in_order",
          [](const BlockOrder& o, uint64_t start, uint64_t rank, uint64_t world_size) {
            std::vector<uint64_t> blocks;
            {
              nb::gil_scoped_release release;
              blocks = o.blocks_in_order(start, rank, world_size);
            }
            return to_array(std::move(blocks));
          },
          nb::arg("start"), nb::arg("rank"), nb::arg("world_size"),
          "The blocks that positions start + rank + j * world_size read, in first-use order.");

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

  nb::class_<CachedStratifiedPlan>(m, "StratifiedPlan")
      .def(nb::new_([](std::shared_ptr<ClassGroups> classes, std::vector<double> weights,
                       uint64_t seed, uint64_t batch_size, bool drop_last, uint64_t rank,
                       uint64_t world_size) {
             return std::make_shared<CachedStratifiedPlan>(std::move(classes), std::move(weights),
                                                           seed, batch_size, drop_last, rank,
                                                           world_size);
           }),
           nb::arg("classes"), nb::arg("class_weights"), nb::arg("seed"), nb::arg("batch_size"),
           nb::arg("drop_last"), nb::arg("rank"), nb::arg("world_size"))
      .def("__len__", [](const CachedStratifiedPlan& p) { return p.plan().num_batches(); })
      .def("batch_length",
           [](const CachedStratifiedPlan& p, uint64_t b) { return p.plan().batch_length(b); })
      .def_prop_ro("class_draws",
                   [](const CachedStratifiedPlan& p) {
                     std::vector<uint64_t> v(p.plan().classes().num_classes());
                     for (uint32_t c = 0; c < v.size(); ++c) v[c] = p.plan().class_draws(c);
                     return v;
                   })
      .def(
          "batch_indices",
          [](CachedStratifiedPlan& p, uint64_t epoch, uint64_t b) {
            return p.batch(epoch, b, false).indices;
          },
          nb::arg("epoch"), nb::arg("batch"), nb::call_guard<nb::gil_scoped_release>(),
          "The sample indices of batch `batch` of an epoch, as the native loader visits them.")
      .def(
          "batch_draws",
          [](CachedStratifiedPlan& p, uint64_t epoch, uint64_t b) {
            return as_pair(p.batch(epoch, b, true));
          },
          nb::arg("epoch"), nb::arg("batch"), nb::call_guard<nb::gil_scoped_release>(),
          "(indices, cycles) of batch `batch`: a draw's randomness is keyed by (seed, cycle, "
          "index), as the native loader keys it (the cycle is the epoch without class weights; "
          "the repeats of an oversampled sample have different cycles).");

  nb::class_<MixturePlan>(m, "MixturePlan")
      .def(nb::new_([](std::vector<uint64_t> sizes, const Schedule& schedule, uint64_t seed,
                       bool shuffle, uint64_t epoch, uint64_t batch_size, bool drop_last,
                       uint64_t rank, uint64_t world_size, uint64_t position, uint64_t first_step,
                       std::vector<uint64_t> bases) {
             return std::make_shared<MixturePlan>(
                 mixture_order(std::move(sizes), schedule), seed, shuffle, epoch, batch_size,
                 drop_last, rank, world_size, MixtureStart{position, first_step, std::move(bases)});
           }),
           nb::arg("sizes"), nb::arg("schedule"), nb::arg("seed"), nb::arg("shuffle"),
           nb::arg("epoch"), nb::arg("batch_size"), nb::arg("drop_last"), nb::arg("rank"),
           nb::arg("world_size"), nb::arg("position") = 0, nb::arg("first_step") = 0,
           nb::arg("bases") = std::vector<uint64_t>{},
           "Rank `rank`'s batches of a mixture epoch (stoker/mixture.h): `schedule` is "
           "[(first_step, weights), ...]; the plan starts at global position `position`, step "
           "`first_step`, with each source's stream at `bases`.")
      .def("__len__", &MixturePlan::num_batches)
      .def_prop_ro("num_batches", &MixturePlan::num_batches)
      .def_prop_ro("epoch", &MixturePlan::epoch)
      .def_prop_ro("position", [](const MixturePlan& p) { return p.start().position; })
      .def_prop_ro("first_step", [](const MixturePlan& p) { return p.start().first_step; })
      .def_prop_ro("bases", [](const MixturePlan& p) { return p.start().bases; })
      .def("batch_length",
           [](const MixturePlan& p, uint64_t b) { return p.batches().batch_length(b); })
      .def(
          "position_after",
          [](const MixturePlan& p, uint64_t b) { return p.batches().position_after(b); },
          nb::arg("batches"), "The epoch's global position once every rank delivered `batches`.")
      .def("draws_after", &MixturePlan::draws_after, nb::arg("batches"),
           nb::call_guard<nb::gil_scoped_release>(),
           "Each source's stream position once every rank delivered `batches` batches.")
      .def("weights_at", &MixturePlan::weights_at, nb::arg("step"))
      .def("batch_counts", &MixturePlan::batch_counts, nb::arg("batch"),
           nb::call_guard<nb::gil_scoped_release>())
      .def(
          "batch_indices",
          [](std::shared_ptr<MixturePlan> p, uint64_t b) {
            const BatchPlan& batches = p->batches();
            return EpochDraws(std::move(p)).batch(batches, b, false).indices;
          },
          nb::arg("batch"), nb::call_guard<nb::gil_scoped_release>(),
          "The global sample indices of batch `batch`, as the native loader visits them.")
      .def(
          "batch_draws",
          [](std::shared_ptr<MixturePlan> p, uint64_t b) {
            const BatchPlan& batches = p->batches();
            return as_pair(EpochDraws(std::move(p)).batch(batches, b, true));
          },
          nb::arg("batch"), nb::call_guard<nb::gil_scoped_release>(),
          "(indices, cycles) of batch `batch`: a draw's cycle is its source's own epoch.");

  m.def(
      "mixture_epoch_start",
      [](std::vector<uint64_t> sizes, const Schedule& schedule, uint64_t seed, bool shuffle,
         uint64_t epoch, uint64_t batch_size, bool drop_last, uint64_t world_size) {
        MixtureStart s =
            MixturePlan::epoch_start(mixture_order(std::move(sizes), schedule), seed, shuffle,
                                     epoch, batch_size, drop_last, world_size);
        return std::make_pair(s.first_step, std::move(s.bases));
      },
      nb::arg("sizes"), nb::arg("schedule"), nb::arg("seed"), nb::arg("shuffle"), nb::arg("epoch"),
      nb::arg("batch_size"), nb::arg("drop_last"), nb::arg("world_size"),
      nb::call_guard<nb::gil_scoped_release>(),
      "(first_step, bases) of epoch `epoch` when every epoch before it ran whole with this "
      "schedule and world size.");

  nb::class_<BatchMixParams>(m, "BatchMixParams")
      .def_ro("choice", &BatchMixParams::choice)
      .def_prop_ro("kind",
                   [](const BatchMixParams& p) {
                     return p.kind == BatchMix::Kind::kMixUp ? "MixUp" : "CutMix";
                   })
      .def_ro("lam", &BatchMixParams::lambda, "The Beta(alpha, alpha) draw.")
      .def_ro("label_lam", &BatchMixParams::label_lambda,
              "The labels' lambda: lam (MixUp), 1 - box area / image area (CutMix).")
      .def_prop_ro(
          "box",
          [](const BatchMixParams& p) { return std::vector<int64_t>{p.x1, p.y1, p.x2, p.y2}; },
          "CutMix's box (x1, y1, x2, y2): rows [y1, y2), columns [x1, x2).")
      .def("__repr__", [](const BatchMixParams& p) {
        std::string s = std::string(p.kind == BatchMix::Kind::kMixUp ? "MixUp" : "CutMix") +
                        "(lam=" + std::to_string(p.lambda);
        if (p.kind == BatchMix::Kind::kCutMix)
          s += ", box=(" + std::to_string(p.x1) + ", " + std::to_string(p.y1) + ", " +
               std::to_string(p.x2) + ", " + std::to_string(p.y2) +
               "), label_lam=" + std::to_string(p.label_lambda);
        return s + ")";
      });

  nb::class_<BatchTransform>(m, "BatchTransform")
      .def(nb::new_([](const std::vector<std::tuple<std::string, double, double>>& choices,
                       int64_t num_classes, const std::string& layout) {
             std::vector<BatchMix> mixes;
             for (const auto& [kind, alpha, weight] : choices)
               mixes.push_back({parse_mix_kind(kind), alpha, weight});
             return std::make_shared<BatchTransform>(std::move(mixes), num_classes,
                                                     parse_image_layout(layout));
           }),
           nb::arg("choices"), nb::arg("num_classes"), nb::arg("layout"),
           "choices: [(\"MixUp\" or \"CutMix\", alpha, weight), ...] (one: that transform; "
           "several: a random choice by weight); layout: \"CHW\" or \"HWC\".")
      .def_prop_ro("num_classes", &BatchTransform::num_classes)
      .def("__repr__", &BatchTransform::describe)
      .def("draw", &BatchTransform::draw, nb::arg("seed"), nb::arg("epoch"), nb::arg("key"),
           nb::arg("height"), nb::arg("width"),
           "The parameters of the batch keyed by (seed, epoch, key), as the loader draws them.")
      .def("apply", &apply_batch_transform, nb::arg("params"), nb::arg("images"), nb::arg("labels"),
           "Mixes `images` (a C-contiguous CPU array, [n, 3, H, W] or [n, H, W, 3]) in place by "
           "`params` and returns the soft labels of `labels` (int64 [n]): float32 [n, "
           "num_classes].");

  m.def("hash_key", &hash_key, nb::arg("a"), nb::arg("b"), nb::arg("c"),
        "random.h's hash_key(a, b, c): 64 bits (on_error=\"skip\" draws replacements with it).");

  m.attr("MAX_WORKERS") = kMaxWorkers;
  // on_error="skip": how many skipped samples stats() lists, the newest (src/engine/skip_policy.h).
  m.attr("SKIPPED_LISTED") = kSkippedListed;
  m.attr("MAX_PREFETCH_FACTOR") = kMaxPrefetchFactor;
}

}  // namespace stoker::python
