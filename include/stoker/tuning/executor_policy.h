// num_workers="auto" for a Python dataset: whether workers pay, decided from measured timings.
// The third tuner beside the offline sweep (tuner.h) and the online controller (autotune.h): it
// decides once, at the start, where a Python dataset's samples are produced.
//
// The training process produces an epoch's first batches itself (torch's num_workers=0 semantics)
// and feeds the policy what it measured: the seconds a sample took (the faster of two timed chunks
// of the first batch: the first chunk pays one-time costs; then the fastest batch so far), and,
// for a dataset that allows it, how fast two threads went side by side. The policy answers with a
// decision: stay in this process, start worker processes, or start worker threads. It decides
// from those numbers alone (no clock of its own), so its tests feed it synthetic timings.
//
// Why these thresholds (measured on the light and heavy benches, bench/bench_python_datasets.py):
// a fork costs the parent its page tables' copy (~7 ms for 300 MB) and the child its first
// copy-on-write faults, and a second process's RSS, which a short epoch does not win back (forked
// after the second batch of the light bench's 0.25 s epoch: 564k against 565k samples/s, 164 MiB
// more RSS). So processes start at once when the rest of the first batch alone would take over
// kForkNowS, or later when the rest of the epoch would take over kForkEpochS (kForkPersistentS
// with persistent workers, whose start is paid once for every later epoch). A worker that is
// spawned (or forked by a forkserver) imports torch first: its start costs kSpawnStartS more.
// Threads win when two threads together take under kThreadGain of one thread's time a sample (the
// work releases the GIL).
// How many processes: the training process produces too while it waits for a batch, so cores - 1
// workers fill the machine when batches are quick to make. When one batch takes this process
// over kHelpBatchS to make, a batch it is making holds up the ones workers finished meanwhile (a
// Hugging Face image dataset, 64 samples of ~4 ms: 1 worker + this process made 0.88x of 2
// workers' images/s on 2 cores, bench/bench_tables.py), so it starts one worker a core (and the
// front's training process then only waits: python/stoker/pydata/producer.py).
//
// Thread safety: not thread-safe; one per loader.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

namespace stoker {

struct ExecutorDecision {
  enum class Kind { kStay, kProcesses, kThreads };
  Kind kind = Kind::kStay;
  int workers = 0;
  std::string reason;
};

// "stay", "processes" or "threads".
const char* executor_kind_name(ExecutorDecision::Kind kind);

class ExecutorPolicy {
 public:
  static constexpr double kForkNowS = 0.02;
  static constexpr double kForkEpochS = 0.5;
  static constexpr double kForkPersistentS = 0.1;
  static constexpr double kSpawnStartS = 2.0;
  static constexpr double kThreadGain = 0.75;
  static constexpr double kHelpBatchS = 0.05;

  // `cores`: usable cores (below 1 counts as 1). Processes: cores - 1 workers (the training
  // process keeps producing while it waits), at least 1, or cores when a batch of `batch_size`
  // samples at the measured pace takes over kHelpBatchS; threads: cores. `forked`: workers start
  // by fork (else spawn or forkserver). `persistent`: workers are kept for later epochs.
  // `threads_allowed`: the dataset may run on threads (it declares thread_safe = True; no
  // per-sample seeding).
  explicit ExecutorPolicy(int cores, bool forked = true, bool persistent = false,
                          bool threads_allowed = false, int batch_size = 1);

  // The decision to stay ("the measured work does not pay for workers").
  static ExecutorDecision stay();

  int cores() const { return cores_; }
  double start_s() const { return start_s_; }  // what a worker's start costs beyond a fork
  bool persistent() const { return persistent_; }
  bool threads_allowed() const { return threads_allowed_; }
  double pace() const { return pace_; }  // the fastest seconds a sample measured so far

  bool wants_thread_trial() const { return threads_allowed_ && cores_ > 1; }
  // After two timed chunks of the first batch: processes now when the batch's rest alone pays
  // for them.
  ExecutorDecision first_chunks(double seconds_per_sample, double rest_of_batch);
  // After two threads produced chunks side by side: seconds a sample on one thread (the pace so
  // far) and on two at once (wall time over the samples both produced).
  ExecutorDecision thread_trial(double one_thread_s, double two_threads_s) const;
  // After a batch produced here: processes (for the batches after it) when the rest of the epoch
  // at the fastest pace so far pays for them.
  ExecutorDecision after_batch(double seconds_per_sample, double samples_left);

 private:
  ExecutorDecision processes(std::string reason) const;

  int cores_;
  int batch_size_;
  double start_s_;
  bool persistent_, threads_allowed_;
  double pace_ = std::numeric_limits<double>::infinity();
};

}  // namespace stoker
