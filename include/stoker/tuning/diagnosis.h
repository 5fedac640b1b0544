// Diagnosis of a training input pipeline: from measured figures to a verdict and an action.
//
// Stoker's stages are fused: one worker thread reads, decodes, transforms and collates a sample
// into its batch slot. The stages diagnosed are therefore "workers" (the whole fused pipeline)
// and "consumer" (the training step). The rules, in order:
// 1. memory-bound: host RSS >= memory_high of physical memory, or pinned bytes >= memory_high of
//    the pinned budget, or batch buffers at the memory budget while workers spent more than
//    buffer_wait_high of their time waiting for a free buffer and the consumer waited for data.
// 2. input-bound: the consumer waited for data more than wait_high of the wall time, and the GPU
//    (when figures exist) was busy less than gpu_busy_high of it. The limiting stage is
//    "workers"; the action depends on whether the workers are CPU-bound (their CPU time close to
//    their busy time: more cores, reduced-size decode, lighter augmentation, cache decoded data)
//    or stalled (I/O: more workers, faster storage, caching). When the dataset is remote and its
//    workers spent more than network_wait_high of their busy time waiting for shards to arrive,
//    the limiting stage is "network" (the action: a larger cache, more concurrent fetches, data
//    closer to the job). When CPU-bound workers spent more than stage_high of their busy time
//    in one stage that the dataset names among its figures (a video's "decode", say), that
//    stage limits, and the action is the dataset's advice for it (idle cores first). The
//    diagnosis knows no dataset: what a stage is called and what to do about it come with the
//    figures.
// 3. compute-bound: otherwise. The pipeline is fine; speed up the model. A consumer that waited
//    while the GPU stayed busy >= gpu_busy_high is compute-bound too: the host ran ahead of the
//    GPU (kernels are queued asynchronously) and its waits overlapped queued GPU work. When the
//    consumer hardly waited but the GPU was busy less than gpu_idle_low, the action says that the
//    step's host side (Python, kernel launches, synchronizations) starves the GPU.
//
// Also here: read_system() samples /proc (per-core CPU times, RSS), and GpuSampler averages a
// GPU's utilization and memory over a run through NVML (libnvidia-ml.so.1, loaded at run time;
// absent = no GPU figures).
//
// Thread safety: all functions are reentrant; a GpuSampler is used by one thread (its own
// sampling thread aside).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace stoker {

struct StageFigures {
  std::string name;  // "workers" or "consumer"
  int threads = 0;
  double samples_per_s = 0;  // throughput of the stage over the run
  double busy_seconds = 0;   // wall time spent working (summed over threads)
  double cpu_seconds = 0;    // CPU time (summed over threads)
};

// A remote dataset's shard traffic over the run (ShardCacheStats deltas).
struct NetworkFigures {
  bool present = false;        // the dataset is remote
  uint64_t bytes_fetched = 0;  // downloaded
  double network_seconds = 0;  // wall time with a fetch in flight
  double wait_seconds = 0;     // worker time blocked waiting for a shard (summed)
  uint64_t first_reads = 0;    // shards read for the first time in their schedule
  uint64_t cache_hits = 0;     // of those, local when the schedule began
  uint64_t requests = 0;       // object-store requests
};

// One figure a dataset reports of its own work over the run (the difference of two readings),
// named and with its unit, so that the diagnosis repeats it without knowing the dataset. A figure
// with a `stage` is worker time (unit "s", summed over threads) spent in that stage of the fused
// pipeline ("decode", "resample", "tokenize"), and `advice` says what to do when it limits.
struct SourceFigure {
  std::string name;  // "frames decoded per frame delivered"
  double value = 0;
  std::string unit;    // "s", "frames", "" for a ratio
  std::string stage;   // empty: a figure reported, not a stage's time
  std::string advice;  // for a stage: the action when it is the bottleneck
};

struct DiagnosisInputs {
  double wall_seconds = 0;
  double consumer_wait_seconds = 0;  // consumer time blocked waiting for the next batch
  double buffer_wait_seconds = 0;    // worker time blocked waiting for a free buffer
  std::vector<StageFigures> stages;
  std::vector<double> core_utilization;  // 0..1 per core over the run
  int usable_cores = 1;
  uint64_t rss_bytes = 0;
  uint64_t physical_memory_bytes = 0;
  uint64_t pinned_bytes = 0;
  uint64_t pinned_budget_bytes = 0;  // 0 = no pinned budget
  uint64_t buffer_bytes_peak = 0;
  uint64_t memory_budget = 0;
  bool gpu_present = false;
  double gpu_utilization = 0;                          // 0..1, mean over the run
  uint64_t gpu_memory_used = 0, gpu_memory_total = 0;  // peak used over the run
  NetworkFigures network;
  std::vector<SourceFigure> source_figures;  // the dataset's own, in its order
};

struct DiagnosisRules {
  double wait_high = 0.10;          // consumer wait fraction above which the run is input-bound
  double memory_high = 0.90;        // fraction of a memory limit counted as "near"
  double buffer_wait_high = 0.25;   // worker time waiting for buffers that signals memory limits
  double cpu_bound = 0.75;          // worker cpu/busy above which the workers are CPU-bound
  double gpu_busy_high = 0.90;      // GPU utilization at which the GPU is the limit
  double gpu_idle_low = 0.50;       // GPU utilization below which the GPU mostly waits
  double network_wait_high = 0.30;  // worker busy time waiting for shards: the network limits
  double stage_high = 0.50;  // worker busy time in one of the dataset's stages: that stage limits
};

struct Diagnosis {
  std::string verdict;         // "input-bound", "compute-bound" or "memory-bound"
  // "workers", "network", "consumer", "memory", or a stage the dataset's figures name
  std::string limiting_stage;
  std::string action;
  double wait_fraction = 0;
  std::vector<std::string> reasons;  // the figures behind the verdict, in words
};

Diagnosis diagnose(const DiagnosisInputs& in, const DiagnosisRules& rules = {});

struct SystemSample {
  std::vector<uint64_t> core_busy, core_total;  // jiffies per core (/proc/stat)
  uint64_t rss_bytes = 0;                       // /proc/self/status VmRSS
};

SystemSample read_system();
// Utilization 0..1 of each core between two samples.
std::vector<double> core_utilization(const SystemSample& before, const SystemSample& after);

// One reading of a GPU: utilization 0..1 (the fraction of NVML's last sample period, 1/6 s to 1 s
// depending on the product, during which a kernel ran) and memory in bytes (all processes).
struct GpuReading {
  double utilization = 0;
  uint64_t memory_used = 0, memory_total = 0;
};

// A GPU's figures over a run.
struct GpuFigures {
  bool present = false;                        // at least one reading
  int samples = 0;                             // readings taken
  double utilization = 0;                      // mean of the readings
  uint64_t memory_used = 0, memory_total = 0;  // peak used; total
};

// Samples a GPU over a run: a reading every `period` on a thread of its own, and one at stop().
// NVML's utilization covers only its last sample period, so a run's figure must be a mean of
// readings taken during the run, not one reading at its end.
class GpuSampler {
 public:
  // One reading; nullopt when there is nothing to read (no NVML, no GPU, a failed call).
  using Reader = std::function<std::optional<GpuReading>()>;
  // NVML's reader for CUDA device `cuda_device`, found by PCI bus id (NVML numbers devices its
  // own way, ignoring CUDA_VISIBLE_DEVICES); by NVML index when the CUDA driver is absent.
  static Reader nvml(int cuda_device);

  // period 0: no thread; the caller takes readings with sample().
  GpuSampler(Reader reader, std::chrono::milliseconds period);
  ~GpuSampler();
  GpuSampler(const GpuSampler&) = delete;
  GpuSampler& operator=(const GpuSampler&) = delete;

  void sample();
  // Takes a last reading, stops the thread and returns the figures. Later calls return the same.
  GpuFigures stop();

 private:
  void add(const GpuReading& r);

  const Reader reader_;
  std::mutex mu_;
  std::condition_variable stopping_;
  bool stopped_ = false;        // guarded by mu_
  GpuFigures figures_;          // guarded by mu_
  double utilization_sum_ = 0;  // guarded by mu_
  // Last member: started after everything it uses, joined in stop().
  std::thread thread_;
};

}  // namespace stoker
