// ShardCache: the shards of a remote dataset, fetched ahead into a local disk cache in the order
// the epoch will need them, and handed to reader threads as read-only mappings.
//
// The cache knows each shard's URL and size (from the dataset's metadata, read at construction);
// it does not talk to the network itself. Fetchers (the Python front's threads, which call an
// object-store client that releases the GIL) loop on next_request(), download the shard into the
// cache directory, and report fetched() or failed(). Readers call acquire(), which returns the
// shard's mapping at once when it is local and otherwise asks for it first in line and waits.
//
// Order. schedule() gives the shards this loader will read, in order of first use (the loader's
// block_schedule for its rank, epoch and start). Fetchers are handed, in this order: shards a
// reader is waiting for, then scheduled shards from the reader's progress on, as long as the
// scheduled-and-not-yet-read shards on disk plus those in flight fit `budget` bytes.
//
// Eviction. When a fetched shard would take the shards on disk over `budget`, the cache deletes
// the shards whose next use is furthest: first those already read in this schedule and not
// recently (least recently acquired first), then scheduled ones from the end of the schedule. A
// shard being read (its mapping held by a reader) is never deleted under it: its file is unlinked
// but its mapping stays valid until the last reader drops it. A shard the schedule needs again
// after eviction is fetched again.
//
// Errors. A failed fetch fails every acquire() of that shard (waiting or later) with IoError
// naming the URL and the fetcher's message, until the next schedule() (a new epoch retries it).
// close() fails every waiting and later acquire() and makes next_request() return nothing.
//
// Thread safety: every method may be called from any thread concurrently.
// Memory: O(shards) bookkeeping; one mapping per shard on disk.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace stoker {

class MappedFile;

struct ShardCacheStats {
  uint64_t shards = 0;     // in the dataset
  uint64_t fetched = 0;    // shards downloaded by this cache's fetchers
  uint64_t disk_hits = 0;  // fetches that found the shard complete on disk (another
                           // process, an earlier run)
  // First acquires of a shard in a schedule: local when the schedule began (a cache hit),
  // fetched ahead since (in time), or waited for.
  uint64_t reuses = 0;
  uint64_t ahead = 0;
  uint64_t misses = 0;
  uint64_t failures = 0;       // failed fetches
  uint64_t evictions = 0;      // shards deleted to stay in budget
  uint64_t bytes_fetched = 0;  // downloaded over the network
  double fetch_seconds = 0;    // summed over fetches (they overlap)
  double network_seconds = 0;  // wall time with at least one fetch in flight
  double wait_seconds = 0;     // summed over readers waiting in acquire()
  uint64_t bytes_on_disk = 0;  // now
  uint64_t budget = 0;
  uint64_t peak_bytes_on_disk = 0;
};

class ShardCache {
 public:
  struct Shard {
    std::string url;
    uint64_t size = 0;  // bytes
  };
  struct Request {
    uint32_t shard;
    std::string url;
    uint64_t size;
  };

  // REQUIRES: budget > 0 (InvalidArgument otherwise). A budget below the largest shard still
  // works one shard at a time (a shard is fetched even when it alone exceeds the budget).
  ShardCache(std::vector<Shard> shards, uint64_t budget);
  ~ShardCache();
  ShardCache(const ShardCache&) = delete;
  ShardCache& operator=(const ShardCache&) = delete;

  size_t size() const { return shards_.size(); }
  const Shard& shard(uint32_t s) const { return shards_[s]; }

  // Readers. The mapping of shard s, fetching it first if needed. Throws IoError naming the URL
  // when the fetch failed, the cache is closed, or the calling loader worker's stop token
  // (reader_stop_token(), source.h) is triggered while it waits. REQUIRES: s < size().
  std::shared_ptr<const MappedFile> acquire(uint32_t s);
  // As acquire(), for a read that follows at once: the mapping stays valid until this thread's
  // next read() call on this cache or any other. The calling thread keeps the last few mappings
  // it read (so most reads take no lock and touch no shared counter), which also keeps an
  // evicted shard's mapping alive a while after its file is gone.
  const MappedFile& read(uint32_t s);

  // Planning. The shards to read next, in order of first use; replaces the previous schedule
  // and resets failed shards (they are tried again). Shards outside it are fetched on demand.
  void schedule(std::vector<uint32_t> order);

  // Fetchers. Blocks until a shard should be fetched, for at most `timeout_seconds`; nothing
  // when the time passed or the cache is closed (closed() says which).
  std::optional<Request> next_request(double timeout_seconds);
  // Shard s is complete at local_path (mapped here; IoError if it cannot be: the shard fails).
  // `hit`: it was found complete on disk, not downloaded.
  void fetched(uint32_t s, const std::string& local_path, bool hit, uint64_t bytes, double seconds);
  void failed(uint32_t s, const std::string& message);
  void close();
  bool closed() const;

  ShardCacheStats stats() const;
  // The shards on disk now, by number.
  std::vector<uint32_t> resident() const;

 private:
  enum class State { kAbsent, kQueued, kFetching, kReady, kFailed };
  struct Entry {
    State state = State::kAbsent;
    std::shared_ptr<const MappedFile> file;
    std::string error;
    uint64_t last_acquire = 0;           // a tick of acquire order; 0 = never
    uint64_t schedule_pos = UINT64_MAX;  // in the current schedule
    bool seen = false;                   // acquired since the schedule began
    bool resident = false;               // local when the schedule began
  };

  // All with mu_ held.
  bool fits(uint64_t bytes) const;
  void make_room(uint32_t incoming);
  void evict(uint32_t s);
  void note_fetch_start();
  void note_fetch_end();

  const std::vector<Shard> shards_;
  const uint64_t budget_;
  const uint64_t id_;  // distinct for every cache of the process, for the readers' slots
  mutable std::mutex mu_;
  std::condition_variable_any readers_cv_;
  std::condition_variable fetchers_cv_;
  std::vector<Entry> entries_;
  std::deque<uint32_t> demand_;  // shards readers wait for, first in line
  std::vector<uint32_t> order_;  // the schedule
  uint64_t progress_ = 0;        // schedule positions before this were all acquired once
  uint64_t next_scheduled_ = 0;  // the next schedule position to consider fetching
  uint64_t tick_ = 0;
  uint64_t in_flight_ = 0;  // fetches handed out and not reported
  uint64_t in_flight_bytes_ = 0;
  double flight_started_ = 0;  // steady seconds when in_flight_ went from 0 to 1
  bool closed_ = false;
  ShardCacheStats stats_;
};

}  // namespace stoker
