#include "stoker/sources/tokens.h"

#include <cstring>

#include "stoker/mapped_file.h"
#include "stoker/errors.h"
#include "stoker/sources/npy.h"

namespace stoker {
namespace {

// Loads through memcpy: a .npy file's tokens need not be aligned (its header may have any length).
template <typename T>
void widen(const std::byte* src, uint64_t count, std::byte* dst) {
  int64_t* out = reinterpret_cast<int64_t*>(dst);
  for (uint64_t t = 0; t < count; ++t) {
    T v;
    std::memcpy(&v, src + t * sizeof(T), sizeof(T));
    out[t] = static_cast<int64_t>(v);
  }
}

uint32_t le32(const std::byte* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

// One window's copy, run under MappedFile's guard (no destructors, no locks).
struct WindowCopy {
  const std::byte* window;
  uint64_t seq_len;
  size_t item;
  std::byte* input;
  std::byte* target;
};

void copy_window(void* arg) {
  const auto& c = *static_cast<const WindowCopy*>(arg);
  if (c.item == 2) {
    widen<uint16_t>(c.window, c.seq_len, c.input);
    widen<uint16_t>(c.window + c.item, c.seq_len, c.target);
  } else {
    widen<uint32_t>(c.window, c.seq_len, c.input);
    widen<uint32_t>(c.window + c.item, c.seq_len, c.target);
  }
}

}  // namespace

TokenFileLayout parse_token_file(std::span<const std::byte> head, uint64_t file_size,
                                 DType token_dtype, const std::string& path) {
  if (token_dtype != DType{DType::kUInt, 16} && token_dtype != DType{DType::kUInt, 32})
    throw InvalidArgument("TokenDataset dtype must be \"uint16\" or \"uint32\", got \"" +
                          token_dtype.name() + "\"");
  if (head.size() > file_size) head = head.first(file_size);
  const size_t item = token_dtype.bytes();
  TokenFileLayout layout;
  if (head.size() >= 6 && std::memcmp(head.data(), "\x93NUMPY", 6) == 0) {
    const NpyHeader h = parse_npy_header(head, file_size, path);
    if (h.shape.size() != 1)
      throw InvalidArgument("token file " + path + ": a .npy token file holds a 1-d array, not " +
                            std::to_string(h.shape.size()) + "-d");
    if (h.dtype != token_dtype)
      throw InvalidArgument("token file " + path + " holds " + h.dtype.name() + " tokens, not " +
                            token_dtype.name() + " (pass dtype=\"" + h.dtype.name() + "\")");
    layout.format = TokenFileLayout::Format::kNpy;
    layout.data_offset = h.data_offset;
    layout.num_tokens = static_cast<uint64_t>(h.shape[0]);
    return layout;
  }
  if (head.size() >= 4 && le32(head.data()) == kLlmcTokenMagic) {
    if (file_size < kLlmcHeaderBytes || head.size() < kLlmcHeaderBytes)
      throw InvalidArgument("token file " + path + ": truncated llm.c header (" +
                            std::to_string(file_size) + " bytes, the header alone has " +
                            std::to_string(kLlmcHeaderBytes) + ")");
    const uint32_t version = le32(head.data() + 4);
    if (version != 1 && version != 2)
      throw InvalidArgument("token file " + path + ": unknown llm.c header version " +
                            std::to_string(version) + " (1: uint16 tokens, 2: uint32 tokens)");
    const DType stored{DType::kUInt, static_cast<uint8_t>(version == 1 ? 16 : 32)};
    if (stored != token_dtype)
      throw InvalidArgument("token file " + path + " holds " + stored.name() +
                            " tokens (llm.c header version " + std::to_string(version) + "), not " +
                            token_dtype.name() + " (pass dtype=\"" + stored.name() + "\")");
    const uint64_t count = le32(head.data() + 8);
    const uint64_t have = file_size - kLlmcHeaderBytes;
    if (have != count * item)
      throw InvalidArgument(
          "token file " + path + " is " + (have < count * item ? "shorter" : "longer") +
          " than its header says: " + std::to_string(count) + " tokens (" +
          std::to_string(count * item) + " bytes) after the " + std::to_string(kLlmcHeaderBytes) +
          "-byte header, found " + std::to_string(have) + " bytes");
    layout.format = TokenFileLayout::Format::kLlmc;
    layout.data_offset = kLlmcHeaderBytes;
    layout.num_tokens = count;
    return layout;
  }
  if (file_size % item != 0)
    throw InvalidArgument("token file " + path + " has " + std::to_string(file_size) +
                          " bytes, not a multiple of " + std::to_string(item) + " (" +
                          token_dtype.name() + " tokens)");
  layout.num_tokens = file_size / item;
  return layout;
}

TokenSource::TokenSource(std::string path, DType token_dtype, uint64_t seq_len)
    : path_(std::move(path)), token_dtype_(token_dtype), seq_len_(seq_len) {
  if (token_dtype != DType{DType::kUInt, 16} && token_dtype != DType{DType::kUInt, 32})
    throw InvalidArgument("TokenDataset dtype must be \"uint16\" or \"uint32\", got \"" +
                          token_dtype.name() + "\"");
  if (seq_len == 0) throw InvalidArgument("seq_len must be a positive integer, got 0");
  file_ = std::make_unique<MappedFile>(path_, "token file");
  const std::span<const std::byte> bytes = file_->bytes();
  layout_ = parse_token_file(bytes, bytes.size(), token_dtype, path_);
  if (layout_.num_tokens < seq_len + 1)
    throw InvalidArgument("token file " + path_ + " has " + std::to_string(layout_.num_tokens) +
                          " tokens; seq_len " + std::to_string(seq_len) + " needs at least " +
                          std::to_string(seq_len + 1));
  tokens_ = bytes.data() + layout_.data_offset;
  size_ = (layout_.num_tokens - 1) / seq_len;
  const std::vector<int64_t> shape{static_cast<int64_t>(seq_len)};
  fields_ = {{"input", kInt64, shape}, {"target", kInt64, shape}};
}

TokenSource::~TokenSource() = default;

void TokenSource::prefetch(uint64_t index) const {
  // The first lines of the window; the hardware prefetcher streams the rest of it.
  const std::byte* window = tokens_ + index * seq_len_ * token_dtype_.bytes();
  for (int l = 0; l < 4; ++l) __builtin_prefetch(window + l * 64);
}

void TokenSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                       WorkerState*) const {
  const size_t item = token_dtype_.bytes();
  WindowCopy c{tokens_ + key.index * seq_len_ * item, seq_len_, item, slots[0], slots[1]};
  file_->copy(copy_window, &c);
}

}  // namespace stoker
