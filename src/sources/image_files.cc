#include "stoker/sources/image_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string_view>
#include <unordered_map>

#include "stoker/errors.h"
#include "stoker/mapped_file.h"
#include "stoker/shard_cache.h"

namespace stoker {
namespace {

constexpr uint64_t kBlock = 512;

// Reads exactly `n` bytes at `offset`; returns the number read (< n only at end of file).
size_t pread_full(int fd, void* dst, size_t n, uint64_t offset, const std::string& what) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r =
        ::pread(fd, static_cast<char*>(dst) + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw IoError("cannot read " + what + ": " + std::strerror(errno));
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string field_string(const char* p, size_t n) { return std::string(p, strnlen(p, n)); }

// A numeric header field: octal (space/NUL padded) or GNU base-256 (high bit of the first byte).
bool parse_number(const char* p, size_t n, uint64_t* out) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  if (u[0] & 0x80) {
    if (u[0] != 0x80) return false;  // negative or too large
    uint64_t v = 0;
    for (size_t i = 1; i < n; ++i) {
      if (v >> 56) return false;
      v = (v << 8) | u[i];
    }
    *out = v;
    return true;
  }
  size_t i = 0;
  while (i < n && (p[i] == ' ' || p[i] == '\0')) ++i;
  uint64_t v = 0;
  bool any = false;
  for (; i < n && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (v >> 60) return false;
    v = v * 8 + static_cast<uint64_t>(p[i] - '0');
    any = true;
  }
  for (; i < n; ++i)
    if (p[i] != ' ' && p[i] != '\0') return false;
  *out = any ? v : 0;
  return true;
}

bool checksum_ok(const std::array<char, kBlock>& h) {
  uint64_t stored = 0;
  if (!parse_number(h.data() + 148, 8, &stored)) return false;
  uint64_t sum = 0;
  for (size_t i = 0; i < kBlock; ++i)
    sum += (i >= 148 && i < 156) ? ' ' : static_cast<unsigned char>(h[i]);
  return sum == stored;
}

// Records "LEN key=value\n" of a pax header; sets path and size when present.
bool parse_pax(const std::string& data, std::string* path, uint64_t* size, bool* has_size) {
  size_t pos = 0;
  while (pos < data.size()) {
    if (data[pos] == '\0') break;
    size_t sp = data.find(' ', pos);
    if (sp == std::string::npos) return false;
    uint64_t len = 0;
    for (size_t i = pos; i < sp; ++i) {
      if (data[i] < '0' || data[i] > '9') return false;
      len = len * 10 + static_cast<uint64_t>(data[i] - '0');
      if (len > data.size()) return false;
    }
    if (len <= sp - pos || pos + len > data.size() || data[pos + len - 1] != '\n') return false;
    const std::string record = data.substr(sp + 1, pos + len - 1 - (sp + 1));
    const size_t eq = record.find('=');
    if (eq == std::string::npos) return false;
    const std::string key = record.substr(0, eq), value = record.substr(eq + 1);
    if (key == "path") {
      *path = value;
    } else if (key == "size") {
      uint64_t v = 0;
      if (value.empty()) return false;
      for (char c : value) {
        if (c < '0' || c > '9') return false;
        v = v * 10 + static_cast<uint64_t>(c - '0');
      }
      *size = v;
      *has_size = true;
    }
    pos += len;
  }
  return true;
}

// The data member extensions of a sample of `media`, and how messages name them.
bool is_data_member(TarMedia media, const std::string& ext) {
  if (media == TarMedia::kVideos)
    return ext == "mp4" || ext == "m4v" || ext == "mov" || ext == "mkv" || ext == "webm" ||
           ext == "avi";
  return ext == "jpg" || ext == "jpeg" || ext == "png";
}
const char* data_members(TarMedia media) {
  return media == TarMedia::kVideos ? "a video member (.mp4, .m4v, .mov, .mkv, .webm or .avi)"
                                    : "an image member (.jpg, .jpeg or .png)";
}

std::vector<TarKey> index_tar_keys(int fd, const std::string& shard) {
  struct stat st{};
  if (::fstat(fd, &st) != 0)
    throw IoError("cannot stat tar shard " + shard + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw IoError("cannot read tar shard " + shard + ": not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  auto corrupt = [&](const std::string& what) {
    return InvalidArgument("tar shard " + shard + ": " + what);
  };

  std::unordered_map<std::string, size_t> key_of;
  std::vector<TarKey> keys;  // in order of first member
  std::string long_name, pax_path, global_path;
  uint64_t pax_size = 0;
  bool has_pax_size = false;
  std::array<char, kBlock> h{};
  uint64_t pos = 0;
  for (;;) {
    if (pos == file_size) break;  // no end-of-archive blocks: accepted
    const size_t got = pread_full(fd, h.data(), kBlock, pos, "tar shard " + shard);
    if (got != kBlock)
      throw corrupt("truncated tar: partial header at offset " + std::to_string(pos));
    if (std::all_of(h.begin(), h.end(), [](char c) { return c == 0; })) break;  // end of archive
    if (!checksum_ok(h))
      throw corrupt("corrupt tar: bad header checksum at offset " + std::to_string(pos) +
                    " (not a tar file, or damaged)");
    uint64_t size = 0;
    if (!parse_number(h.data() + 124, 12, &size))
      throw corrupt("corrupt tar: bad size field at offset " + std::to_string(pos));
    const char type = h[156];
    std::string name = field_string(h.data(), 100);
    if (std::memcmp(h.data() + 257, "ustar", 5) == 0) {
      const std::string prefix = field_string(h.data() + 345, 155);
      if (!prefix.empty()) name = prefix + "/" + name;
    }
    const bool extension = type == 'L' || type == 'K' || type == 'x' || type == 'g';
    if (!extension) {
      if (!long_name.empty())
        name = long_name;
      else if (!pax_path.empty())
        name = pax_path;
      else if (!global_path.empty())
        name = global_path;
      if (has_pax_size) size = pax_size;
      long_name.clear();
      pax_path.clear();
      has_pax_size = false;
    }
    const uint64_t data = pos + kBlock;
    if (size > file_size || data + size > file_size)
      throw corrupt("truncated tar: member '" + name + "' needs " + std::to_string(size) +
                    " bytes at offset " + std::to_string(data) + " but the file has " +
                    std::to_string(file_size));
    const uint64_t next = data + (size + kBlock - 1) / kBlock * kBlock;

    if (extension) {
      if (size > (64u << 20))
        throw corrupt("corrupt tar: extended header of " + std::to_string(size) + " bytes");
      std::string text(size, '\0');
      pread_full(fd, text.data(), size, data, "tar shard " + shard);
      if (type == 'L') {
        long_name = text.substr(0, strnlen(text.data(), text.size()));
      } else if (type == 'x' || type == 'g') {
        std::string p;
        uint64_t sz = 0;
        bool has = false;
        if (!parse_pax(text, &p, &sz, &has))
          throw corrupt("corrupt tar: bad pax header at offset " + std::to_string(pos));
        if (type == 'x') {
          if (!p.empty()) pax_path = p;
          if (has) pax_size = sz, has_pax_size = true;
        } else if (!p.empty()) {
          global_path = p;
        }
      }
      pos = next;
      continue;
    }
    pos = next;
    if (type != '0' && type != '\0' && type != '7') continue;  // directories, links, devices
    while (name.size() > 2 && name.compare(0, 2, "./") == 0) name.erase(0, 2);

    const size_t slash = name.rfind('/');
    const size_t dot = name.find('.', slash == std::string::npos ? 0 : slash + 1);
    if (dot == std::string::npos) continue;  // no extension: not part of a sample
    std::string key = name.substr(0, dot);
    std::string ext = lower(name.substr(dot + 1));
    auto [it, inserted] = key_of.try_emplace(key, keys.size());
    if (inserted) keys.push_back({std::move(key), {}});
    keys[it->second].members.push_back({std::move(ext), std::move(name), data, size});
  }
  return keys;
}

// The image (or video) samples of a shard, each with its .cls label.
std::vector<TarMember> index_tar(const TarShardSet& set, size_t s, TarMedia media) {
  const std::string& shard = set.path(s);
  auto corrupt = [&](const std::string& what) {
    return InvalidArgument("tar shard " + shard + ": " + what);
  };
  std::vector<TarMember> members;
  std::vector<std::byte> text_bytes;
  for (const TarKey& k : set.index(s)) {
    const TarEntry* data = nullptr;
    const TarEntry* label = nullptr;  // the last .cls member
    for (const TarEntry& e : k.members) {
      if (is_data_member(media, e.ext)) {
        if (data != nullptr)
          throw corrupt("key '" + k.key + "' has two " +
                        (media == TarMedia::kVideos ? "videos" : "images") + ": '" + data->name +
                        "' and '" + e.name + "'");
        data = &e;
      } else if (e.ext == "cls") {
        if (e.size > 64)
          throw corrupt("member '" + e.name + "': invalid label (" + std::to_string(e.size) +
                        " bytes; expected a decimal integer)");
        label = &e;
      }
    }
    if (data == nullptr) {
      if (label == nullptr) continue;  // only other members (e.g. .json): not a sample
      throw corrupt("key '" + k.key + "' has a label ('" + label->name + "') but no " +
                    std::string(data_members(media)).substr(3));
    }
    if (label == nullptr)
      throw corrupt("member '" + data->name + "': key '" + k.key + "' has no label ('" + k.key +
                    ".cls')");
    set.read(s, label->offset, label->size, text_bytes, "tar shard " + shard);
    const std::string text(reinterpret_cast<const char*>(text_bytes.data()), text_bytes.size());
    int64_t value = 0;
    if (!parse_tar_label(text, &value))
      throw corrupt("member '" + label->name + "': invalid label '" + text +
                    "' (expected a decimal integer)");
    members.push_back({data->name, data->offset, data->size, value});
  }
  return members;
}

}  // namespace

// A decimal integer with optional surrounding whitespace and sign.
bool parse_tar_label(std::string_view s, int64_t* out) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  if (b == e) return false;
  bool neg = false;
  if (s[b] == '+' || s[b] == '-') neg = s[b++] == '-';
  if (b == e) return false;
  uint64_t v = 0;
  for (size_t i = b; i < e; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + static_cast<uint64_t>(s[i] - '0');
    if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  }
  *out = neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return true;
}

// --------------------------------------------------------------------------- TarShardSet

TarShardSet::TarShardSet(std::vector<std::string> paths) : paths_(std::move(paths)) {
  fds_.reserve(paths_.size());
  try {
    for (const std::string& p : paths_) {
      const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
      if (fd < 0) throw IoError("cannot open tar shard " + p + ": " + std::strerror(errno));
      fds_.push_back(fd);
    }
  } catch (...) {
    for (int fd : fds_) ::close(fd);
    throw;
  }
}

TarShardSet::TarShardSet(std::shared_ptr<ShardCache> cache) : cache_(std::move(cache)) {
  if (!cache_) throw InvalidArgument("TarShardSet needs a shard cache");
  paths_.reserve(cache_->size());
  for (uint32_t s = 0; s < cache_->size(); ++s) paths_.push_back(cache_->shard(s).url);
}

TarShardSet::~TarShardSet() {
  for (int fd : fds_) ::close(fd);
}

std::vector<TarKey> TarShardSet::index(size_t shard) const {
  if (cache_)
    throw InvalidArgument("remote tar shard " + paths_[shard] +
                          " is indexed from its sidecar, not here");
  return index_tar_keys(fds_[shard], paths_[shard]);
}

std::optional<uint64_t> TarShardSet::remote_size(size_t shard) const {
  if (!cache_) return std::nullopt;
  return cache_->shard(static_cast<uint32_t>(shard)).size;
}

namespace {
struct MemberCopy {
  const std::byte* src;
  size_t n;
  std::byte* dst;
};
void copy_member(void* arg) {
  const auto& c = *static_cast<const MemberCopy*>(arg);
  std::memcpy(c.dst, c.src, c.n);
}
}  // namespace

void TarShardSet::read(size_t shard, uint64_t offset, uint64_t size, std::vector<std::byte>& out,
                       const std::string& what) const {
  out.resize(size);
  if (cache_) {
    const MappedFile& file = cache_->read(static_cast<uint32_t>(shard));
    MemberCopy c{file.bytes().data() + offset, size, out.data()};
    file.copy(copy_member, &c);
    return;
  }
  const size_t got = pread_full(fds_[shard], out.data(), size, offset, what);
  if (got != size) throw IoError("cannot read " + what + ": the tar shard was truncated");
}

// --------------------------------------------------------------------------- ImageFolderFiles

ImageFolderFiles::ImageFolderFiles(std::vector<std::pair<std::string, int64_t>> samples)
    : samples_(std::move(samples)) {}

void ImageFolderFiles::read(uint64_t i, std::vector<std::byte>& buffer) const {
  const std::string& p = samples_[i].first;
  // O_NONBLOCK: a FIFO put in the file's place must fail at fstat below, not block the worker
  // in open() forever (it does nothing to reads of a regular file).
  Fd fd(::open(p.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) throw IoError("cannot open " + p + ": " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) throw IoError("cannot stat " + p + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw IoError("cannot read " + p + ": not a regular file");
  const size_t n = static_cast<size_t>(st.st_size);
  buffer.resize(n);
  const size_t got = pread_full(fd.get(), buffer.data(), n, 0, p);
  if (got != n) throw IoError("cannot read " + p + ": file shrank while being read");
}

// --------------------------------------------------------------------------- FileRanges

FileRanges::FileRanges(std::vector<std::string> files, std::vector<Range> ranges,
                       std::vector<std::string> names)
    : files_(std::move(files)), ranges_(std::move(ranges)), names_(std::move(names)) {
  if (!names_.empty() && names_.size() != ranges_.size())
    throw InvalidArgument("FileRanges: " + std::to_string(names_.size()) + " names for " +
                          std::to_string(ranges_.size()) + " ranges");
  for (const Range& r : ranges_)
    if (r.file >= files_.size())
      throw InvalidArgument("FileRanges: a range of file " + std::to_string(r.file) + " of " +
                            std::to_string(files_.size()));
}

std::string FileRanges::path(uint64_t i) const {
  return names_.empty() ? files_[ranges_[i].file] : names_[i];
}

uint64_t FileRanges::range_size(uint64_t i) const {
  const Range& r = ranges_[i];
  if (r.size != kWholeFile) return r.size;
  struct stat st{};
  if (::stat(files_[r.file].c_str(), &st) != 0)
    throw IoError("cannot stat " + path(i) + ": " + std::strerror(errno));
  return static_cast<uint64_t>(st.st_size);
}

void FileRanges::read_prefix(uint64_t i, uint64_t max_bytes, std::vector<std::byte>& buffer) const {
  const Range& r = ranges_[i];
  const std::string& file = files_[r.file];
  const std::string what = path(i);
  // O_NONBLOCK: a FIFO in the file's place fails at fstat, not blocks (ImageFolderFiles::read).
  Fd fd(::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) throw IoError("cannot open " + what + ": " + std::strerror(errno));
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0)
    throw IoError("cannot stat " + what + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw IoError("cannot read " + what + ": not a regular file");
  const uint64_t size = r.size == kWholeFile ? static_cast<uint64_t>(st.st_size) : r.size;
  if (r.offset + size > static_cast<uint64_t>(st.st_size))
    throw IoError("cannot read " + what + ": the file ends before its bytes do");
  const size_t n = static_cast<size_t>(std::min(size, max_bytes));
  buffer.resize(n);
  if (pread_full(fd.get(), buffer.data(), n, r.offset, what) != n)
    throw IoError("cannot read " + what + ": the file shrank while being read");
}

// --------------------------------------------------------------------------- TarShardFiles

TarShardFiles::TarShardFiles(std::vector<std::string> shard_paths, TarMedia media)
    : shards_(shard_paths) {
  if (shards_.size() > std::numeric_limits<uint32_t>::max())
    throw InvalidArgument("too many tar shards");
  tars_ = std::make_unique<TarShardSet>(std::move(shard_paths));
  shard_samples_.reserve(shards_.size());
  for (uint32_t s = 0; s < shards_.size(); ++s) add_members(s, index_tar(*tars_, s, media));
}

TarShardFiles::TarShardFiles(std::shared_ptr<ShardCache> cache,
                             std::vector<std::vector<TarMember>> members) {
  if (!cache) throw InvalidArgument("TarShardFiles needs a shard cache");
  if (members.size() != cache->size())
    throw InvalidArgument("TarShardFiles: an index for " + std::to_string(members.size()) +
                          " shards, a cache of " + std::to_string(cache->size()));
  tars_ = std::make_unique<TarShardSet>(std::move(cache));
  shards_.reserve(tars_->size());
  shard_samples_.reserve(tars_->size());
  for (uint32_t s = 0; s < tars_->size(); ++s) {
    shards_.push_back(tars_->path(s));
    const uint64_t size = *tars_->remote_size(s);
    for (const TarMember& m : members[s])
      if (m.offset > size || m.size > size - m.offset)
        throw InvalidArgument("the index of tar shard " + shards_[s] + " puts member '" + m.name +
                              "' past the shard's " + std::to_string(size) +
                              " bytes: the index is stale (rebuild it with `stoker index`)");
    add_members(s, std::move(members[s]));
  }
}

void TarShardFiles::add_members(uint32_t s, std::vector<TarMember> members) {
  shard_samples_.push_back(members.size());
  for (TarMember& m : members)
    members_.push_back({s, m.offset, m.size, m.label, std::move(m.name)});
}

TarShardFiles::~TarShardFiles() = default;

std::string TarShardFiles::path(uint64_t i) const {
  const Member& m = members_[i];
  return shards_[m.shard] + ":" + m.name;
}

void TarShardFiles::read(uint64_t i, std::vector<std::byte>& buffer) const {
  const Member& m = members_[i];
  tars_->read(m.shard, m.offset, m.size, buffer, path(i));
}

std::vector<uint64_t> TarShardFiles::shards() const {
  std::vector<uint64_t> b;  // a shard without samples is no block
  for (const uint64_t n : shard_samples_)
    if (n > 0) b.push_back(n);
  return b;
}

std::vector<TarMember> TarShardFiles::index_file(const std::string& path, TarMedia media) {
  return index_tar(TarShardSet({path}), 0, media);
}

}  // namespace stoker
