// The engine: turns a Source into an ordered stream of batches, produced ahead of the consumer by
// worker threads (the Python front's DataLoader drives one per loader of a Stoker dataset).
//
// Semantics
// - Order: an epoch's batches depend only on (seed, epoch, rank, world_size, batch_size, drop_last,
//   shuffle, repeats, classes, class_weights; a block order's shard_window and stripes; a
//   mixture's plan; the batch transform), never on
//   num_workers or prefetch depth: batch b of an epoch is bit-identical however it was produced.
//   Batches are delivered in order.
// - Randomness: sample i of epoch e draws its randomness (augmentation) from (seed, e, i); in a
//   stratified order from (seed, cycle, i), the draw's cycle through its class
//   (StratifiedEpoch::batch), which is e without class weights, and differs between the
//   repeats of an oversampled sample. With repeats = k, copy r of sample i draws from
//   (seed, e * k + r, i) (order.h, repeated_position).
//   In a mixture, sample j of source c is keyed by (mixture_source_seed(seed, c), k, j), k the
//   source's own epoch (mixture.h).
// - Repeats (repeated augmentation, DeiT's RASampler): with repeats = k every sample appears k
//   times an epoch, at k consecutive positions of the epoch's global order (order.h), so the
//   plan, num_batches() and resume positions count n * k samples. Not with a stratified order,
//   class weights or a mixture (InvalidArgument).
// - Batch transform (batch_transform.h): a batch whose samples all read is transformed by the
//   worker thread that finished it (on_error's replacements included), before it is ready; the
//   consumer's thread never runs it. Its parameters are keyed by (seed, epoch,
//   plan.first_position(b)). The batch holds the source's fields, then the transform's
//   "soft_label" field. A label outside the transform's classes fails the batch with a
//   SampleError naming the sample (whatever on_error: it is a setting, not bad data).
// - Resume: iterate(epoch, start_batch) yields exactly the batches from start_batch on of that
//   epoch; the state to resume from is three numbers. A job with another world size resumes the
//   epoch from the global position the old job reached (BatchPlan::position_after) with a plan
//   that starts there: iterate(epoch, 0, BatchPlan(..., start)). A block order (shard_window,
//   or a source with blocks) is arranged for a world size (stripes): the resumed epoch must keep
//   the one it started with (iterate's `stripes`) for the rest to be its exact complement.
// - Budget (budget.h): with options.budget, batches are a BudgetPlan's: iterate() takes the epoch's
//   BudgetEpoch (this rank's batches, every rank as many), a batch holds batch_length samples,
//   and its ragged fields are padded to its longest sample (source.h). Without a budget, a
//   source's ragged fields are padded to each batch's longest too.
// - Memory: batch buffers come from one BatchPool bounded by memory_budget. A batch's buffer goes
//   back to the pool when the last reference to the Batch is dropped. With a budget, a buffer
//   holds the largest batch the plan can make (BudgetPlan::max_batch_size and
//   max_padded_elements); with ragged fields and no budget, batch_size samples of shape[0].
// - Errors: a sample that throws reaches the consumer, at its batch's turn, as a SampleError naming
//   the sample (on_error = kRaise); with kSkip it is replaced deterministically by another sample
//   and counted in stats(). The iterator then goes on with the next batch.
// - Shutdown: destroying an EpochIterator stops and joins its threads; it never hangs on a worker
//   that waits for memory.
//
// Thread safety: Engine is safe to use from several threads. An EpochIterator is used by one
// consumer thread at a time; several iterators of one loader may be alive at once and share its
// pool and stats.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "stoker/batch_pool.h"
#include "stoker/dtype.h"
#include "stoker/order.h"
#include "stoker/source.h"

namespace stoker {

class BatchTransform;
class BudgetEpoch;
class BudgetPlan;
class ClassGroups;
struct MixtureOrder;
class MixturePlan;

// One window of the online autotune controller (src/engine/autotune.h) as it saw it, and the
// change it made: what stats() lists.
struct AutotuneFigures {
  double seconds = 0;                  // window length
  double consumer_wait_fraction = 0;   // consumer time waiting for a batch / window
  double worker_busy_fraction = 0;     // active workers' time producing / (workers x window)
  double queue_occupancy = 0;          // ready batches ahead of the consumer / depth, averaged
  double worker_blocked_fraction = 0;  // active workers' time blocked by the prefetch depth
  double samples_per_s = 0;            // delivered in the window
};

struct AutotuneDecision {
  double time_s = 0;  // since the loader was made
  int workers_from = 0, workers_to = 0;
  int prefetch_from = 0, prefetch_to = 0;
  AutotuneFigures figures;
  std::string reason;
};

enum class OnError { kRaise, kSkip };
enum class PinMemory { kAuto, kOn, kOff };

struct EngineOptions {
  uint64_t batch_size = 1;
  bool shuffle = false;
  uint64_t seed = 0;
  bool drop_last = false;
  // threads; -1 = auto: cpu_budget threads, of which the online autotune controller keeps as many
  // active as pay, starting from what it learned on a loader over the same data in this process,
  // else from the cores within cpu_budget (src/engine/autotune.h); 0 = on the consumer's thread
  int num_workers = -1;
  // batches in flight per worker; -1 = auto, set by the autotune controller: starts at 2 per
  // worker, or, for batches over 4 MiB (which the workers fill together), at 1 batch in flight
  // for all of them
  int prefetch_factor = -1;
  PinMemory pin_memory = PinMemory::kAuto;  // auto = pinned when a CUDA device is present
  uint64_t memory_budget = 0;  // bytes for batch buffers; 0 = auto (half of physical memory)
  uint64_t rank = 0;
  uint64_t world_size = 1;
  OnError on_error = OnError::kRaise;
  int cpu_budget = 0;  // cores autotune may use for workers; 0 = usable cores
  // A stratified order (stratified_order.h; needs shuffle): every batch holds each class of
  // `classes` (the source's samples grouped by label) in proportion to its share of the dataset,
  // or to class_weights (one per class, ascending labels) when they are given.
  std::shared_ptr<const ClassGroups> classes;
  std::vector<double> class_weights;
  // A weighted mixture (mixture.h; not with classes): the source is the mixture's sources end to
  // end (a MixtureSource), every batch holds each source in proportion to its weight at the
  // batch's step, and each source is walked in an exactly-once order of its own across epochs.
  // iterate(epoch) plans epoch `epoch` as if every epoch before it ran whole with this order and
  // world size (MixturePlan::epoch_start); iterate() with a MixturePlan starts anywhere.
  std::shared_ptr<const MixtureOrder> mixture;
  // Every sample this many times an epoch, each copy with its own randomness (see above). >= 1.
  uint64_t repeats = 1;
  // Run on every finished batch by the worker that finishes it (see above); its check() must
  // accept the source's fields. Null: batches are the source's fields as read.
  std::shared_ptr<const BatchTransform> batch_transform;
  // A shard order (block_order.h; with shuffle, not with classes or a mixture): > 0 visits the
  // source's shards() (else its blocks()) so that each rank keeps about this many open at once
  // (InvalidArgument for a source with neither). 0: a source with blocks() is visited in a
  // block order with the source's own window, any other in a full permutation. Resolved: the
  // window of the block order in use, 0 when there is none.
  uint64_t shard_window = 0;
  // The world size a block order's epochs are arranged for (BlockOrder's stripes): 0 = world_size.
  // Resolved: never 0. An elastic resume keeps the arrangement of its epoch (iterate's stripes).
  uint64_t stripes = 0;
  // Batches by a budget (see above; the plan's samples are the source's): not with classes,
  // class_weights, a mixture, repeats, a batch transform or a shard order (InvalidArgument).
  // batch_size is then unused. Null: batch_size samples a batch.
  std::shared_ptr<const BudgetPlan> budget;
  // A ragged field's padded length rounds up to a multiple of this (>= 1).
  uint64_t pad_to_multiple_of = 1;
};

// The rules on a loader's options that every front applies (the Engine applies them to its
// EngineOptions; the Python front asks them for every producer, Python datasets and Ray offload
// included, so that each rule and its message live here once). Each throws InvalidArgument.

// Who orders an epoch's samples: the engine's plain (or block) order, its stratified or
// class-weighted order, a mixture's weights, a budget's plan (budget.h), or an order the engine
// does not make (a user's sampler, a stream's own).
enum class SampleOrder { kPlain, kStratified, kMixture, kBudget, kExternal };
// The knobs' ranges: num_workers in [0, kMaxWorkers], prefetch_factor in [1, kMaxPrefetchFactor],
// cpu_budget in [1, kMaxWorkers]; nullopt is "auto" (for cpu_budget: the usable cores).
void check_knobs(std::optional<int64_t> num_workers, std::optional<int64_t> prefetch_factor,
                 std::optional<int64_t> cpu_budget);
// repeats >= 1, and repeats > 1 only in the plain order: the others lay out whole batches (or
// streams) and key their draws by cycles of their own.
void check_repeats(uint64_t repeats, SampleOrder order);
// The bytes batch buffers may take: `memory_budget`, or half of physical memory for 0 ("auto").
uint64_t resolve_memory_budget(uint64_t memory_budget);
// Whether batch buffers are pinned: kAuto pins when a CUDA device is present; kOn without one
// falls back to pageable memory (as torch does) and sets *unavailable, which a front reports.
bool resolve_pinned(PinMemory pin_memory, bool* unavailable);

// Hard caps on the tunables: an unbounded knob is a bug waiting for a large machine.
inline constexpr int kMaxWorkers = 256;
inline constexpr int kMaxPrefetchFactor = 64;
// prefetch_factor="auto": its value before the controller changes it (torch's default) and, for
// batches above kSmallBatchBytes, 1 (the workers fill each batch together; see engine.cc).
inline constexpr int kDefaultPrefetchFactor = 2;
inline constexpr size_t kSmallBatchBytes = size_t{4} << 20;

// on_error = kSkip: the candidates that replace a failed sample, tried in order for attempt = 1 ..
// kSkipAttempts (a candidate equal to `index` is passed over). They depend only on (seed, epoch,
// index), so a stage after the workers (the GPU JPEG decoder) replaces a sample exactly as the
// loader would. REQUIRES: num_samples > 0.
// The rule as a whole (what is recorded, the error when none reads) is src/engine/skip_policy.h.
inline constexpr int kSkipAttempts = 16;
uint64_t skip_candidate(uint64_t seed, uint64_t epoch, uint64_t index, int attempt,
                        uint64_t num_samples);
// The skipped samples whose descriptions stats() lists: the newest this many.
inline constexpr size_t kSkippedListed = 1000;

// One field of a batch: a contiguous array with a leading batch dimension.
struct BatchField {
  std::byte* data = nullptr;
  DType dtype;
  std::vector<int64_t> shape;  // [batch length, sample shape...]
  std::string name;
};

struct Batch {
  uint64_t epoch = 0;
  uint64_t index = 0;   // batch number within the iteration's plan (the epoch on this rank)
  uint64_t length = 0;  // samples in this batch
  std::vector<BatchField> fields;
  bool pinned = false;
  Buffer buffer;  // owns the memory every field points into
};

struct EngineStats {
  uint64_t batches = 0;
  uint64_t samples = 0;
  uint64_t skipped = 0;  // samples replaced under kSkip (a failed replacement is not counted)
  std::vector<std::string> skipped_samples;  // "index: path: message", the most recent ones
  double read_seconds = 0;                   // worker time spent producing samples
  double buffer_wait_seconds = 0;            // worker time spent waiting for a free buffer
  double consumer_wait_seconds = 0;          // consumer time spent waiting for the next batch
  uint64_t buffer_bytes = 0;                 // batch buffer memory that exists now
  uint64_t buffer_bytes_peak = 0;
  uint64_t pinned_bytes = 0;    // page-locked batch buffer memory that exists now
  uint64_t fenced_buffers = 0;  // released buffers waiting for a GPU copy of them to finish
  uint64_t memory_budget = 0;
  uint64_t batch_bytes = 0;            // one buffer
  double worker_cpu_seconds = 0;       // CPU time of worker threads producing batches
  double batch_transform_seconds = 0;  // worker time spent in the batch transform
  // A source with ragged fields (source.h): their rows in the batches delivered, and the rows
  // those batches hold padded (count x padded length): 1 - rows / padded_rows is the padding.
  uint64_t ragged_rows = 0, ragged_padded_rows = 0;
  // Online autotune (num_workers and/or prefetch_factor "auto"): the values in use now and the
  // controller's most recent decisions (bounded list, oldest first).
  bool autotune = false;
  int active_workers = 0;
  int prefetch_factor = 0;
  std::vector<AutotuneDecision> autotune_decisions;
  // A mixture: the samples of each source in the batches delivered (one count per source).
  std::vector<uint64_t> mixture_samples;
};

class EpochIterator;

class Engine {
 public:
  // Validates the options (InvalidArgument says what is allowed) and resolves the "auto" ones.
  Engine(std::shared_ptr<const Source> source, EngineOptions options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Batches per epoch on this rank. With a budget: the epoch's BudgetEpoch says (InvalidArgument
  // here: the count may differ from epoch to epoch).
  uint64_t num_batches() const;
  // How every epoch is split into this rank's batches (options' batch_size, drop_last, rank and
  // world_size over the source's samples).
  const BatchPlan& plan() const;
  // Samples per epoch on this rank, padding and repeats included.
  uint64_t samples_per_rank() const;
  // The options with every "auto" resolved to the value in use.
  const EngineOptions& options() const;
  const Source& source() const;
  bool pinned() const;
  // pin_memory = kOn was asked without a CUDA device, so the buffers are pageable.
  bool pin_unavailable() const;

  // The samples that iterate(epoch) reads, batch after batch (without reading them); with
  // repeats, each copy.
  std::vector<uint64_t> epoch_indices(uint64_t epoch) const;

  // Starts producing the batches of `epoch` from `start_batch` on.
  // REQUIRES: start_batch <= num_batches().
  std::unique_ptr<EpochIterator> iterate(uint64_t epoch, uint64_t start_batch = 0) const;
  // As above, with the batches `plan` describes instead of plan()'s: a plan that starts at a
  // global position (elastic resume), any rank and world size, or a strided view. Batch b of
  // the iteration is plan's batch b. REQUIRES: plan.num_samples() == source().size() * repeats,
  // plan.batch_size() == options().batch_size, start_batch <= plan.num_batches()
  // (InvalidArgument otherwise). A mixture loader lays out its own plan of `epoch` (its rank,
  // from the epoch's start): `plan` must be unstrided and start at 0; any other start is a
  // MixturePlan's (below).
  // `stripes`: the world size the epoch's block order is arranged for, 0 = options().stripes
  // (ignored without a block order).
  std::unique_ptr<EpochIterator> iterate(uint64_t epoch, uint64_t start_batch,
                                         const BatchPlan& plan, uint64_t stripes = 0) const;
  // A mixture's batches as `plan` lays them out (plan.epoch() is the iteration's epoch): a plan
  // that starts anywhere (elastic resume, a new schedule). Batch b of the iteration is plan's
  // batch b. REQUIRES: options().mixture, plan not null with the loader's sizes, seed, shuffle
  // and batch_size; start_batch <= plan->num_batches() (InvalidArgument otherwise).
  std::unique_ptr<EpochIterator> iterate(std::shared_ptr<const MixturePlan> plan,
                                         uint64_t start_batch = 0) const;
  // A budget's batches (options().budget): `epoch` is the BudgetEpoch of this rank, planned by
  // that BudgetPlan; batch b of the iteration is epoch->batch(b). REQUIRES: options().budget,
  // epoch not null, start_batch <= epoch->num_batches() (InvalidArgument otherwise).
  std::unique_ptr<EpochIterator> iterate(std::shared_ptr<const BudgetEpoch> epoch,
                                         uint64_t start_batch = 0) const;

  // The blocks (shards, row groups: the block order's block numbers) that iterate(epoch,
  // start_batch, plan, stripes) reads, each once, in the order of its first sample: what a
  // remote source's fetcher downloads, in this order. Padding's blocks are included (the
  // plan's wrapped positions). Empty without a block order. Cost: one BlockOrder::block_at per
  // sample of the plan from start_batch on (BlockOrder::blocks_in_order). REQUIRES: as iterate.
  std::vector<uint64_t> block_schedule(uint64_t epoch, uint64_t start_batch = 0) const;
  std::vector<uint64_t> block_schedule(uint64_t epoch, uint64_t start_batch, const BatchPlan& plan,
                                       uint64_t stripes = 0) const;

  EngineStats stats() const;

  struct State;  // shared with iterators, which may outlive the Engine

 private:
  std::shared_ptr<State> state_;
};

class EpochIterator {
 public:
  virtual ~EpochIterator() = default;

  enum class Status { kBatch, kEnd, kTimeout };

  // The next batch; nullptr at the end of the epoch. Throws SampleError for a failed sample (the
  // batch is consumed; the next call goes on with the following batch), and BudgetExceeded when
  // no batch can be produced because the consumer holds every buffer the budget allows.
  std::shared_ptr<Batch> next();
  // As next(), but returns kTimeout if no batch is ready within `timeout`, so a caller can check
  // for interrupts while it waits.
  virtual Status next_for(std::chrono::milliseconds timeout, std::shared_ptr<Batch>* out) = 0;

  // Batches delivered so far, counted from the start of the epoch (start_batch included).
  virtual uint64_t position() const = 0;
  virtual uint64_t epoch() const = 0;

  // Autotune decisions made by this iterator since the last call (consumer thread only).
  virtual std::vector<AutotuneDecision> drain_decisions() { return {}; }
};

}  // namespace stoker
