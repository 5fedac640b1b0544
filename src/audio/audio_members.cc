#include "stoker/audio/audio_members.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>

#include "stoker/errors.h"
#include "stoker/shard_cache.h"
#include "stoker/sources/image_files.h"

namespace stoker::audio {

TarAudioMembers::TarAudioMembers(std::vector<std::string> shard_paths,
                                 std::vector<TarMemberRef> members)
    : tars_(std::make_unique<TarShardSet>(std::move(shard_paths))), members_(std::move(members)) {
  check();
}

TarAudioMembers::TarAudioMembers(std::shared_ptr<ShardCache> cache,
                                 std::vector<TarMemberRef> members)
    : tars_(std::make_unique<TarShardSet>(std::move(cache))), members_(std::move(members)) {
  check();
}

TarAudioMembers::~TarAudioMembers() = default;

void TarAudioMembers::check() const {
  for (const TarMemberRef& m : members_) {
    if (m.shard >= tars_->size())
      throw InvalidArgument("TarAudioMembers: a member of shard " + std::to_string(m.shard) +
                            " of " + std::to_string(tars_->size()));
    const std::optional<uint64_t> size = tars_->remote_size(m.shard);
    if (size && (m.offset > *size || m.size > *size - m.offset))
      throw InvalidArgument("the index of tar shard " + tars_->path(m.shard) +
                            " puts a member past the shard's " + std::to_string(*size) +
                            " bytes: the index is stale");
  }
}

std::span<const std::byte> TarAudioMembers::bytes(uint64_t i, std::vector<std::byte>& scratch,
                                                  const std::string& name) const {
  const TarMemberRef& m = members_[i];
  tars_->read(m.shard, m.offset, m.size, scratch, name);
  return {scratch.data(), scratch.size()};
}

BufferAudioMembers::BufferAudioMembers(std::vector<std::byte> data, std::vector<uint64_t> offsets)
    : data_(std::move(data)), offsets_(std::move(offsets)) {
  if (!offsets_.empty() && (offsets_.front() != 0 || offsets_.back() != data_.size() ||
                            !std::is_sorted(offsets_.begin(), offsets_.end())))
    throw InvalidArgument(
        "BufferAudioMembers: offsets must run from 0, non-decreasing, to the buffer's size");
}

std::span<const std::byte> BufferAudioMembers::bytes(uint64_t i, std::vector<std::byte>&,
                                                     const std::string&) const {
  return {data_.data() + offsets_[i], offsets_[i + 1] - offsets_[i]};
}

std::vector<MemberInfo> probe_members(const AudioMembers& members,
                                      const std::vector<std::string>& names, int threads) {
  if (names.size() != members.size())
    throw InvalidArgument("probe_members: " + std::to_string(names.size()) + " names for " +
                          std::to_string(members.size()) + " members");
  std::vector<MemberInfo> out(members.size());
  std::atomic<uint64_t> next{0};
  std::exception_ptr failed;  // not a member's error (those are kept): a shard that cannot be read
  std::atomic<bool> stop{false};
  std::mutex lock;
  auto work = [&] {
    std::vector<std::byte> scratch;
    for (uint64_t i = next++; i < out.size() && !stop; i = next++) {
      try {
        out[i].info = probe(members.bytes(i, scratch, names[i]), names[i]);
      } catch (const DecodeError& e) {
        out[i].error = e.what();
      } catch (...) {
        std::lock_guard<std::mutex> guard(lock);
        if (!failed) failed = std::current_exception();
        stop = true;
      }
    }
  };
  const int n = std::clamp<int>(threads, 1, static_cast<int>(std::max<size_t>(out.size(), 1)));
  std::vector<std::thread> pool;
  for (int t = 1; t < n; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  if (failed) std::rethrow_exception(failed);
  return out;
}

}  // namespace stoker::audio
