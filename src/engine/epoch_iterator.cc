// The two ways an epoch's batches are produced: on the consumer's thread (num_workers = 0), or by
// worker threads that run ahead of the consumer up to the prefetch depth.
#include <atomic>
#include <condition_variable>
#include <optional>
#include <stop_token>
#include <thread>

#include "engine/engine_state.h"
#include "engine/work_timer.h"
#include "stoker/errors.h"

namespace stoker {
namespace {

using Clock = std::chrono::steady_clock;

// How long the consumer may find every buffer in its own hands before it is told so.
constexpr auto kStallLimit = std::chrono::milliseconds(1000);

// Autotune: the minimum window between decisions.
constexpr double kAutotuneWindowSeconds = 0.2;
constexpr uint64_t kAutotuneWindowBatches = 3;
// Fast batches close a window sooner: an epoch of small batches can be over in less than
// kAutotuneWindowSeconds, and the controller must still get to act within it.
constexpr double kAutotuneFastWindowSeconds = 0.05;
constexpr uint64_t kAutotuneFastWindowBatches = 100;

// The consumer waits for a batch while it holds every buffer of the pool itself: only it can free
// one, so after kStallLimit of that it is told so (BudgetExceeded) instead of hanging. Consumer
// thread only.
class StallCheck {
 public:
  // `stalled`: whether the consumer is in that state now; `since`: when it started waiting, if
  // this is the first call that finds it so. Throws BudgetExceeded after kStallLimit of it.
  void check(bool stalled, Clock::time_point since, const BatchPool& pool) {
    if (!stalled) return reset();
    if (!since_) since_ = since;
    if (Clock::now() - *since_ < kStallLimit) return;
    reset();
    throw BudgetExceeded(
        "memory_budget holds " + std::to_string(pool.capacity()) + " batch buffer(s) of " +
        std::to_string(pool.buffer_bytes()) +
        " bytes and the consumer holds all of them, so no batch can be produced: drop references "
        "to earlier batches, or raise memory_budget");
  }
  void reset() { since_.reset(); }

 private:
  std::optional<Clock::time_point> since_;  // the consumer holds every buffer since then
};

// Batches produced on demand by the consumer's own thread: simple to debug, no concurrency.
class InlineIterator final : public EpochIterator {
 public:
  InlineIterator(std::shared_ptr<Engine::State> state, const BatchPlan& plan, EpochDraws draws,
                 uint64_t epoch, uint64_t start)
      : st_(std::move(state)),
        plan_(plan),
        draws_(std::move(draws)),
        epoch_(epoch),
        position_(start),
        worker_(st_->take_worker_state()) {}
  ~InlineIterator() override { st_->keep_worker_state(std::move(worker_)); }

  Status next_for(std::chrono::milliseconds timeout, std::shared_ptr<Batch>* out) override {
    if (position_ >= plan_.num_batches()) return Status::kEnd;
    const auto start = Clock::now();
    Buffer buffer = st_->pool->acquire_for(std::stop_token(), std::min(timeout, kStallLimit));
    if (!buffer) {
      // A fenced buffer (a GPU copy still reads it) comes back by itself: only buffers that the
      // consumer holds make this a stall.
      stall_.check(st_->pool->exhausted(), start, *st_->pool);
      return Status::kTimeout;
    }
    stall_.reset();
    auto batch = st_->make_batch(plan_, draws_, epoch_, position_++, std::move(buffer));
    st_->fill(*batch, plan_, draws_, worker_.get(), 0, batch->length);
    st_->transform(*batch, plan_, draws_);
    st_->delivered(draws_, *batch);
    *out = std::move(batch);
    return Status::kBatch;
  }

  uint64_t position() const override { return position_; }
  uint64_t epoch() const override { return epoch_; }

 private:
  std::shared_ptr<Engine::State> st_;
  const BatchPlan plan_;
  EpochDraws draws_;
  uint64_t epoch_;
  uint64_t position_;
  std::unique_ptr<WorkerState> worker_;
  StallCheck stall_;
};

// Worker threads open batch numbers in order and fill them together, a chunk of samples at a
// time. A worker first waits until a batch may be opened (at most `depth_` batches open or ready
// beyond the ones delivered), then takes a buffer, then opens it: every open batch can finish, so
// the batch the consumer waits for never waits behind later batches for memory, and an idle
// worker holds no buffer. Workers take chunks of the oldest open batch first, so a batch is done
// by all workers at once (its latency is the batch's work divided among them, and an epoch's
// last batch leaves no worker idle for long). Chunks are sized from the measured time per sample:
// about kChunkSeconds of work, so slow samples (images) are shared one by one and fast ones
// (array rows) keep whole batches per worker. The worker whose chunk completes a batch runs the
// batch transform on it (outside the lock: other workers go on with later batches meanwhile).
// A finished batch goes to its slot in a ring, and the consumer takes them in order.
class ThreadedIterator final : public EpochIterator {
 public:
  ThreadedIterator(std::shared_ptr<Engine::State> state, const BatchPlan& plan, EpochDraws draws,
                   uint64_t epoch, uint64_t start)
      : st_(std::move(state)),
        plan_(plan),
        draws_(std::move(draws)),
        epoch_(epoch),
        end_(plan_.num_batches()),
        autotune_(st_->autotune_workers || st_->autotune_prefetch),
        gated_(st_->autotune_prefetch && st_->autotune_shared_depth),
        ring_size_(static_cast<uint64_t>(autotune_ && st_->autotune_prefetch
                                             ? kAutotuneMaxPrefetch
                                             : st_->options.prefetch_factor) *
                   static_cast<uint64_t>(st_->options.num_workers)),
        ring_(ring_size_),
        next_claim_(start),
        next_deliver_(start),
        next_chunked_(start) {
    const int n = static_cast<int>(std::min<uint64_t>(st_->options.num_workers, end_ - start));
    if (autotune_) {
      AutotuneLimits lim;
      lim.tune_workers = st_->autotune_workers;
      lim.tune_prefetch = st_->autotune_prefetch;
      lim.max_workers = std::max(n, 1);
      lim.max_prefetch =
          st_->autotune_prefetch ? kAutotuneMaxPrefetch : st_->options.prefetch_factor;
      lim.max_buffers = st_->pool->capacity();
      lim.shared_depth = st_->autotune_shared_depth;
      std::lock_guard lock(st_->autotune_mu);
      const int w = st_->autotune_workers ? std::min(st_->autotune_active, lim.max_workers)
                                          : st_->options.num_workers;
      const int p =
          st_->autotune_prefetch ? st_->autotune_prefetch_now : st_->options.prefetch_factor;
      controller_.emplace(lim, w, p);
      active_ = controller_->workers();
      depth_ = std::min(controller_->depth(), ring_size_);
      if (gated_) st_->buffer_gate->set_limit(depth_ + 1);
    } else {
      active_ = n;
      depth_ = ring_size_;
    }
    window_start_ = Clock::now();
    workers_.reserve(n);
    for (int i = 0; i < n; ++i) workers_.emplace_back([this, i] { work(i); });
  }

  ~ThreadedIterator() override {
    stop_.request_stop();  // wakes every wait that holds the token: window, pool, park, gate
    for (std::thread& t : workers_) t.join();
    if (gated_) st_->buffer_gate->forget(this);
  }

  Status next_for(std::chrono::milliseconds timeout, std::shared_ptr<Batch>* out) override {
    const auto start = Clock::now();
    const auto deadline = start + timeout;
    std::unique_lock lock(mu_);
    if (next_deliver_ >= end_) return Status::kEnd;
    Slot& slot = ring_[next_deliver_ % ring_size_];
    if (failure_) std::rethrow_exception(failure_);
    while (!slot.ready) {
      // Nobody has claimed the batch while the pool is exhausted: every buffer is outside this
      // iterator.
      stall_.check(next_claim_ == next_deliver_ && st_->pool->exhausted(), Clock::now(),
                   *st_->pool);
      if (gated_ && next_claim_ <= next_deliver_) st_->buffer_gate->force(this, next_deliver_);
      const auto slice = std::min(deadline, Clock::now() + std::chrono::milliseconds(100));
      consumer_waiting_ = true;
      ready_.wait_until(lock, slice);
      consumer_waiting_ = false;
      if (failure_) std::rethrow_exception(failure_);
      if (!slot.ready && Clock::now() >= deadline) {
        const int64_t waited = elapsed_ns(start);
        st_->consumer_wait_ns += waited;
        window_wait_ns_ += waited;
        return Status::kTimeout;
      }
    }
    stall_.reset();
    Slot taken = std::move(slot);
    slot = Slot{};
    ++next_deliver_;
    const int64_t waited = elapsed_ns(start);
    if (autotune_) autotune_locked(waited, taken.batch ? taken.batch->length : 0);
    const bool wake_workers = workers_waiting_ > 0;
    lock.unlock();
    if (wake_workers) window_.notify_all();
    st_->consumer_wait_ns += waited;
    if (taken.error) std::rethrow_exception(taken.error);
    st_->delivered(draws_, *taken.batch);
    *out = std::move(taken.batch);
    return Status::kBatch;
  }

  uint64_t position() const override {
    std::lock_guard lock(mu_);
    return next_deliver_;
  }
  uint64_t epoch() const override { return epoch_; }

  std::vector<AutotuneDecision> drain_decisions() override { return new_decisions_.drain(); }

 private:
  // About this much work per chunk: far above the cost of taking one (a lock), far below a
  // batch of images.
  static constexpr double kChunkSeconds = 0.5e-3;

  struct Slot {
    std::shared_ptr<Batch> batch;  // from the opening of the batch until delivery
    std::exception_ptr error;      // of the batch's first failing sample
    uint64_t error_at = UINT64_MAX;
    uint64_t handed = 0;  // samples handed out in chunks
    uint64_t done = 0;    // samples finished
    bool ready = false;
  };

  struct Chunk {
    uint64_t b = 0;  // batch number
    Batch* batch = nullptr;
    uint64_t begin = 0, end = 0;
  };

  // The next chunk of the oldest open batch that has samples left to hand out.
  bool take_chunk_locked(Chunk* c) {
    if (next_chunked_ >= next_claim_) return false;
    Slot& slot = ring_[next_chunked_ % ring_size_];
    const uint64_t length = slot.batch->length;
    const uint64_t n = std::min(length - slot.handed, chunk_samples_locked(length));
    *c = Chunk{next_chunked_, slot.batch.get(), slot.handed, slot.handed + n};
    slot.handed += n;
    if (slot.handed == length) ++next_chunked_;  // the slot may finish and be emptied from now on
    return true;
  }

  uint64_t chunk_samples_locked(uint64_t length) const {
    if (seconds_per_sample_ <= 0) {  // nothing measured yet: a few chunks per worker
      const uint64_t parts = 4 * static_cast<uint64_t>(std::max(active_, 1));
      return std::max<uint64_t>(1, (length + parts - 1) / parts);
    }
    return std::clamp<uint64_t>(static_cast<uint64_t>(kChunkSeconds / seconds_per_sample_), 1,
                                length);
  }

  // A failure outside any sample (the worker's state cannot be made, a batch buffer cannot be
  // allocated or pinned) ends the epoch: the consumer gets it from its next call.
  void work(int me) {
    try {
      produce(me);
    } catch (...) {
      {
        std::lock_guard lock(mu_);
        if (!failure_) failure_ = std::current_exception();
      }
      ready_.notify_all();
    }
  }

  void produce(int me) {
    const std::stop_token stop = stop_.get_token();
    const ReaderStopScope reads_stop(stop);
    struct Kept {  // the worker's state, kept for the next epoch however this one ends
      Engine::State& st;
      std::unique_ptr<WorkerState> state;
      ~Kept() { st.keep_worker_state(std::move(state)); }
    } worker{*st_, st_->take_worker_state()};
    std::unique_lock lock(mu_);
    while (!stop.stop_requested()) {
      if (me >= active_) {  // parked while the controller keeps this worker inactive
        if (!park_.wait(lock, stop, [&] { return me < active_; })) return;
        continue;
      }
      Chunk chunk;
      if (take_chunk_locked(&chunk)) {
        lock.unlock();
        fill_chunk(chunk, worker.state.get());
        lock.lock();
        continue;
      }
      if (next_claim_ >= end_) return;  // every batch is open and its samples handed out
      if (!opening_ && next_claim_ < next_deliver_ + depth_) {
        // Open the next batch: take memory for it first, outside the lock (it may wait).
        opening_ = true;
        const uint64_t opening = next_claim_;  // only the opener moves next_claim_
        lock.unlock();
        Buffer buffer;
        if (gated_) {  // the consumer's batches count in the window: wait for one to go
          const auto since = Clock::now();
          const bool entered = st_->buffer_gate->enter(stop, this, opening);
          blocked_ns_ += elapsed_ns(since);
          if (!entered) return;  // stopped
        }
        const auto waited = Clock::now();
        try {
          buffer = st_->pool->acquire(stop);
        } catch (...) {
          if (gated_) st_->buffer_gate->leave();
          throw;  // opening_ stays set: no other worker opens a batch of this failed epoch
        }
        st_->buffer_wait_ns += elapsed_ns(waited);
        if (gated_ && buffer) {
          buffer = BufferGate::wrap(st_->buffer_gate, std::move(buffer));
        } else if (gated_) {
          st_->buffer_gate->leave();
        }
        lock.lock();
        opening_ = false;
        if (!buffer) return;  // stopped
        if (next_claim_ < end_ && next_claim_ < next_deliver_ + depth_) {
          // Made before it is claimed: a batch that cannot be made (one mixing buckets) fails
          // the epoch (work()) without leaving a claimed slot empty for other workers.
          const uint64_t b = next_claim_;
          std::shared_ptr<Batch> batch =
              st_->make_batch(plan_, draws_, epoch_, b, std::move(buffer));
          ++next_claim_;
          Slot& slot = ring_[b % ring_size_];
          slot = Slot{};
          slot.batch = std::move(batch);
        }
        const bool wake = workers_waiting_ > 0;
        lock.unlock();
        buffer.reset();  // not used after all (the depth shrank meanwhile): back to the pool
        if (wake) window_.notify_all();  // others may take chunks of the new batch
        lock.lock();
        continue;
      }
      // Nothing to do until a batch opens or the depth allows one more.
      const bool blocked = !opening_;  // by the prefetch depth (not by another worker's opening)
      const auto since = Clock::now();
      ++workers_waiting_;
      window_.wait(lock, stop, [&] {
        return me >= active_ || next_chunked_ < next_claim_ || next_claim_ >= end_ ||
               (!opening_ && next_claim_ < next_deliver_ + depth_);
      });
      --workers_waiting_;
      if (blocked) blocked_ns_ += elapsed_ns(since);
    }
  }

  // Runs a worker's `work` (no lock held): its wall time counts as busy in the autotune window,
  // its CPU time in the loader's stats. *error gets what it threw. Returns the wall time.
  template <typename Work>
  int64_t timed(Work&& work, std::exception_ptr* error) {
    const WorkTimer timer;
    try {
      work();
    } catch (...) {
      *error = std::current_exception();
    }
    const int64_t busy = timer.stop(st_->worker_cpu_ns);
    busy_ns_ += busy;
    return busy;
  }

  // Fills one chunk (no lock held), then records it; the last chunk of a batch makes it ready,
  // after the batch transform when there is one.
  void fill_chunk(const Chunk& c, WorkerState* worker) {
    std::exception_ptr error;
    uint64_t failed_at = UINT64_MAX;
    const int64_t busy = timed(
        [&] { st_->fill(*c.batch, plan_, draws_, worker, c.begin, c.end, &failed_at); }, &error);
    std::shared_ptr<Batch> dropped;  // a failed batch's buffer goes back outside the lock
    bool wake_consumer = false;
    bool transform = false;  // this chunk completed a batch that the transform must finish
    {
      std::lock_guard lock(mu_);
      if (!error) {
        const double per_sample = busy * 1e-9 / double(c.end - c.begin);
        seconds_per_sample_ =
            seconds_per_sample_ <= 0 ? per_sample : 0.75 * seconds_per_sample_ + 0.25 * per_sample;
      }
      Slot& slot = ring_[c.b % ring_size_];
      // Only the chunk's samples up to the failure count as done; the rest are never read.
      slot.done += c.end - c.begin;
      if (error && failed_at < slot.error_at) {
        slot.error = error;
        slot.error_at = failed_at;
      }
      if (slot.done == slot.batch->length) {
        transform = !slot.error && st_->options.batch_transform;
        if (slot.error) dropped = std::move(slot.batch);
        slot.ready = !transform;
        wake_consumer = !transform && consumer_waiting_ && c.b == next_deliver_;
      }
    }
    if (transform) {
      // Every sample is in: no other worker touches the batch, and the consumer waits for ready.
      timed([&] { st_->transform(*c.batch, plan_, draws_); }, &error);
      std::lock_guard lock(mu_);
      Slot& slot = ring_[c.b % ring_size_];
      if (error) {
        slot.error = error;
        dropped = std::move(slot.batch);
      }
      slot.ready = true;
      wake_consumer = consumer_waiting_ && c.b == next_deliver_;
    }
    if (wake_consumer) ready_.notify_one();
  }

  // One controller window: figures since the last decision, then maybe a new worker count or
  // prefetch depth. Called by the consumer, under mu_, after each delivered batch.
  void autotune_locked(int64_t waited_ns, uint64_t samples) {
    window_wait_ns_ += waited_ns;
    window_samples_ += samples;
    ++window_batches_;
    uint64_t ready = 0;
    for (uint64_t b = next_deliver_; b < next_claim_; ++b) ready += ring_[b % ring_size_].ready;
    occupancy_sum_ += depth_ > 0 ? double(ready) / double(depth_) : 0;
    const auto now = Clock::now();
    const double secs = std::chrono::duration<double>(now - window_start_).count();
    const bool full = secs >= kAutotuneWindowSeconds && window_batches_ >= kAutotuneWindowBatches;
    const bool fast =
        secs >= kAutotuneFastWindowSeconds && window_batches_ >= kAutotuneFastWindowBatches;
    if (!full && !fast) return;
    AutotuneFigures f;
    f.seconds = secs;
    f.consumer_wait_fraction = std::min(1.0, window_wait_ns_ * 1e-9 / secs);
    const int64_t busy = busy_ns_.exchange(0);
    f.worker_busy_fraction = std::min(1.0, busy * 1e-9 / (secs * std::max(active_, 1)));
    f.queue_occupancy = occupancy_sum_ / double(window_batches_);
    f.worker_blocked_fraction =
        std::min(1.0, blocked_ns_.exchange(0) * 1e-9 / (secs * std::max(active_, 1)));
    f.samples_per_s = double(window_samples_) / secs;
    window_start_ = now;
    window_wait_ns_ = 0;
    window_samples_ = 0;
    window_batches_ = 0;
    occupancy_sum_ = 0;
    const double t = std::chrono::duration<double>(now - st_->created).count();
    std::optional<AutotuneDecision> d = controller_->update(t, f);
    if (!d) return;
    active_ = controller_->workers();
    depth_ = std::min(controller_->depth(), ring_size_);
    if (gated_) st_->buffer_gate->set_limit(depth_ + 1);
    st_->record_autotune(*d);
    new_decisions_.add(*d);
    park_.notify_all();
    window_.notify_all();
  }

  const std::shared_ptr<Engine::State> st_;
  const BatchPlan plan_;
  const EpochDraws draws_;
  const uint64_t epoch_;
  const uint64_t end_;
  const bool autotune_;
  // Large batches with an autotuned depth: the consumer's batches count in the depth's window
  // (BufferGate), so depth d means at most d + 1 buffers of this loader exist at once.
  const bool gated_;
  const uint64_t ring_size_;  // >= any depth the controller may set

  mutable std::mutex mu_;
  uint64_t depth_;  // guarded by mu_; batches open or ready beyond the ones delivered
  int active_;      // guarded by mu_; workers allowed to claim (the others are parked)
  std::optional<AutotuneController> controller_;  // guarded by mu_
  double seconds_per_sample_ = 0;                 // guarded by mu_; 0 until measured
  bool opening_ = false;  // guarded by mu_; a worker is taking the buffer of the next batch
  std::atomic<int64_t> busy_ns_{0};     // workers' time producing, this window
  std::atomic<int64_t> blocked_ns_{0};  // workers' time blocked by depth, this window
  Clock::time_point window_start_;      // consumer thread only, as the window figures
  int64_t window_wait_ns_ = 0;
  uint64_t window_samples_ = 0, window_batches_ = 0;
  double occupancy_sum_ = 0;
  DecisionLog new_decisions_;           // consumer thread only; drained by bindings
  std::condition_variable_any park_;    // inactive workers wait here
  std::condition_variable_any window_;  // workers wait here for a batch number to claim
  std::condition_variable ready_;       // the consumer waits here for its batch
  std::vector<Slot> ring_;              // guarded by mu_; slot of batch b is b % ring_size_
  uint64_t next_claim_;                 // guarded by mu_; the next batch to open
  uint64_t next_deliver_;               // guarded by mu_
  uint64_t next_chunked_;  // guarded by mu_; open batches before it have every sample handed out
  bool consumer_waiting_ = false;  // guarded by mu_; skips needless notifies
  int workers_waiting_ = 0;        // guarded by mu_
  std::exception_ptr failure_;     // guarded by mu_; a worker's failure outside any sample
  StallCheck stall_;               // consumer thread only

  std::stop_source stop_;
  // Last member: threads are joined (in the destructor body) before anything they use is destroyed.
  std::vector<std::thread> workers_;
};

}  // namespace

std::unique_ptr<EpochIterator> make_inline_iterator(std::shared_ptr<Engine::State> state,
                                                    const BatchPlan& plan, EpochDraws draws,
                                                    uint64_t epoch, uint64_t start_batch) {
  return std::make_unique<InlineIterator>(std::move(state), plan, std::move(draws), epoch,
                                          start_batch);
}

std::unique_ptr<EpochIterator> make_threaded_iterator(std::shared_ptr<Engine::State> state,
                                                      const BatchPlan& plan, EpochDraws draws,
                                                      uint64_t epoch, uint64_t start_batch) {
  return std::make_unique<ThreadedIterator>(std::move(state), plan, std::move(draws), epoch,
                                            start_batch);
}

}  // namespace stoker
