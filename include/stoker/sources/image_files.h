// ImageFiles: N encoded image files with integer labels, read by index.
//
// Three providers share the interface (FileRanges below: byte ranges of files):
// - ImageFolderFiles: one file per sample, with the (path, class index) list supplied by the
//   caller (the Python front applies torchvision's ImageFolder scan rules).
// - TarShardFiles: WebDataset shards; an index of (shard, data offset, size, label) per sample is
//   built once at construction, and read() is one pread into the member's bytes. Remote shards
//   (stoker.remote) come with their index (a sidecar written by `stoker index`, or built once from
//   the cached shard) and a ShardCache: read() copies the member from the shard's cached mapping,
//   waiting for the shard's fetch when it is not local yet.
//
// Contract:
// - Thread safety: immutable after construction; every method may be called concurrently. read()
//   uses pread only (no shared file offsets).
// - Ownership: TarShardFiles keeps its shard descriptors open for its lifetime; ImageFolderFiles
//   opens and closes a file per read().
// - Errors: read() throws IoError naming path(i) when the file cannot be opened or read in full.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "stoker/source.h"

namespace stoker {

// The cache of remote shards (stoker/shard_cache.h): the Python front (stoker.remote) makes
// it and gives it to the remote constructor below; a C++ user reads local files.
class ShardCache;

class ImageFiles {
 public:
  virtual ~ImageFiles() = default;

  virtual uint64_t size() const = 0;
  // REQUIRES for the indexed methods: i < size().
  virtual int64_t label(uint64_t i) const = 0;
  // The file for error messages: its path, or "shard.tar:member" for a tar member.
  virtual std::string path(uint64_t i) const = 0;
  // Replaces `buffer`'s contents with the file's bytes (its capacity is reused).
  virtual void read(uint64_t i, std::vector<std::byte>& buffer) const = 0;
  // Files that live in blocks (rows of a Parquet file): see Source::blocks().
  virtual Source::Blocks blocks() const { return {}; }
  // Files that live in shards (tar shards): see Source::shards().
  virtual std::vector<uint64_t> shards() const { return {}; }
};

class ImageFolderFiles final : public ImageFiles {
 public:
  // (path, class index) per sample, in sample order. Files are not opened here.
  explicit ImageFolderFiles(std::vector<std::pair<std::string, int64_t>> samples);

  uint64_t size() const override { return samples_.size(); }
  int64_t label(uint64_t i) const override { return samples_[i].second; }
  std::string path(uint64_t i) const override { return samples_[i].first; }
  void read(uint64_t i, std::vector<std::byte>& buffer) const override;

 private:
  std::vector<std::pair<std::string, int64_t>> samples_;
};

// FileRanges: images that are byte ranges of local files: whole files (an image folder), members
// of tar shards (found by their names), or images written back to back into one file (image bytes
// held in a table's rows). Range i is (file, offset, size); size kWholeFile reads the whole file.
// path(i) is names[i] (names empty: the file's path). Label 0. Files are opened per read.
class FileRanges final : public ImageFiles {
 public:
  static constexpr uint64_t kWholeFile = UINT64_MAX;
  struct Range {
    uint32_t file = 0;
    uint64_t offset = 0;
    uint64_t size = kWholeFile;
  };
  // REQUIRES: every range's file < files.size(); names empty or one per range (InvalidArgument).
  FileRanges(std::vector<std::string> files, std::vector<Range> ranges,
             std::vector<std::string> names = {});

  uint64_t size() const override { return ranges_.size(); }
  int64_t label(uint64_t) const override { return 0; }
  std::string path(uint64_t i) const override;
  // IoError naming path(i) for a file that cannot be opened, is not a regular file, or ends
  // before the range does.
  void read(uint64_t i, std::vector<std::byte>& buffer) const override {
    read_prefix(i, kWholeFile, buffer);
  }
  // The range's first min(max_bytes, its size) bytes (a header's).
  void read_prefix(uint64_t i, uint64_t max_bytes, std::vector<std::byte>& buffer) const;
  // The range's size in bytes (a whole file's, from stat: IoError naming path(i) if none).
  uint64_t range_size(uint64_t i) const;

 private:
  std::vector<std::string> files_;
  std::vector<Range> ranges_;
  std::vector<std::string> names_;
};

// The tar indexer every tar reader shares: each WebDataset key of a shard with its members by
// extension. A key is a member path up to the first '.' of its basename, the extension the rest,
// lowercased ("img.seg.png" -> key "img", extension "seg.png"). Members without an extension and
// non-file members (directories, links) are left out.
struct TarEntry {
  std::string ext;   // lowercased
  std::string name;  // member path
  uint64_t offset;   // of the data, in bytes from the start of the shard
  uint64_t size;
};
struct TarKey {
  std::string key;
  std::vector<TarEntry> members;  // in member order
};

// The tar shards of a dataset, for reading members: local files (index() indexes one: ustar, GNU
// long names, pax `path=`; read() preads a member), or remote shards in a ShardCache (read()
// copies the member from the shard's cached mapping, waiting for its fetch; their index comes
// from a sidecar, so index() is not available). Thread safety: immutable after construction;
// every method may be called concurrently (pread only, no shared offsets). Ownership: keeps its
// descriptors open (or the cache) for its lifetime. Errors: IoError for a shard that cannot be
// opened or read (naming it), InvalidArgument naming the shard for a truncated or corrupt tar.
class TarShardSet {
 public:
  explicit TarShardSet(std::vector<std::string> paths);
  // Remote shards: shard s is cache->shard(s), named by its URL. REQUIRES: cache is not null.
  explicit TarShardSet(std::shared_ptr<ShardCache> cache);
  ~TarShardSet();
  TarShardSet(const TarShardSet&) = delete;
  TarShardSet& operator=(const TarShardSet&) = delete;

  size_t size() const { return paths_.size(); }
  const std::string& path(size_t shard) const { return paths_[shard]; }
  // Every key of shard `shard`, in the order of each key's first member. Local shards only
  // (InvalidArgument for remote ones).
  std::vector<TarKey> index(size_t shard) const;
  // The shard's size in bytes where it is remote (what a sidecar index must fit in); nullopt for
  // a local shard.
  std::optional<uint64_t> remote_size(size_t shard) const;
  // Replaces `out` with the `size` bytes at `offset` of shard `shard`; `what` names them in
  // errors (IoError when the shard is shorter: truncated since it was indexed).
  void read(size_t shard, uint64_t offset, uint64_t size, std::vector<std::byte>& out,
            const std::string& what) const;

 private:
  std::vector<std::string> paths_;
  std::vector<int> fds_;               // local shards
  std::shared_ptr<ShardCache> cache_;  // remote shards
};

// A .cls member's text as a label: a decimal integer with optional surrounding whitespace and
// sign; false when it is not one (or does not fit int64).
bool parse_tar_label(std::string_view text, int64_t* out);

// What a tar shard's samples hold: an image (.jpg, .jpeg, .png) or a video (.mp4, .m4v, .mov,
// .mkv, .webm, .avi) member, with its .cls label.
enum class TarMedia { kImages, kVideos };

// A sample of a tar shard: its image (or video) member and label.
struct TarMember {
  std::string name;  // member path of the image
  uint64_t offset;   // of the data, in bytes from the start of the shard
  uint64_t size;
  int64_t label;
};

class TarShardFiles final : public ImageFiles {
 public:
  // Indexes every shard (ustar, GNU long names, pax `path=`). A sample is a WebDataset key (the
  // member path up to the first '.' of its basename) with one image member (jpg, jpeg or png, any
  // case; with TarMedia::kVideos a video member) and one `cls` member holding a decimal integer.
  // Samples are in shard order, then member order. Throws IoError for a shard that cannot be
  // opened or read, and InvalidArgument naming the shard (and member) for a truncated or corrupt
  // tar, a key without an image or with no or an invalid label.
  explicit TarShardFiles(std::vector<std::string> shard_paths, TarMedia media = TarMedia::kImages);
  // Remote shards: shard s is cache->shard(s) (its URL names it in messages), its samples are
  // members[s] in order. Nothing is opened here. REQUIRES: members.size() == cache->size(); every
  // member inside its shard's size (InvalidArgument naming the shard otherwise).
  TarShardFiles(std::shared_ptr<ShardCache> cache, std::vector<std::vector<TarMember>> members);
  ~TarShardFiles() override;
  TarShardFiles(const TarShardFiles&) = delete;
  TarShardFiles& operator=(const TarShardFiles&) = delete;

  uint64_t size() const override { return members_.size(); }
  int64_t label(uint64_t i) const override { return members_[i].label; }
  std::string path(uint64_t i) const override;
  void read(uint64_t i, std::vector<std::byte>& buffer) const override;

  std::vector<uint64_t> shards() const override;

  size_t num_shards() const { return shards_.size(); }
  // The samples of the tar file at `path`, in member order (the index the first constructor
  // builds for each shard; `stoker index` writes it beside a remote shard). Throws as above.
  static std::vector<TarMember> index_file(const std::string& path,
                                           TarMedia media = TarMedia::kImages);

 private:
  struct Member {
    uint32_t shard;
    uint64_t offset;
    uint64_t size;
    int64_t label;
    std::string name;
  };

  void add_members(uint32_t shard, std::vector<TarMember> members);

  std::vector<std::string> shards_;
  std::unique_ptr<TarShardSet> tars_;
  std::vector<Member> members_;
  std::vector<uint64_t> shard_samples_;
};

}  // namespace stoker
