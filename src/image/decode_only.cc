#include "stoker/image/decode_only.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "stoker/errors.h"
#include "stoker/image/decode.h"

namespace stoker::image {

DecodeOnly decode_only(const std::vector<std::vector<std::byte>>& files, int threads,
                       double min_seconds) {
  if (threads < 1) throw InvalidArgument("threads must be a positive integer");
  if (files.empty()) throw InvalidArgument("decode_only needs at least one file");
  std::atomic<uint64_t> next{0}, n_images{0}, n_pixels{0}, n_fail{0};
  std::atomic<bool> stop{false};
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + std::chrono::duration<double>(min_seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      Decoder decoder;  // one per thread, as a loader's worker has
      DecodedImage img;
      for (;;) {
        // Whole passes over the files: stop only after a pass once the time is up.
        const uint64_t k = next.fetch_add(1);
        if (k % files.size() == 0 && k > 0 && std::chrono::steady_clock::now() >= deadline)
          stop = true;
        if (stop) return;
        try {
          decoder.decode(files[k % files.size()], img);
          n_images += 1;
          n_pixels += static_cast<uint64_t>(img.width) * img.height;
        } catch (const DecodeError&) {
          n_fail += 1;
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  DecodeOnly r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.images = n_images, r.pixels = n_pixels, r.failures = n_fail;
  return r;
}

}  // namespace stoker::image
