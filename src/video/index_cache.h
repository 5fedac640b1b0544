// What the video sources share (VideoSource, LeRobotSource): their bounded cache of packet
// indexes and their decoding counts.
//
// IndexCache: indexes by key (a source's video number), least recently used out first once they
// hold more than their capacity in bytes (the one in use always stays). Thread-safe; an index is
// built outside the lock, and when two threads build the same one the first kept wins.
// VideoCounters: a source's counts (VideoStats), added to by its worker threads. Thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include "stoker/video/video_source.h"
#include "stoker/ffmpeg/reader.h"

namespace stoker::video {

class IndexCache {
 public:
  explicit IndexCache(uint64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The index under `key`, or the one `build` returns (kept).
  std::shared_ptr<const VideoIndex> get(uint64_t key, const std::function<VideoIndex()>& build);
  uint64_t bytes() const;

 private:
  struct Cached {
    std::shared_ptr<const VideoIndex> index;
    std::list<uint64_t>::iterator lru;
  };
  const uint64_t capacity_;
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, Cached> cache_;
  std::list<uint64_t> lru_;  // most recent first
  uint64_t bytes_ = 0;
};

class VideoCounters {
 public:
  using Clock = std::chrono::steady_clock;

  // One sample's work: its clips (cameras) and frames delivered, the worker time spent decoding
  // and transforming, and what its reader counted since `reported` (then brought up to date).
  void add(uint64_t clips, uint64_t frames, Clock::duration decoding, Clock::duration transforming,
           const ReaderStats& now, ReaderStats& reported);
  void add_index_build() { builds_.fetch_add(1, std::memory_order_relaxed); }
  VideoStats stats(uint64_t index_cache_bytes) const;

 private:
  std::atomic<uint64_t> clips_{0}, delivered_{0}, decoded_{0}, seeks_{0}, opens_{0}, builds_{0},
      reuses_{0}, decode_ns_{0}, transform_ns_{0};
};

}  // namespace stoker::video
