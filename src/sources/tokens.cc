#include "stoker/sources/tokens.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "stoker/errors.h"

namespace stoker {
namespace {

template <typename T>
void widen(const std::byte* src, uint64_t count, std::byte* dst) {
  const T* in = reinterpret_cast<const T*>(src);
  int64_t* out = reinterpret_cast<int64_t*>(dst);
  for (uint64_t t = 0; t < count; ++t) out[t] = static_cast<int64_t>(in[t]);
}

}  // namespace

TokenSource::TokenSource(std::string path, DType token_dtype, uint64_t seq_len)
    : path_(std::move(path)), token_dtype_(token_dtype), seq_len_(seq_len) {
  if (token_dtype != DType{DType::kUInt, 16} && token_dtype != DType{DType::kUInt, 32})
    throw InvalidArgument("TokenDataset dtype must be \"uint16\" or \"uint32\", got \"" +
                          token_dtype.name() + "\"");
  if (seq_len == 0) throw InvalidArgument("seq_len must be a positive integer, got 0");
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError("cannot open token file " + path_ + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw IoError("cannot stat token file " + path_ + ": " + std::strerror(err));
  }
  map_bytes_ = static_cast<size_t>(st.st_size);
  const size_t item = token_dtype.bytes();
  if (map_bytes_ % item != 0) {
    ::close(fd);
    throw InvalidArgument("token file " + path_ + " has " + std::to_string(map_bytes_) +
                          " bytes, not a multiple of " + std::to_string(item) + " (" +
                          token_dtype.name() + " tokens)");
  }
  num_tokens_ = map_bytes_ / item;
  if (num_tokens_ < seq_len + 1) {
    ::close(fd);
    throw InvalidArgument("token file " + path_ + " has " + std::to_string(num_tokens_) +
                          " tokens; seq_len " + std::to_string(seq_len) + " needs at least " +
                          std::to_string(seq_len + 1));
  }
  void* map = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);  // the mapping stays valid without the descriptor
  if (map == MAP_FAILED)
    throw IoError("cannot map token file " + path_ + ": " + std::strerror(err));
  map_ = static_cast<const std::byte*>(map);
  size_ = (num_tokens_ - 1) / seq_len;
  const std::vector<int64_t> shape{static_cast<int64_t>(seq_len)};
  fields_ = {{"input", kInt64, shape}, {"target", kInt64, shape}};
}

TokenSource::~TokenSource() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), map_bytes_);
}

void TokenSource::prefetch(uint64_t index) const {
  // The first lines of the window; the hardware prefetcher streams the rest of it.
  const std::byte* window = map_ + index * seq_len_ * token_dtype_.bytes();
  for (int l = 0; l < 4; ++l) __builtin_prefetch(window + l * 64);
}

void TokenSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                       WorkerState*) const {
  const size_t item = token_dtype_.bytes();
  const std::byte* window = map_ + key.index * seq_len_ * item;
  if (item == 2) {
    widen<uint16_t>(window, seq_len_, slots[0]);
    widen<uint16_t>(window + item, seq_len_, slots[1]);
  } else {
    widen<uint32_t>(window, seq_len_, slots[0]);
    widen<uint32_t>(window + item, seq_len_, slots[1]);
  }
}

}  // namespace stoker
