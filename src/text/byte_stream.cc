#include "text/byte_stream.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "stoker/errors.h"

namespace stoker::text {
namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

class File {
 public:
  File(const std::string& path, const std::string& origin) : origin_(origin) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw IoError("cannot open " + origin + ": " + std::strerror(errno));
  }
  ~File() { ::close(fd_); }
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  size_t read(char* out, size_t capacity) {
    for (;;) {
      const ssize_t n = ::read(fd_, out, capacity);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno != EINTR) throw IoError("cannot read " + origin_ + ": " + std::strerror(errno));
    }
  }
  const std::string& origin() const { return origin_; }

 private:
  std::string origin_;
  int fd_ = -1;
};

class PlainStream final : public ByteStream {
 public:
  PlainStream(const std::string& path, const std::string& origin) : file_(path, origin) {}
  size_t read(char* out, size_t capacity) override { return file_.read(out, capacity); }

 private:
  File file_;
};

// The compressed bytes of a file, a block at a time.
class Compressed {
 public:
  Compressed(const std::string& path, const std::string& origin) : file_(path, origin) {}
  // Refills when everything was consumed; false at the end of the file.
  bool fill() {
    if (pos_ < size_) return true;
    size_ = file_.read(block_.data(), block_.size());
    pos_ = 0;
    return size_ > 0;
  }
  const char* data() const { return block_.data() + pos_; }
  size_t available() const { return size_ - pos_; }
  void consume(size_t n) { pos_ += n; }
  const std::string& origin() const { return file_.origin(); }

 private:
  File file_;
  std::vector<char> block_ = std::vector<char>(1 << 18);
  size_t pos_ = 0, size_ = 0;
};

class GzipStream final : public ByteStream {
 public:
  GzipStream(const std::string& path, const std::string& origin) : in_(path, origin) {
    if (inflateInit2(&z_, 16 + MAX_WBITS) != Z_OK)
      throw Error("zlib: cannot start inflating " + origin);
  }
  ~GzipStream() override { inflateEnd(&z_); }

  size_t read(char* out, size_t capacity) override {
    size_t produced = 0;
    while (produced == 0 && !done_) {
      if (!in_.fill()) {
        if (in_member_) throw DecodeError(in_.origin() + ": truncated gzip data");
        done_ = true;
        break;
      }
      z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in_.data()));
      z_.avail_in = static_cast<uInt>(in_.available());
      z_.next_out = reinterpret_cast<Bytef*>(out);
      z_.avail_out = static_cast<uInt>(capacity);
      const int rc = inflate(&z_, Z_NO_FLUSH);
      in_.consume(in_.available() - z_.avail_in);
      produced = capacity - z_.avail_out;
      in_member_ = true;
      if (rc == Z_STREAM_END) {  // a member ends; another may follow (concatenated gzip)
        in_member_ = false;
        inflateReset(&z_);
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        throw DecodeError(in_.origin() + ": corrupt gzip data (" +
                          (z_.msg != nullptr ? z_.msg : "zlib error " + std::to_string(rc)) +
                          ")");
      }
    }
    return produced;
  }

 private:
  Compressed in_;
  z_stream z_{};
  bool in_member_ = false, done_ = false;
};

class ZstdStream final : public ByteStream {
 public:
  ZstdStream(const std::string& path, const std::string& origin)
      : in_(path, origin), ctx_(ZSTD_createDCtx()) {
    if (ctx_ == nullptr) throw Error("zstd: cannot create a context for " + origin);
  }
  ~ZstdStream() override { ZSTD_freeDCtx(ctx_); }

  size_t read(char* out, size_t capacity) override {
    ZSTD_outBuffer o{out, capacity, 0};
    while (o.pos == 0) {
      if (!in_.fill()) {
        if (pending_ != 0) throw DecodeError(in_.origin() + ": truncated zstd data");
        return 0;
      }
      ZSTD_inBuffer i{in_.data(), in_.available(), 0};
      pending_ = ZSTD_decompressStream(ctx_, &o, &i);
      in_.consume(i.pos);
      if (ZSTD_isError(pending_))
        throw DecodeError(in_.origin() + ": corrupt zstd data (" +
                          ZSTD_getErrorName(pending_) + ")");
    }
    return o.pos;
  }

 private:
  Compressed in_;
  ZSTD_DCtx* ctx_;
  size_t pending_ = 0;  // nonzero: inside a frame
};

}  // namespace

std::unique_ptr<ByteStream> ByteStream::open(const std::string& path, const std::string& origin) {
  if (ends_with(path, ".gz")) return std::make_unique<GzipStream>(path, origin);
  if (ends_with(path, ".zst") || ends_with(path, ".zstd"))
    return std::make_unique<ZstdStream>(path, origin);
  return std::make_unique<PlainStream>(path, origin);
}

}  // namespace stoker::text
