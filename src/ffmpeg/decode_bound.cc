#include "stoker/ffmpeg/decode_bound.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "stoker/ffmpeg/reader.h"

namespace stoker::video {

DecodeBound decode_bound(const std::vector<DecodeJob>& jobs, int threads, int decoder_threads) {
  std::vector<VideoIndex> indexes(jobs.size());
  {
    VideoReader reader(decoder_threads);
    std::unordered_map<std::string, size_t> seen;
    for (size_t j = 0; j < jobs.size(); ++j) {
      auto it = seen.find(jobs[j].path);
      if (it != seen.end()) {
        indexes[j] = indexes[it->second];
        continue;
      }
      reader.open(jobs[j].path);
      indexes[j] = reader.build_index();
      seen.emplace(jobs[j].path, j);
    }
  }
  std::atomic<size_t> next{0};
  std::atomic<uint64_t> frames{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, threads); ++t) {
    pool.emplace_back([&] {
      try {
        VideoReader reader(decoder_threads);
        for (size_t j = next++; j < jobs.size(); j = next++) {
          reader.open(jobs[j].path);
          frames += reader.decode_span(indexes[j], jobs[j].first, jobs[j].last);
        }
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
          frames.load()};
}

}  // namespace stoker::video
