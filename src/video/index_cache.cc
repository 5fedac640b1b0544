#include "video/index_cache.h"

namespace stoker::video {

std::shared_ptr<const VideoIndex> IndexCache::get(uint64_t key,
                                                  const std::function<VideoIndex()>& build) {
  {
    std::lock_guard lock(mutex_);
    auto it = cache_.find(key);
    if (it != cache_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
      return it->second.index;
    }
  }
  auto built = std::make_shared<const VideoIndex>(build());
  std::lock_guard lock(mutex_);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second.index;  // another thread built it meanwhile
  lru_.push_front(key);
  cache_.emplace(key, Cached{built, lru_.begin()});
  bytes_ += built->bytes();
  while (bytes_ > capacity_ && lru_.size() > 1) {
    auto old = cache_.find(lru_.back());
    bytes_ -= old->second.index->bytes();
    cache_.erase(old);
    lru_.pop_back();
  }
  return built;
}

uint64_t IndexCache::bytes() const {
  std::lock_guard lock(mutex_);
  return bytes_;
}

void VideoCounters::add(uint64_t clips, uint64_t frames, Clock::duration decoding,
                        Clock::duration transforming, const ReaderStats& now,
                        ReaderStats& reported) {
  const auto ns = [](Clock::duration d) {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
  };
  constexpr auto relaxed = std::memory_order_relaxed;
  clips_.fetch_add(clips, relaxed);
  delivered_.fetch_add(frames, relaxed);
  decode_ns_.fetch_add(ns(decoding), relaxed);
  transform_ns_.fetch_add(ns(transforming), relaxed);
  decoded_.fetch_add(now.frames_decoded - reported.frames_decoded, relaxed);
  seeks_.fetch_add(now.seeks - reported.seeks, relaxed);
  opens_.fetch_add(now.opens - reported.opens, relaxed);
  reuses_.fetch_add(now.decoder_reuses - reported.decoder_reuses, relaxed);
  reported = now;
}

VideoStats VideoCounters::stats(uint64_t index_cache_bytes) const {
  constexpr auto relaxed = std::memory_order_relaxed;
  VideoStats s;
  s.clips = clips_.load(relaxed);
  s.frames_delivered = delivered_.load(relaxed);
  s.frames_decoded = decoded_.load(relaxed);
  s.seeks = seeks_.load(relaxed);
  s.opens = opens_.load(relaxed);
  s.index_builds = builds_.load(relaxed);
  s.decoder_reuses = reuses_.load(relaxed);
  s.decode_seconds = 1e-9 * static_cast<double>(decode_ns_.load(relaxed));
  s.transform_seconds = 1e-9 * static_cast<double>(transform_ns_.load(relaxed));
  s.index_cache_bytes = index_cache_bytes;
  return s;
}

}  // namespace stoker::video
