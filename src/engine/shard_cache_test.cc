#include "stoker/shard_cache.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "stoker/mapped_file.h"
#include "stoker/errors.h"
#include "stoker/source.h"
#include "test_temp_dir.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

// A fake network: shard s is the file "remote/<s>" of `size` bytes of value s; a fetcher copies
// it into the cache directory and reports it, or fails shards listed in `broken`.
struct Fixture {
  testing::TempDir dir;
  std::vector<ShardCache::Shard> shards;
  std::vector<uint32_t> fetch_log;
  std::mutex log_mu;
  std::vector<uint32_t> broken;

  explicit Fixture(std::vector<uint64_t> sizes) {
    fs::create_directories(dir.path("remote"));
    fs::create_directories(dir.path("cache"));
    for (size_t s = 0; s < sizes.size(); ++s) {
      std::ofstream(dir.path("remote/" + std::to_string(s)), std::ios::binary)
          << std::string(sizes[s], static_cast<char>('a' + s % 26));
      shards.push_back({"s3://bucket/" + std::to_string(s) + ".tar", sizes[s]});
    }
  }

  void fetch_loop(ShardCache& cache) {
    while (auto r = cache.next_request(5.0)) {
      {
        std::lock_guard lock(log_mu);
        fetch_log.push_back(r->shard);
      }
      if (std::find(broken.begin(), broken.end(), r->shard) != broken.end()) {
        cache.failed(r->shard, "HTTP 503 after 3 retries");
        continue;
      }
      const std::string to = dir.path("cache/" + std::to_string(r->shard));
      fs::copy_file(dir.path("remote/" + std::to_string(r->shard)), to,
                    fs::copy_options::overwrite_existing);
      cache.fetched(r->shard, to, false, r->size, 0.001);
    }
  }
};

TEST(ShardCache, AcquireFetchesOnDemandAndMapsTheBytes) {
  Fixture f({100, 200, 300});
  ShardCache cache(f.shards, 1 << 20);
  std::thread fetcher([&] { f.fetch_loop(cache); });
  auto file = cache.acquire(2);
  ASSERT_EQ(file->bytes().size(), 300u);
  EXPECT_EQ(static_cast<char>(file->bytes()[0]), 'c');
  EXPECT_EQ(cache.acquire(2).get(), file.get());  // local now: the same mapping
  cache.close();
  fetcher.join();
  const ShardCacheStats s = cache.stats();
  EXPECT_EQ(s.fetched, 1u);
  EXPECT_EQ(s.misses, 1u);
  EXPECT_EQ(s.bytes_on_disk, 300u);
  EXPECT_EQ(f.fetch_log, std::vector<uint32_t>{2});
}

TEST(ShardCache, FetchesAheadInScheduleOrderWithinHalfTheBudget) {
  Fixture f(std::vector<uint64_t>(10, 100));
  ShardCache cache(f.shards, 600);  // look-ahead: 3 shards of 100 bytes
  cache.schedule({7, 3, 9, 1, 0, 2, 4, 5, 6, 8});
  std::thread fetcher([&] { f.fetch_loop(cache); });
  // Nothing read yet: the fetcher stops after the first three of the schedule.
  for (int i = 0; i < 200 && cache.resident().size() < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(cache.resident(), (std::vector<uint32_t>{3, 7, 9}));
  for (uint32_t s : {7, 3, 9, 1, 0, 2, 4, 5, 6, 8})
    ASSERT_EQ(cache.acquire(s)->bytes().size(), 100u);
  cache.close();
  fetcher.join();
  EXPECT_EQ(f.fetch_log, (std::vector<uint32_t>{7, 3, 9, 1, 0, 2, 4, 5, 6, 8}));
  const ShardCacheStats s = cache.stats();
  EXPECT_LE(s.peak_bytes_on_disk, 600u);
  EXPECT_EQ(s.fetched, 10u);
  EXPECT_GT(s.evictions, 0u);
}

TEST(ShardCache, EvictsWhatWasReadLongestAgoAndUnlinksIt) {
  Fixture f(std::vector<uint64_t>(4, 100));
  ShardCache cache(f.shards, 250);
  std::thread fetcher([&] { f.fetch_loop(cache); });
  auto held = cache.acquire(0);  // a reader still holds shard 0's mapping
  cache.acquire(1);
  cache.acquire(1);
  cache.acquire(2);  // over budget: shard 0 (acquired longest ago) goes
  EXPECT_EQ(cache.resident(), (std::vector<uint32_t>{1, 2}));
  EXPECT_FALSE(fs::exists(f.dir.path("cache/0")));
  EXPECT_EQ(static_cast<char>(held->bytes()[99]), 'a');  // its mapping still reads
  cache.acquire(0);                                      // fetched again
  cache.close();
  fetcher.join();
  EXPECT_EQ(f.fetch_log, (std::vector<uint32_t>{0, 1, 2, 0}));
  EXPECT_LE(cache.stats().peak_bytes_on_disk, 250u);
}

TEST(ShardCache, AFailedFetchNamesTheUrlUntilTheNextSchedule) {
  Fixture f({10, 10});
  f.broken = {1};
  ShardCache cache(f.shards, 1000);
  std::thread fetcher([&] { f.fetch_loop(cache); });
  cache.acquire(0);
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      cache.acquire(1);
      FAIL() << "no error";
    } catch (const IoError& e) {
      EXPECT_EQ(std::string(e.what()),
                "cannot fetch shard s3://bucket/1.tar: HTTP 503 after 3 retries");
    }
  }
  EXPECT_EQ(std::count(f.fetch_log.begin(), f.fetch_log.end(), 1u), 1);  // failed once, kept
  f.broken.clear();
  cache.schedule({1});
  EXPECT_EQ(cache.acquire(1)->bytes().size(), 10u);
  cache.close();
  fetcher.join();
  EXPECT_EQ(cache.stats().failures, 1u);
}

TEST(ShardCache, CloseWakesWaitingReadersAndFetchers) {
  Fixture f({10});
  ShardCache cache(f.shards, 1000);  // no fetcher: a reader waits
  std::atomic<bool> threw = false;
  std::thread reader([&] {
    try {
      cache.acquire(0);
    } catch (const IoError& e) {
      threw = std::string(e.what()).find("s3://bucket/0.tar") != std::string::npos;
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  cache.close();
  reader.join();
  EXPECT_TRUE(threw);
  EXPECT_FALSE(cache.next_request(10.0).has_value());
  EXPECT_TRUE(cache.closed());
}

TEST(ShardCache, AStoppedLoaderWorkerStopsWaiting) {
  Fixture f({10});
  ShardCache cache(f.shards, 1000);  // no fetcher: the reader would wait for ever
  std::stop_source stop;
  std::string message;
  std::thread reader([&] {
    const ReaderStopScope scope(stop.get_token());
    try {
      cache.acquire(0);
    } catch (const IoError& e) {
      message = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  stop.request_stop();
  reader.join();
  EXPECT_EQ(message, "stopped while waiting for shard s3://bucket/0.tar (the loader closed)");
  EXPECT_FALSE(cache.closed());
}

TEST(ShardCache, ReadKeepsTheThreadsMappingsAndStillRefreshesTheEvictionOrder) {
  Fixture f({10, 20});
  ShardCache cache(f.shards, 1000);
  std::thread fetcher([&] { f.fetch_loop(cache); });
  const MappedFile* first = &cache.read(1);
  for (int i = 0; i < 200; ++i) ASSERT_EQ(&cache.read(1), first);  // the kept mapping
  EXPECT_EQ(cache.read(0).bytes().size(), 10u);
  EXPECT_EQ(cache.read(1).bytes().size(), 20u);
  ShardCache other(f.shards, 1000);  // another cache's shard 1 is not this one's
  std::thread other_fetcher([&] { f.fetch_loop(other); });
  EXPECT_NE(&other.read(1), first);
  cache.close();
  other.close();
  fetcher.join();
  other_fetcher.join();
  EXPECT_EQ(cache.stats().misses, 2u);
}

TEST(ShardCache, ManyReadersOneFetchPerShard) {
  Fixture f(std::vector<uint64_t>(16, 64));
  ShardCache cache(f.shards, 1 << 20);
  std::vector<std::thread> fetchers;
  for (int i = 0; i < 3; ++i) fetchers.emplace_back([&] { f.fetch_loop(cache); });
  std::vector<std::thread> readers;
  std::atomic<uint64_t> bytes = 0;
  for (int r = 0; r < 4; ++r)
    readers.emplace_back([&, r] {
      for (uint32_t i = 0; i < 64; ++i) {
        const uint32_t s = (i * 7 + r) % 16;
        bytes += i % 2 ? cache.acquire(s)->bytes().size() : cache.read(s).bytes().size();
      }
    });
  for (auto& t : readers) t.join();
  cache.close();
  for (auto& t : fetchers) t.join();
  EXPECT_EQ(bytes.load(), 4u * 64 * 64);
  EXPECT_EQ(f.fetch_log.size(), 16u);
}

TEST(ShardCache, AFetchOfTheWrongSizeFailsTheShard) {
  Fixture f({10});
  ShardCache cache(f.shards, 1000);
  std::thread fetcher([&] {
    auto r = cache.next_request(5.0);
    std::ofstream(f.dir.path("cache/short"), std::ios::binary) << "abc";
    cache.fetched(r->shard, f.dir.path("cache/short"), false, 3, 0.0);
  });
  EXPECT_THROW(cache.acquire(0), IoError);
  fetcher.join();
}

}  // namespace
}  // namespace stoker
