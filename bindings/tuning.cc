// The tuning wing (stoker._native.tuning).
//
// The tuner and diagnosis: the search and the rules run in C++; measurements either run natively
// (the loader, no Python per batch) or call back into Python (torch's DataLoader) with the GIL.
// Also the GPU sampler of stoker.diagnose (NVML).
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>

#include "bindings.h"
#include "stoker/errors.h"
#include "stoker/memory.h"
#include "stoker/tuning/diagnosis.h"
#include "stoker/tuning/executor_policy.h"
#include "stoker/tuning/tuner.h"

namespace stoker::python {
namespace {

std::vector<Knob> parse_knobs(const nb::list& specs) {
  std::vector<Knob> knobs;
  for (nb::handle h : specs) {
    nb::dict d = nb::cast<nb::dict>(h);
    Knob k;
    k.name = nb::cast<std::string>(d["name"]);
    k.values = nb::cast<std::vector<int64_t>>(d["values"]);
    k.start = nb::cast<int64_t>(d["start"]);
    if (d.contains("min")) k.min = nb::cast<int64_t>(d["min"]);
    if (d.contains("max")) k.max = nb::cast<int64_t>(d["max"]);
    knobs.push_back(std::move(k));
  }
  return knobs;
}

TuneOptions parse_options(const nb::dict& d) {
  TuneOptions o;
  if (d.contains("repeats")) o.repeats = nb::cast<int>(d["repeats"]);
  if (d.contains("noise_floor")) o.noise_floor = nb::cast<double>(d["noise_floor"]);
  if (d.contains("plateau_tolerance"))
    o.plateau_tolerance = nb::cast<double>(d["plateau_tolerance"]);
  if (d.contains("memory_budget")) o.memory_budget = nb::cast<uint64_t>(d["memory_budget"]);
  if (d.contains("max_rounds")) o.max_rounds = nb::cast<int>(d["max_rounds"]);
  if (d.contains("time_budget_s")) o.time_budget_s = nb::cast<double>(d["time_budget_s"]);
  return o;
}

nb::dict point_dict(const TunePoint& p) {
  nb::dict d;
  for (const auto& [k, v] : p.config) d[k.c_str()] = v;
  d["samples_per_s"] = p.samples_per_s;
  d["repeat"] = p.repeat;
  d["seconds"] = p.seconds;
  d["memory_estimate"] = p.memory_estimate;
  return d;
}

nb::dict result_dict(const TuneResult& r) {
  nb::dict d;
  d["recommended"] = r.recommended;
  d["samples_per_s"] = r.samples_per_s;
  d["noise"] = r.noise;
  d["best"] = r.best;
  d["best_samples_per_s"] = r.best_samples_per_s;
  nb::list points;
  for (const TunePoint& p : r.points) points.append(point_dict(p));
  d["points"] = points;
  d["over_budget"] = r.over_budget;
  d["measuring_seconds"] = r.measuring_seconds;
  d["rounds"] = r.rounds;
  d["stopped"] = r.stopped;
  return d;
}

// Runs the search without the GIL; every callback takes it.
TuneResult run_tune(const std::vector<Knob>& knobs, MeasureFn measure, const TuneOptions& o,
                    MemoryFn memory, nb::object progress) {
  ProgressFn on_point;
  if (!progress.is_none())
    on_point = [&progress](const TunePoint& p) {
      nb::gil_scoped_acquire gil;
      progress(point_dict(p));
      if (PyErr_CheckSignals() != 0) throw nb::python_error();
    };
  nb::gil_scoped_release release;
  return tune(knobs, measure, o, memory, on_point);
}

}  // namespace

void register_tuning(nb::module_& m) {
  // A decision as the Python front's policy.Decision takes it: (kind, workers, reason).
  auto decision = [](const ExecutorDecision& d) {
    return nb::make_tuple(executor_kind_name(d.kind), d.workers, d.reason);
  };
  nb::class_<ExecutorPolicy> policy(
      m, "ExecutorPolicy",
      "num_workers=\"auto\" for a Python dataset: stay, or start worker processes or threads, "
      "from measured timings (stoker/tuning/executor_policy.h). Decisions are (kind, workers, "
      "reason) tuples.");
  policy
      .def(nb::init<int, bool, bool, bool, int>(), nb::arg("cores"), nb::arg("forked") = true,
           nb::arg("persistent") = false, nb::arg("threads_allowed") = false,
           nb::arg("batch_size") = 1)
      .def_prop_ro("cores", &ExecutorPolicy::cores)
      .def_prop_ro("pace", &ExecutorPolicy::pace)
      .def_prop_ro("start_s", &ExecutorPolicy::start_s)
      .def_prop_ro("persistent", &ExecutorPolicy::persistent)
      .def_prop_ro("threads_allowed", &ExecutorPolicy::threads_allowed)
      .def("wants_thread_trial", &ExecutorPolicy::wants_thread_trial)
      .def(
          "first_chunks",
          [decision](ExecutorPolicy& p, double seconds_per_sample, double rest_of_batch) {
            return decision(p.first_chunks(seconds_per_sample, rest_of_batch));
          },
          nb::arg("seconds_per_sample"), nb::arg("rest_of_batch"))
      .def(
          "thread_trial",
          [decision](const ExecutorPolicy& p, double one_thread_s, double two_threads_s) {
            return decision(p.thread_trial(one_thread_s, two_threads_s));
          },
          nb::arg("one_thread_s"), nb::arg("two_threads_s"))
      .def(
          "after_batch",
          [decision](ExecutorPolicy& p, double seconds_per_sample, double samples_left) {
            return decision(p.after_batch(seconds_per_sample, samples_left));
          },
          nb::arg("seconds_per_sample"), nb::arg("samples_left"))
      .def_static("stay", [decision] { return decision(ExecutorPolicy::stay()); });
  policy.attr("FORK_NOW_S") = ExecutorPolicy::kForkNowS;
  policy.attr("FORK_EPOCH_S") = ExecutorPolicy::kForkEpochS;
  policy.attr("FORK_PERSISTENT_S") = ExecutorPolicy::kForkPersistentS;
  policy.attr("SPAWN_START_S") = ExecutorPolicy::kSpawnStartS;
  policy.attr("HELP_BATCH_S") = ExecutorPolicy::kHelpBatchS;
  policy.attr("THREAD_GAIN") = ExecutorPolicy::kThreadGain;

  m.def(
      "tune_loader",
      [](std::shared_ptr<Source> source, nb::list knob_specs, nb::dict base, nb::dict options,
         double min_seconds, nb::object progress) {
        std::vector<Knob> knobs = parse_knobs(knob_specs);
        TuneOptions o = parse_options(options);
        EngineOptions lo;
        lo.batch_size = nb::cast<uint64_t>(base["batch_size"]);
        lo.shuffle = nb::cast<bool>(base["shuffle"]);
        lo.seed = nb::cast<uint64_t>(base["seed"]);
        lo.pin_memory = PinMemory::kOff;
        uint64_t sample_bytes = 0;
        for (const FieldSpec& f : source->fields()) sample_bytes += f.sample_bytes();
        const int64_t batch = static_cast<int64_t>(lo.batch_size);
        const uint64_t min_batches =
            base.contains("min_batches") ? nb::cast<uint64_t>(base["min_batches"]) : 4;
        std::shared_ptr<const Source> src = source;
        MeasureFn measure = [src, lo, min_seconds, min_batches, &o](const Config& c) {
          EngineOptions opts = apply_config(lo, c);
          // The loader's own pool is bounded by the tuner's budget too (0 = the default).
          opts.memory_budget = o.memory_budget;
          return measure_loader(src, opts, min_seconds, min_batches);
        };
        MemoryFn memory = [sample_bytes, batch](const Config& c) {
          return estimate_loader_memory(c, sample_bytes, batch);
        };
        return result_dict(run_tune(knobs, measure, o, memory, progress));
      },
      nb::arg("source"), nb::arg("knobs"), nb::arg("base"), nb::arg("options"),
      nb::arg("min_seconds"), nb::arg("progress") = nb::none(),
      "Tunes Stoker's loader over `source`; measurements run natively.");

  m.def(
      "tune_callback",
      [](nb::list knob_specs, nb::object measure_py, nb::object memory_py, nb::dict options,
         nb::object progress) {
        std::vector<Knob> knobs = parse_knobs(knob_specs);
        TuneOptions o = parse_options(options);
        MeasureFn measure = [&measure_py](const Config& c) {
          nb::gil_scoped_acquire gil;
          return nb::cast<double>(measure_py(c));
        };
        MemoryFn memory;
        if (!memory_py.is_none())
          memory = [&memory_py](const Config& c) {
            nb::gil_scoped_acquire gil;
            return nb::cast<uint64_t>(memory_py(c));
          };
        return result_dict(run_tune(knobs, measure, o, memory, progress));
      },
      nb::arg("knobs"), nb::arg("measure"), nb::arg("memory") = nb::none(), nb::arg("options"),
      nb::arg("progress") = nb::none(),
      "Tunes with a Python measurement callback: measure(config) -> samples/s.");

  m.def(
      "estimate_loader_memory",
      [](const Config& c, uint64_t sample_bytes, int64_t batch_size) {
        return estimate_loader_memory(c, sample_bytes, batch_size);
      },
      nb::arg("config"), nb::arg("sample_bytes"), nb::arg("batch_size"));

  m.def("read_system", [] {
    SystemSample s = read_system();
    nb::dict d;
    d["core_busy"] = s.core_busy;
    d["core_total"] = s.core_total;
    d["rss_bytes"] = s.rss_bytes;
    return d;
  });

  m.def(
      "diagnose",
      [](nb::dict f) {
        DiagnosisInputs in;
        in.wall_seconds = nb::cast<double>(f["wall_seconds"]);
        in.consumer_wait_seconds = nb::cast<double>(f["consumer_wait_seconds"]);
        in.buffer_wait_seconds = nb::cast<double>(f["buffer_wait_seconds"]);
        for (nb::handle h : nb::cast<nb::list>(f["stages"])) {
          nb::dict s = nb::cast<nb::dict>(h);
          in.stages.push_back({nb::cast<std::string>(s["name"]), nb::cast<int>(s["threads"]),
                               nb::cast<double>(s["samples_per_s"]),
                               nb::cast<double>(s["busy_seconds"]),
                               nb::cast<double>(s["cpu_seconds"])});
        }
        in.core_utilization = nb::cast<std::vector<double>>(f["core_utilization"]);
        in.usable_cores = usable_cores();
        in.rss_bytes = nb::cast<uint64_t>(f["rss_bytes"]);
        in.physical_memory_bytes = physical_memory_bytes();
        in.pinned_bytes = nb::cast<uint64_t>(f["pinned_bytes"]);
        in.pinned_budget_bytes = nb::cast<uint64_t>(f["pinned_budget_bytes"]);
        in.buffer_bytes_peak = nb::cast<uint64_t>(f["buffer_bytes_peak"]);
        in.memory_budget = nb::cast<uint64_t>(f["memory_budget"]);
        in.gpu_present = nb::cast<bool>(f["gpu_present"]);
        in.gpu_utilization = nb::cast<double>(f["gpu_utilization"]);
        in.gpu_memory_used = nb::cast<uint64_t>(f["gpu_memory_used"]);
        in.gpu_memory_total = nb::cast<uint64_t>(f["gpu_memory_total"]);
        if (f.contains("network")) {
          nb::dict n = nb::cast<nb::dict>(f["network"]);
          in.network.present = true;
          in.network.bytes_fetched = nb::cast<uint64_t>(n["bytes_fetched"]);
          in.network.network_seconds = nb::cast<double>(n["network_seconds"]);
          in.network.wait_seconds = nb::cast<double>(n["wait_seconds"]);
          in.network.first_reads = nb::cast<uint64_t>(n["first_reads"]);
          in.network.cache_hits = nb::cast<uint64_t>(n["cache_hits"]);
          in.network.requests = nb::cast<uint64_t>(n["requests"]);
        }
        if (f.contains("source_figures")) {
          for (nb::handle item : nb::cast<nb::list>(f["source_figures"])) {
            nb::dict g = nb::cast<nb::dict>(item);
            SourceFigure figure;
            figure.name = nb::cast<std::string>(g["name"]);
            figure.value = nb::cast<double>(g["value"]);
            figure.unit = nb::cast<std::string>(g["unit"]);
            if (g.contains("stage")) figure.stage = nb::cast<std::string>(g["stage"]);
            if (g.contains("advice")) figure.advice = nb::cast<std::string>(g["advice"]);
            in.source_figures.push_back(std::move(figure));
          }
        }
        Diagnosis d = diagnose(in);
        nb::dict out;
        out["verdict"] = d.verdict;
        out["limiting_stage"] = d.limiting_stage;
        out["action"] = d.action;
        out["wait_fraction"] = d.wait_fraction;
        out["reasons"] = d.reasons;
        return out;
      },
      nb::arg("figures"), "The verdict for the figures of a run (see stoker/tuning/diagnosis.h).");

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
