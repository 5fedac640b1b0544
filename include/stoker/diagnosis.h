// Diagnosis of a training input pipeline: from measured figures to a verdict and an action.
//
// Stoker's stages are fused: one worker thread reads, decodes, transforms and collates a sample
// into its batch slot. The stages diagnosed are therefore "workers" (the whole fused pipeline)
// and "consumer" (the training step). The rules, in order:
// 1. memory-bound: host RSS >= memory_high of physical memory, or pinned bytes >= memory_high of
//    the pinned budget, or batch buffers at the memory budget while workers spent more than
//    buffer_wait_high of their time waiting for a free buffer and the consumer waited for data.
// 2. input-bound: the consumer waited for data more than wait_high of the wall time. The limiting
//    stage is "workers"; the action depends on whether the workers are CPU-bound (their CPU time
//    close to their busy time: more cores, reduced-size decode, lighter augmentation, cache
//    decoded data) or stalled (I/O: more workers, faster storage, caching).
// 3. compute-bound: otherwise. The pipeline is fine; speed up the model.
//
// Also here: read_system() samples /proc (per-core CPU times, RSS) and the GPU through NVML
// (libnvidia-ml.so.1, loaded at run time; absent = no GPU figures).
//
// Thread safety: all functions are reentrant.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace stoker {

struct StageFigures {
  std::string name;  // "workers" or "consumer"
  int threads = 0;
  double samples_per_s = 0;  // throughput of the stage over the run
  double busy_seconds = 0;   // wall time spent working (summed over threads)
  double cpu_seconds = 0;    // CPU time (summed over threads)
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
  double gpu_utilization = 0;  // 0..1
  uint64_t gpu_memory_used = 0, gpu_memory_total = 0;
};

struct DiagnosisRules {
  double wait_high = 0.10;         // consumer wait fraction above which the run is input-bound
  double memory_high = 0.90;       // fraction of a memory limit counted as "near"
  double buffer_wait_high = 0.25;  // worker time waiting for buffers that signals memory limits
  double cpu_bound = 0.75;         // worker cpu/busy above which the workers are CPU-bound
};

struct Diagnosis {
  std::string verdict;         // "input-bound", "compute-bound" or "memory-bound"
  std::string limiting_stage;  // "workers", "consumer" or "memory"
  std::string action;
  double wait_fraction = 0;
  std::vector<std::string> reasons;  // the figures behind the verdict, in words
};

Diagnosis diagnose(const DiagnosisInputs& in, const DiagnosisRules& rules = {});

struct SystemSample {
  std::vector<uint64_t> core_busy, core_total;  // jiffies per core (/proc/stat)
  uint64_t rss_bytes = 0;                       // /proc/self/status VmRSS
  bool gpu_present = false;
  double gpu_utilization = 0;
  uint64_t gpu_memory_used = 0, gpu_memory_total = 0;
};

SystemSample read_system();
// Utilization 0..1 of each core between two samples.
std::vector<double> core_utilization(const SystemSample& before, const SystemSample& after);

// CPU time of the calling thread, in nanoseconds.
int64_t thread_cpu_ns();

}  // namespace stoker
