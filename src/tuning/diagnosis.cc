#include "stoker/tuning/diagnosis.h"

#include <dlfcn.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <type_traits>

#include "stoker/cuda/cuda.h"

namespace stoker {
namespace {

std::string pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", 100 * f);
  return buf;
}

std::string mib(uint64_t b) { return std::to_string(b >> 20) + " MiB"; }

const StageFigures* stage(const DiagnosisInputs& in, const std::string& name) {
  for (const StageFigures& s : in.stages)
    if (s.name == name) return &s;
  return nullptr;
}

// NVML, loaded at run time; only the few calls needed. The library stays loaded for the life of
// the process.
struct Nvml {
  struct Utilization {
    unsigned gpu, memory;
  };
  struct Memory {
    unsigned long long total, free, used;
  };
  using Device = void*;
  int (*init)() = nullptr;
  int (*by_index)(unsigned, Device*) = nullptr;
  int (*by_pci_bus_id)(const char*, Device*) = nullptr;
  int (*utilization)(Device, Utilization*) = nullptr;
  int (*memory)(Device, Memory*) = nullptr;
  bool ok = false;

  Nvml() {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    auto sym = [lib](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      return fn != nullptr;
    };
    ok = sym(init, "nvmlInit_v2") && sym(by_index, "nvmlDeviceGetHandleByIndex_v2") &&
         sym(by_pci_bus_id, "nvmlDeviceGetHandleByPciBusId_v2") &&
         sym(utilization, "nvmlDeviceGetUtilizationRates") &&
         sym(memory, "nvmlDeviceGetMemoryInfo") && init() == 0;
  }

  // The NVML handle of CUDA device `cuda_device`; nullptr when there is none.
  Device device(int cuda_device) const {
    if (!ok || cuda_device < 0) return nullptr;
    Device d = nullptr;
    const std::string bus = cuda::pci_bus_id(cuda_device);
    if (!bus.empty()) return by_pci_bus_id(bus.c_str(), &d) == 0 ? d : nullptr;
    return by_index(static_cast<unsigned>(cuda_device), &d) == 0 ? d : nullptr;
  }
};

Nvml& nvml_library() {
  static Nvml n;
  return n;
}

// The dataset's stage with the most worker time, or null when it names none.
const SourceFigure* busiest_stage(const std::vector<SourceFigure>& figures) {
  const SourceFigure* top = nullptr;
  for (const SourceFigure& f : figures)
    if (!f.stage.empty() && (!top || f.value > top->value)) top = &f;
  return top;
}

// "decode 62% of the workers' busy time, transform 20%; frames decoded per frame delivered 2.1":
// the dataset's stages as shares of `busy`, then its other figures with their units.
std::string stage_figures(const std::vector<SourceFigure>& figures, double busy) {
  std::string stages, others;
  for (const SourceFigure& f : figures) {
    if (!f.stage.empty()) {
      stages += (stages.empty() ? "" : ", ") + f.stage + " " + pct(std::min(1.0, f.value / busy)) +
                (stages.empty() ? " of the workers' busy time" : "");
      continue;
    }
    char value[64];
    std::snprintf(value, sizeof value, "%.3g", f.value);
    others += (others.empty() ? "" : ", ") + f.name + " " + value + (f.unit.empty() ? "" : " " + f.unit);
  }
  return others.empty() ? stages : stages + "; " + others;
}

}  // namespace

GpuSampler::Reader GpuSampler::nvml(int cuda_device) {
  Nvml& n = nvml_library();
  Nvml::Device device = n.device(cuda_device);
  return [&n, device]() -> std::optional<GpuReading> {
    if (device == nullptr) return std::nullopt;
    Nvml::Utilization u{};
    Nvml::Memory m{};
    if (n.utilization(device, &u) != 0 || n.memory(device, &m) != 0) return std::nullopt;
    return GpuReading{u.gpu / 100.0, m.used, m.total};
  };
}

GpuSampler::GpuSampler(Reader reader, std::chrono::milliseconds period)
    : reader_(std::move(reader)) {
  if (period.count() <= 0) return;
  sample();
  thread_ = std::thread([this, period] {
    std::unique_lock lock(mu_);
    while (!stopping_.wait_for(lock, period, [this] { return stopped_; })) {
      lock.unlock();
      sample();
      lock.lock();
    }
  });
}

GpuSampler::~GpuSampler() { stop(); }

void GpuSampler::sample() {
  if (!reader_) return;
  if (std::optional<GpuReading> r = reader_()) add(*r);
}

void GpuSampler::add(const GpuReading& r) {
  std::lock_guard lock(mu_);
  if (stopped_) return;
  ++figures_.samples;
  figures_.present = true;
  utilization_sum_ += std::clamp(r.utilization, 0.0, 1.0);
  figures_.utilization = utilization_sum_ / figures_.samples;
  figures_.memory_used = std::max(figures_.memory_used, r.memory_used);
  figures_.memory_total = r.memory_total;
}

GpuFigures GpuSampler::stop() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return figures_;
  }
  sample();
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  stopping_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mu_);
  return figures_;
}

static std::string network_figures(const NetworkFigures& n) {
  char buf[240];
  const double mb = static_cast<double>(n.bytes_fetched) / 1e6;
  std::snprintf(
      buf, sizeof buf,
      "network: %.1f MB fetched in %.2f s with a fetch in flight (%.1f MB/s), %llu "
      "requests; cache hit rate %s of %llu shard reads",
      mb, n.network_seconds, n.network_seconds > 0 ? mb / n.network_seconds : 0.0,
      static_cast<unsigned long long>(n.requests),
      n.first_reads ? pct(static_cast<double>(n.cache_hits) / n.first_reads).c_str() : "n/a",
      static_cast<unsigned long long>(n.first_reads));
  return buf;
}

Diagnosis diagnose(const DiagnosisInputs& in, const DiagnosisRules& rules) {
  Diagnosis d;
  const double wall = std::max(in.wall_seconds, 1e-9);
  d.wait_fraction = std::clamp(in.consumer_wait_seconds / wall, 0.0, 1.0);
  d.reasons.push_back("the consumer waited for data " + pct(d.wait_fraction) + " of the time");
  const StageFigures* workers = stage(in, "workers");
  const double worker_time = workers ? std::max(wall * std::max(workers->threads, 1), 1e-9) : wall;
  const double buffer_wait = std::clamp(in.buffer_wait_seconds / worker_time, 0.0, 1.0);

  // 1. Memory.
  const bool host_high =
      in.physical_memory_bytes > 0 && in.rss_bytes >= rules.memory_high * in.physical_memory_bytes;
  const bool pinned_high =
      in.pinned_budget_bytes > 0 && in.pinned_bytes >= rules.memory_high * in.pinned_budget_bytes;
  const bool buffers_high =
      in.memory_budget > 0 && in.buffer_bytes_peak >= rules.memory_high * in.memory_budget &&
      buffer_wait > rules.buffer_wait_high && d.wait_fraction > rules.wait_high;
  if (host_high || pinned_high || buffers_high) {
    d.verdict = "memory-bound";
    d.limiting_stage = "memory";
    if (host_high)
      d.reasons.push_back("host RSS " + mib(in.rss_bytes) + " is " +
                          pct(double(in.rss_bytes) / in.physical_memory_bytes) +
                          " of physical memory");
    if (pinned_high)
      d.reasons.push_back("pinned memory " + mib(in.pinned_bytes) + " is near its budget of " +
                          mib(in.pinned_budget_bytes));
    if (buffers_high)
      d.reasons.push_back("batch buffers peaked at " + mib(in.buffer_bytes_peak) + " of a " +
                          mib(in.memory_budget) + " budget and workers waited for a free buffer " +
                          pct(buffer_wait) + " of their time");
    d.action =
        "memory is the limit: raise memory_budget if the host has room, lower prefetch_factor or "
        "batch_size, release batches sooner in the training step, or store/decode smaller "
        "samples (reduced-size decode, uint8 until the GPU)";
    return d;
  }

  const std::string gpu_figures =
      in.gpu_present ? "GPU busy " + pct(in.gpu_utilization) + " of the time (NVML), memory " +
                           mib(in.gpu_memory_used) + " of " + mib(in.gpu_memory_total)
                     : "";
  const bool gpu_saturated = in.gpu_present && in.gpu_utilization >= rules.gpu_busy_high;

  // 2. Input.
  if (d.wait_fraction > rules.wait_high && !gpu_saturated) {
    d.verdict = "input-bound";
    d.limiting_stage = "workers";
    double cpu_ratio = 1;
    if (workers) {
      cpu_ratio = workers->busy_seconds > 0 ? workers->cpu_seconds / workers->busy_seconds : 1;
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "workers (read+decode+transform, fused): %d thread(s), %.0f samples/s, "
                    "%.2f CPU s over %.2f busy s",
                    workers->threads, workers->samples_per_s, workers->cpu_seconds,
                    workers->busy_seconds);
      d.reasons.push_back(buf);
    }
    if (in.gpu_present)
      d.reasons.push_back(gpu_figures + ": idle " + pct(1 - in.gpu_utilization) + " of the time");
    double util = 0;
    for (double u : in.core_utilization) util += u;
    if (!in.core_utilization.empty()) {
      util /= in.core_utilization.size();
      d.reasons.push_back("CPU utilization " + pct(util) + " averaged over " +
                          std::to_string(in.core_utilization.size()) + " cores");
    }
    const NetworkFigures& net = in.network;
    if (net.present) d.reasons.push_back(network_figures(net));
    const double busy = workers ? workers->busy_seconds : 0;
    if (net.present && busy > 0 && net.wait_seconds / busy > rules.network_wait_high) {
      d.limiting_stage = "network";
      d.reasons.push_back("workers spent " + pct(std::min(1.0, net.wait_seconds / busy)) +
                          " of their busy time waiting for shards to arrive");
      d.action =
          "the network is the bottleneck: give the cache room for the whole dataset "
          "(cache_budget) so that later epochs read local copies, fetch more shards at once "
          "(more fetchers, larger parts), or run closer to the bucket";
    } else if (cpu_ratio < rules.cpu_bound) {
      d.reasons.push_back("workers spent " + pct(1 - cpu_ratio) +
                          " of their busy time off-CPU (waiting on I/O)");
      d.action =
          "the workers wait on storage: raise num_workers (threads overlap I/O), use faster "
          "storage or page cache, or cache decoded data";
    } else if (const SourceFigure* top = busiest_stage(in.source_figures);
               top && busy > 0 && top->value / busy > rules.stage_high) {
      d.limiting_stage = top->stage;
      d.reasons.push_back(stage_figures(in.source_figures, busy));
      const bool idle = workers && workers->threads < in.usable_cores && util < 0.85;
      d.action = (idle ? top->stage + " is the bottleneck and cores are idle: raise num_workers to " +
                             std::to_string(in.usable_cores) + " (or \"auto\"); then "
                       : top->stage + " is the bottleneck on every core: ") +
                 top->advice;
    } else if (workers && workers->threads < in.usable_cores && util < 0.85) {
      d.action = "the workers are CPU-bound and cores are idle: raise num_workers to " +
                 std::to_string(in.usable_cores) +
                 " (or \"auto\"); then reduced-size decode, lighter augmentation, or caching "
                 "decoded data";
    } else {
      d.action =
          "the workers are CPU-bound on every core: more cores, reduced-size decode (decode "
          "JPEGs at a smaller scale), lighter augmentation, or cache decoded data";
    }
    return d;
  }

  // 3. Compute.
  d.verdict = "compute-bound";
  d.limiting_stage = "consumer";
  if (in.network.present) d.reasons.push_back(network_figures(in.network));
  if (const StageFigures* c = stage(in, "consumer")) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "consumer step: %.0f samples/s, busy %.0f%% of the time",
                  c->samples_per_s, 100 * std::min(1.0, c->busy_seconds / wall));
    d.reasons.push_back(buf);
  }
  if (in.gpu_present) d.reasons.push_back(gpu_figures);
  if (gpu_saturated && d.wait_fraction > rules.wait_high)
    d.reasons.push_back(
        "the consumer's waits for data overlapped GPU work it had already queued (the GPU never "
        "ran dry): faster input would not speed up training");
  if (in.gpu_present && in.gpu_utilization < rules.gpu_idle_low) {
    d.action = "the input pipeline keeps up, but the GPU is idle " + pct(1 - in.gpu_utilization) +
               " of the time: the step's host side starves it (Python overhead, many small kernel "
               "launches, synchronizations such as .item(), .cpu() or printing losses every step): "
               "CUDA graphs or torch.compile, fewer synchronizations, a larger batch";
  } else {
    d.action =
        "the input pipeline keeps up; speed up the model: mixed precision (torch.autocast), "
        "torch.compile, a larger batch, or fewer host-device synchronizations";
  }
  return d;
}

SystemSample read_system() {
  SystemSample s;
  std::ifstream stat("/proc/stat");
  std::string line;
  while (std::getline(stat, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 ||
        !isdigit(static_cast<unsigned char>(line[3])))
      continue;
    std::istringstream is(line.substr(line.find(' ')));
    uint64_t v[10] = {};
    for (uint64_t& x : v) is >> x;
    uint64_t total = 0;
    for (int i = 0; i < 8; ++i) total += v[i];  // guest time is already in user/nice
    const uint64_t idle = v[3] + v[4];
    s.core_total.push_back(total);
    s.core_busy.push_back(total - idle);
  }
  std::ifstream status("/proc/self/status");
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) s.rss_bytes = std::stoull(line.substr(6)) * 1024;
  return s;
}

std::vector<double> core_utilization(const SystemSample& a, const SystemSample& b) {
  std::vector<double> out;
  const size_t n = std::min(a.core_total.size(), b.core_total.size());
  for (size_t i = 0; i < n; ++i) {
    const double total = double(b.core_total[i]) - double(a.core_total[i]);
    const double busy = double(b.core_busy[i]) - double(a.core_busy[i]);
    out.push_back(total > 0 ? std::clamp(busy / total, 0.0, 1.0) : 0.0);
  }
  return out;
}

}  // namespace stoker
