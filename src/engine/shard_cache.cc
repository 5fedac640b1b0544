#include "stoker/shard_cache.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>

#include "stoker/mapped_file.h"
#include "stoker/errors.h"
#include "stoker/source.h"

namespace stoker {
namespace {

thread_local std::stop_token t_reader_stop;

// The mappings a thread read last, by shard (direct-mapped), with the cache they came from.
struct ReaderSlot {
  uint64_t cache = 0;
  uint32_t shard = 0;
  uint32_t reads = 0;
  std::shared_ptr<const MappedFile> file;
};
constexpr size_t kReaderSlots = 16;
// One in this many reads of a kept mapping goes through acquire(), so that the cache still sees
// which shards are in use (its eviction order) while most reads take no lock.
constexpr uint32_t kRefreshEvery = 64;
thread_local std::array<ReaderSlot, kReaderSlots> t_slots;
std::atomic<uint64_t> g_next_cache_id{1};

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::stop_token reader_stop_token() { return t_reader_stop; }

ReaderStopScope::ReaderStopScope(std::stop_token token) : previous_(std::move(t_reader_stop)) {
  t_reader_stop = std::move(token);
}

ReaderStopScope::~ReaderStopScope() { t_reader_stop = std::move(previous_); }

ShardCache::ShardCache(std::vector<Shard> shards, uint64_t budget)
    : shards_(std::move(shards)),
      budget_(budget),
      id_(g_next_cache_id++),
      entries_(shards_.size()) {
  if (budget == 0) throw InvalidArgument("ShardCache needs a budget of at least one byte");
  if (shards_.size() > UINT32_MAX)
    throw InvalidArgument("ShardCache takes at most 2^32 - 1 shards");
  stats_.shards = shards_.size();
  stats_.budget = budget;
}

ShardCache::~ShardCache() { close(); }

std::shared_ptr<const MappedFile> ShardCache::acquire(uint32_t s) {
  std::unique_lock lock(mu_);
  Entry& e = entries_[s];
  e.last_acquire = ++tick_;
  if (!e.seen) {
    e.seen = true;
    ++(e.state != State::kReady ? stats_.misses : e.resident ? stats_.reuses : stats_.ahead);
    while (progress_ < order_.size() && entries_[order_[progress_]].seen) ++progress_;
    fetchers_cv_.notify_all();  // the look-ahead moved on
  }
  double waited_since = 0;
  for (;;) {
    if (closed_)
      throw IoError("cannot read shard " + shards_[s].url + ": the shard cache is closed");
    if (e.state == State::kReady) break;
    if (e.state == State::kFailed)
      throw IoError("cannot fetch shard " + shards_[s].url + ": " + e.error);
    if (e.state == State::kAbsent) {
      e.state = State::kQueued;
      demand_.push_back(s);
      fetchers_cv_.notify_all();
    }
    if (waited_since == 0) waited_since = now_seconds();
    const std::stop_token stop = reader_stop_token();
    readers_cv_.wait(lock, stop, [&] {
      return closed_ || (e.state != State::kQueued && e.state != State::kFetching);
    });
    if (stop.stop_requested()) {
      stats_.wait_seconds += now_seconds() - waited_since;
      throw IoError("stopped while waiting for shard " + shards_[s].url + " (the loader closed)");
    }
  }
  if (waited_since != 0) stats_.wait_seconds += now_seconds() - waited_since;
  return e.file;
}

const MappedFile& ShardCache::read(uint32_t s) {
  ReaderSlot& slot = t_slots[s % kReaderSlots];
  if (slot.cache == id_ && slot.shard == s && ++slot.reads % kRefreshEvery != 0) return *slot.file;
  slot.file = acquire(s);
  slot.cache = id_;
  slot.shard = s;
  slot.reads = 0;
  return *slot.file;
}

void ShardCache::schedule(std::vector<uint32_t> order) {
  std::lock_guard lock(mu_);
  for (Entry& e : entries_) {
    e.schedule_pos = UINT64_MAX;
    e.seen = false;
    e.resident = e.state == State::kReady;
    if (e.state == State::kFailed) e.state = State::kAbsent, e.error.clear();
  }
  for (uint64_t p = 0; p < order.size(); ++p) {
    if (order[p] >= shards_.size())
      throw InvalidArgument("ShardCache::schedule: shard " + std::to_string(order[p]) + " of " +
                            std::to_string(shards_.size()));
    Entry& e = entries_[order[p]];
    if (e.schedule_pos == UINT64_MAX) e.schedule_pos = p;
  }
  order_ = std::move(order);
  progress_ = 0;
  next_scheduled_ = 0;
  fetchers_cv_.notify_all();
}

bool ShardCache::fits(uint64_t bytes) const {
  // The look-ahead: shards fetched ahead and not yet read, with those in flight, take at most
  // half the budget; the other half holds the shards being read (a window's) and reuse.
  uint64_t ahead = in_flight_bytes_;
  for (uint64_t p = progress_; p < order_.size(); ++p) {
    const uint32_t s = order_[p];
    const Entry& e = entries_[s];
    if (e.state == State::kReady && !e.seen && e.schedule_pos == p) ahead += shards_[s].size;
  }
  return ahead == 0 || ahead + bytes <= budget_ / 2;
}

std::optional<ShardCache::Request> ShardCache::next_request(double timeout_seconds) {
  std::unique_lock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, timeout_seconds)));
  for (;;) {
    if (closed_) return std::nullopt;
    while (!demand_.empty()) {
      const uint32_t s = demand_.front();
      demand_.pop_front();
      if (entries_[s].state != State::kQueued) continue;
      entries_[s].state = State::kFetching;
      note_fetch_start();
      in_flight_bytes_ += shards_[s].size;
      return Request{s, shards_[s].url, shards_[s].size};
    }
    next_scheduled_ = std::max(next_scheduled_, progress_);
    while (next_scheduled_ < order_.size()) {
      const uint32_t s = order_[next_scheduled_];
      Entry& e = entries_[s];
      if (e.state != State::kAbsent || e.seen) {
        ++next_scheduled_;
        continue;
      }
      if (!fits(shards_[s].size)) break;
      ++next_scheduled_;
      e.state = State::kFetching;
      note_fetch_start();
      in_flight_bytes_ += shards_[s].size;
      return Request{s, shards_[s].url, shards_[s].size};
    }
    if (fetchers_cv_.wait_until(lock, deadline) == std::cv_status::timeout) return std::nullopt;
  }
}

void ShardCache::note_fetch_start() {
  if (in_flight_++ == 0) flight_started_ = now_seconds();
}

void ShardCache::note_fetch_end() {
  if (--in_flight_ == 0) stats_.network_seconds += now_seconds() - flight_started_;
}

void ShardCache::fetched(uint32_t s, const std::string& local_path, bool hit, uint64_t bytes,
                         double seconds) {
  std::shared_ptr<const MappedFile> file;
  std::string error;
  try {
    file = std::make_shared<const MappedFile>(local_path, "cached shard");
    if (file->bytes().size() != shards_[s].size)
      error = "the cached file " + local_path + " holds " + std::to_string(file->bytes().size()) +
              " bytes, the shard " + std::to_string(shards_[s].size);
  } catch (const std::exception& x) {
    error = x.what();
  }
  if (!error.empty()) return failed(s, error);
  std::lock_guard lock(mu_);
  Entry& e = entries_[s];
  if (closed_ || e.state != State::kFetching) return;
  note_fetch_end();
  in_flight_bytes_ -= shards_[s].size;
  ++(hit ? stats_.disk_hits : stats_.fetched);
  stats_.bytes_fetched += bytes;
  stats_.fetch_seconds += seconds;
  make_room(s);
  e.state = State::kReady;
  e.file = std::move(file);
  stats_.bytes_on_disk += shards_[s].size;
  stats_.peak_bytes_on_disk = std::max(stats_.peak_bytes_on_disk, stats_.bytes_on_disk);
  readers_cv_.notify_all();
  fetchers_cv_.notify_all();
}

void ShardCache::failed(uint32_t s, const std::string& message) {
  std::lock_guard lock(mu_);
  Entry& e = entries_[s];
  if (closed_ || e.state != State::kFetching) return;
  note_fetch_end();
  in_flight_bytes_ -= shards_[s].size;
  ++stats_.failures;
  e.state = State::kFailed;
  e.error = message;
  readers_cv_.notify_all();
  fetchers_cv_.notify_all();
}

void ShardCache::make_room(uint32_t incoming) {
  const uint64_t need = shards_[incoming].size;
  while (stats_.bytes_on_disk + need > budget_) {
    // Read already (or never scheduled): least recently acquired first. Else: the scheduled
    // shard needed last.
    uint32_t victim = UINT32_MAX;
    bool victim_read = false;
    for (uint32_t s = 0; s < entries_.size(); ++s) {
      const Entry& e = entries_[s];
      if (s == incoming || e.state != State::kReady) continue;
      const bool read = e.seen || e.schedule_pos == UINT64_MAX;
      if (victim == UINT32_MAX) {
        victim = s, victim_read = read;
        continue;
      }
      const Entry& v = entries_[victim];
      if (read && !victim_read) {
        victim = s, victim_read = true;
      } else if (read == victim_read &&
                 (read ? e.last_acquire < v.last_acquire : e.schedule_pos > v.schedule_pos)) {
        victim = s;
      }
    }
    if (victim == UINT32_MAX) return;  // nothing else on disk: one shard may exceed the budget
    evict(victim);
  }
}

void ShardCache::evict(uint32_t s) {
  Entry& e = entries_[s];
  // Readers holding the mapping keep reading it; the name goes now.
  ::unlink(e.file->path().c_str());
  e.file.reset();
  e.state = State::kAbsent;
  e.resident = false;
  stats_.bytes_on_disk -= shards_[s].size;
  ++stats_.evictions;
  if (e.schedule_pos != UINT64_MAX && !e.seen)
    next_scheduled_ = std::min(next_scheduled_, e.schedule_pos);
}

void ShardCache::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  readers_cv_.notify_all();
  fetchers_cv_.notify_all();
}

bool ShardCache::closed() const {
  std::lock_guard lock(mu_);
  return closed_;
}

ShardCacheStats ShardCache::stats() const {
  std::lock_guard lock(mu_);
  ShardCacheStats s = stats_;
  if (in_flight_ > 0) s.network_seconds += now_seconds() - flight_started_;
  return s;
}

std::vector<uint32_t> ShardCache::resident() const {
  std::lock_guard lock(mu_);
  std::vector<uint32_t> out;
  for (uint32_t s = 0; s < entries_.size(); ++s)
    if (entries_[s].state == State::kReady) out.push_back(s);
  return out;
}

}  // namespace stoker
