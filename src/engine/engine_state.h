// Internal: what a Engine shares with its iterators.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <stop_token>

#include "engine/autotune.h"
#include "engine/skip_policy.h"
#include "stoker/batch_transform.h"
#include "stoker/block_order.h"
#include "stoker/engine.h"
#include "stoker/epoch_draws.h"
#include "stoker/mixture.h"
#include "stoker/order.h"
#include "stoker/stratified_order.h"

namespace stoker {

// Autotune decisions kept, the newest: for stats() and for the consumer's log (drain_decisions).
inline constexpr size_t kAutotuneDecisionsKept = 200;

// A list of autotune decisions bounded to the newest kAutotuneDecisionsKept: a loader's (stats())
// and an iterator's not yet drained. Not thread-safe: its owner's lock guards it.
class DecisionLog {
 public:
  void add(const AutotuneDecision& d) {
    log_.push_back(d);
    if (log_.size() > kAutotuneDecisionsKept) log_.pop_front();
  }
  std::vector<AutotuneDecision> list() const { return {log_.begin(), log_.end()}; }
  std::vector<AutotuneDecision> drain() {
    std::vector<AutotuneDecision> out(log_.begin(), log_.end());
    log_.clear();
    return out;
  }

 private:
  std::deque<AutotuneDecision> log_;
};

// Counts the buffers of a loader's batches that are out of its pool (being filled, ready, or held
// by the consumer), so that an autotuned depth can count the consumer's batches in its window:
// a worker enters before it takes a buffer for a new batch, and the batch's buffer leaves when
// its last user (a tensor the consumer dropped) lets go. Safe from any thread.
class BufferGate {
 public:
  // Waits until fewer than the limit are out, or until the consumer waits for this very batch
  // (force), then counts one more. `owner` and `batch` name the batch the caller opens. False
  // when stopped.
  bool enter(std::stop_token stop, const void* owner, uint64_t batch) {
    std::unique_lock lock(mu_);
    auto forced = [&] { return forced_owner_ == owner && forced_batch_ == batch; };
    if (!changed_.wait(lock, stop, [&] { return out_ < limit_ || forced(); })) return false;
    if (forced()) forced_owner_ = nullptr;
    ++out_;
    return true;
  }
  // Lets batch `batch` of `owner` in whatever the count: the consumer waits for it and nobody
  // has opened it. A consumer that keeps batches (the last one of an epoch, a few for logging)
  // must slow the prefetch down, never stop the batch it waits for. Naming the batch keeps a
  // force that came late from letting a later batch in.
  void force(const void* owner, uint64_t batch) {
    {
      std::lock_guard lock(mu_);
      forced_owner_ = owner;
      forced_batch_ = batch;
    }
    changed_.notify_all();
  }
  // Forgets a force of `owner` (an iterator that ends).
  void forget(const void* owner) {
    std::lock_guard lock(mu_);
    if (forced_owner_ == owner) forced_owner_ = nullptr;
  }
  void leave() {
    {
      std::lock_guard lock(mu_);
      --out_;
    }
    changed_.notify_all();
  }
  void set_limit(uint64_t limit) {
    {
      std::lock_guard lock(mu_);
      limit_ = limit;
    }
    changed_.notify_all();
  }
  // `buffer`, which leaves the gate when its last owner drops it. REQUIRES: entered for it.
  static Buffer wrap(std::shared_ptr<BufferGate> gate, Buffer buffer) {
    std::byte* p = buffer.get();
    return Buffer(p, [gate = std::move(gate), inner = std::move(buffer)](std::byte*) mutable {
      inner.reset();  // back to the pool first, so the next enter finds it free
      gate->leave();
    });
  }

 private:
  std::mutex mu_;
  std::condition_variable_any changed_;
  uint64_t out_ = 0;                    // guarded by mu_
  uint64_t limit_ = UINT64_MAX;         // guarded by mu_
  const void* forced_owner_ = nullptr;  // guarded by mu_; with forced_batch_: the forced entry
  uint64_t forced_batch_ = 0;           // guarded by mu_
};

struct Engine::State {
  std::shared_ptr<const Source> source;
  EngineOptions options;  // resolved: no "auto" left
  // Every epoch's plan, unless an iteration is given another.
  BatchPlan plan;
  std::optional<StratifiedPlan> stratified;  // with options.classes
  // With options.mixture: the samples of each source delivered, one counter per source.
  std::unique_ptr<std::atomic<uint64_t>[]> mixture_samples;
  // Shuffled, unstratified: the shards (shard_window) or blocks of the source and the window.
  std::optional<Source::Blocks> blocks;
  std::vector<size_t> field_offsets;  // byte offset of each field's array in a batch buffer
  std::vector<size_t> sample_bytes;   // bytes of one sample of each field (ragged: one row)
  // of a batch: the source's, then "lengths" (a source with ragged fields) or the transform's
  std::vector<FieldSpec> fields;
  // Ragged fields (source.h), by group: the lengths field the engine adds, the group's first
  // field, and the most elements of its fields' first dimension a buffer holds (count x padded
  // length). Empty without ragged fields.
  struct RaggedGroup {
    size_t lengths_field = 0;
    size_t first_field = 0;
    uint64_t capacity = 0;
  };
  std::vector<RaggedGroup> ragged;
  // Sample i's length in ragged group g.
  uint64_t length_of(uint64_t i, uint32_t g) const {
    return g == 0 ? source->length(i) : source->group_length(i, g);
  }
  // Bucketed fields (source.h): whether the source has any.
  bool bucketed = false;
  // Over the batches delivered: a ragged source's rows, and its padded rows (count x padded).
  std::atomic<uint64_t> ragged_rows{0}, ragged_padded_rows{0};
  // With options.batch_transform: the source's fields it reads (the soft labels are the last).
  BatchTransform::Fields mix_fields;
  std::shared_ptr<BatchPool> pool;

  State(std::shared_ptr<const Source> source, const EngineOptions& options);

  // A Batch for batch `b` of `plan` (drawn by `draws`) in `epoch` whose fields point into
  // `buffer`: batch_length samples, ragged fields padded to their longest.
  std::shared_ptr<Batch> make_batch(const BatchPlan& plan, const EpochDraws& draws, uint64_t epoch,
                                    uint64_t b, Buffer buffer) const;
  // The order of `epoch`; a mixture's follows `mixture`, or, when null, its default plan. A
  // block order is arranged for `stripes` ranks (0: options.stripes). A stratified order follows
  // the loader's own plan (or a strided view of it), a mixture's its MixturePlan::batches().
  EpochDraws epoch_draws(uint64_t epoch, std::shared_ptr<const MixturePlan> mixture = nullptr,
                         uint64_t stripes = 0) const;
  // Writes samples [begin, end) of `batch` (a batch of `plan`) into their slots (several threads
  // may fill disjoint ranges of one batch). Throws SampleError; *failed_at (if given) is then the
  // position in the batch of the sample that failed.
  void fill(Batch& batch, const BatchPlan& plan, const EpochDraws& draws, WorkerState* worker,
            uint64_t begin, uint64_t end, uint64_t* failed_at = nullptr);

  // Runs the batch transform (if any) on `batch`, a batch of `plan` whose samples are all read.
  // Throws SampleError for a label the transform has no class for.
  void transform(Batch& batch, const BatchPlan& plan, const EpochDraws& draws);

  // Counts a batch of `draws`' order delivered to the consumer.
  void delivered(const EpochDraws& draws, const Batch& batch);

  // The source's worker states, kept from one epoch to the next (a video worker's open decoder
  // and conversion contexts, an image worker's scratch: what an epoch would otherwise build
  // again): an epoch's worker takes one (made by the source when none is kept; that may throw)
  // and keeps it again when it ends. At most max(1, options.num_workers) are kept. Thread-safe.
  std::unique_ptr<WorkerState> take_worker_state();
  void keep_worker_state(std::unique_ptr<WorkerState> state);

  // Statistics, updated once per batch.
  std::atomic<uint64_t> batches{0}, samples{0};
  SkippedSamples skipped;
  std::atomic<int64_t> read_ns{0}, buffer_wait_ns{0}, consumer_wait_ns{0};
  std::atomic<int64_t> worker_cpu_ns{0};
  std::atomic<int64_t> transform_ns{0};

  // Online autotune: which knobs were "auto", and the controller's values, carried from one
  // iterator (epoch) to the next and, under autotune_key, to the next loader on the same data.
  // pin_memory = kOn was asked without a CUDA device: the buffers are pageable (resolve_pinned).
  bool pin_unavailable = false;
  bool autotune_workers = false, autotune_prefetch = false;
  bool autotune_shared_depth = false;  // large batches: prefetch = batches in flight, all workers
  // With autotune_shared_depth: the depth's window counts the consumer's buffers too.
  const std::shared_ptr<BufferGate> buffer_gate = std::make_shared<BufferGate>();
  std::string autotune_key;
  const std::chrono::steady_clock::time_point created = std::chrono::steady_clock::now();
  mutable std::mutex autotune_mu;
  int autotune_active = 1;                             // guarded by autotune_mu
  int autotune_prefetch_now = kDefaultPrefetchFactor;  // guarded by autotune_mu
  DecisionLog autotune_log;                            // guarded by autotune_mu
  void record_autotune(const AutotuneDecision& d);

 private:
  std::mutex worker_states_mu_;
  std::vector<std::unique_ptr<WorkerState>> worker_states_;  // guarded by worker_states_mu_

  // Reads sample `index` into `slots`, replacing it under on_error = kSkip by a sample of at most
  // `rows[g]` rows in each ragged group g (a ragged batch's padded lengths) and of bucket
  // `bucket` (a bucketed batch's; UINT64_MAX: any); the sample read.
  uint64_t read_sample(uint64_t epoch, uint64_t index, std::span<std::byte* const> slots,
                       WorkerState* worker, std::span<const uint64_t> rows, uint64_t bucket);
};

// Iterator factories (epoch_iterator.cc).
std::unique_ptr<EpochIterator> make_inline_iterator(std::shared_ptr<Engine::State> state,
                                                    const BatchPlan& plan, EpochDraws draws,
                                                    uint64_t epoch, uint64_t start_batch);
std::unique_ptr<EpochIterator> make_threaded_iterator(std::shared_ptr<Engine::State> state,
                                                      const BatchPlan& plan, EpochDraws draws,
                                                      uint64_t epoch, uint64_t start_batch);

inline int64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              since)
      .count();
}

}  // namespace stoker
