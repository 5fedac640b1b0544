// Encoded audio that lives inside other files, read by index: the members of WebDataset tar shards
// (TarAudioMembers, over the one tar reader, TarShardSet of stoker/sources/image_files.h), or the
// cells of a table's binary column (BufferAudioMembers: Hugging Face's Audio() columns, their
// bytes gathered into one buffer). An AudioSource's clips name a member in place of a file
// (audio_source.h); the decoder reads the bytes from memory (decoder.h).
//
// Contract:
// - Thread safety: immutable after construction; bytes() and probe_members() are safe from any
//   number of threads.
// - Ownership: TarAudioMembers keeps its shards open (or its ShardCache) for its lifetime.
// - Errors: bytes() throws IoError naming the member (a shard truncated since it was indexed, a
//   remote shard that cannot be fetched). The constructors throw IoError for a shard that cannot
//   be opened and InvalidArgument for a member outside its shard or buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/audio/decoder.h"

namespace stoker {
class ShardCache;
class TarShardSet;
}  // namespace stoker

namespace stoker::audio {

class AudioMembers {
 public:
  virtual ~AudioMembers() = default;
  virtual uint64_t size() const = 0;
  // Member i's bytes: a view of the provider's own memory, or of `scratch` (its contents replaced,
  // its capacity reused), valid while both live unchanged. `name` names the member in errors.
  // REQUIRES: i < size().
  virtual std::span<const std::byte> bytes(uint64_t i, std::vector<std::byte>& scratch,
                                           const std::string& name) const = 0;
};

// A member of a tar shard: its data's offset and size in bytes.
struct TarMemberRef {
  uint32_t shard = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

class TarAudioMembers final : public AudioMembers {
 public:
  // Local shards, opened here.
  TarAudioMembers(std::vector<std::string> shard_paths, std::vector<TarMemberRef> members);
  // Remote shards: shard s is cache->shard(s), fetched when first read. REQUIRES: cache not null.
  TarAudioMembers(std::shared_ptr<ShardCache> cache, std::vector<TarMemberRef> members);
  ~TarAudioMembers() override;

  uint64_t size() const override { return members_.size(); }
  std::span<const std::byte> bytes(uint64_t i, std::vector<std::byte>& scratch,
                                   const std::string& name) const override;

 private:
  void check() const;

  std::unique_ptr<TarShardSet> tars_;
  std::vector<TarMemberRef> members_;
};

class BufferAudioMembers final : public AudioMembers {
 public:
  // Member i is data[offsets[i], offsets[i + 1]). REQUIRES: offsets from 0, non-decreasing, to
  // data.size() (InvalidArgument otherwise).
  BufferAudioMembers(std::vector<std::byte> data, std::vector<uint64_t> offsets);

  uint64_t size() const override { return offsets_.empty() ? 0 : offsets_.size() - 1; }
  std::span<const std::byte> bytes(uint64_t i, std::vector<std::byte>& scratch,
                                   const std::string& name) const override;

 private:
  std::vector<std::byte> data_;
  std::vector<uint64_t> offsets_;
};

// What probe() says of each member, or why it cannot (`error`, the exception's message; the
// other fields 0), for durations known at construction without decoding. `names[i]` names member
// i. Runs on `threads` threads (at least 1). REQUIRES: names.size() == members.size().
struct MemberInfo {
  AudioInfo info;
  std::string error;
};
std::vector<MemberInfo> probe_members(const AudioMembers& members,
                                      const std::vector<std::string>& names, int threads = 1);

}  // namespace stoker::audio
