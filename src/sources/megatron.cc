#include "stoker/sources/megatron.h"

#include <sys/stat.h>

#include <bit>
#include <cstring>
#include <memory>

#include "stoker/mapped_file.h"
#include "stoker/errors.h"

namespace stoker {
namespace {

static_assert(std::endian::native == std::endian::little,
              "Megatron .idx files are little-endian; they are read with plain loads");

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_file(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode);
}

struct RangeCopy {
  const std::byte* src;
  size_t bytes;
  void* dst;
};

void copy_range(void* arg) {
  const auto& c = *static_cast<const RangeCopy*>(arg);
  std::memcpy(c.dst, c.src, c.bytes);
}

// Reads one array of the .idx front to back, a chunk at a time under the mapping's SIGBUS guard,
// so that a long index costs no more memory than a chunk and a cut one raises IoError.
// REQUIRES: the array lies inside the mapping (the .idx's size was checked against its counts).
template <typename T>
class ArrayCursor {
 public:
  ArrayCursor(const MappedFile& file, uint64_t offset, uint64_t count)
      : file_(file), offset_(offset), count_(count) {}

  T next() {
    if (pos_ == filled_) refill();
    return buf_[pos_++];
  }

 private:
  void refill() {
    const uint64_t n = std::min<uint64_t>(kChunk, count_ - read_);
    RangeCopy c{file_.bytes().data() + offset_ + read_ * sizeof(T), n * sizeof(T), buf_.get()};
    file_.copy(copy_range, &c);
    read_ += n;
    filled_ = n;
    pos_ = 0;
  }

  static constexpr uint64_t kChunk = 8192;
  const MappedFile& file_;
  uint64_t offset_;
  uint64_t count_;
  uint64_t read_ = 0;  // elements copied so far
  std::unique_ptr<T[]> buf_ = std::make_unique<T[]>(kChunk);
  uint64_t filled_ = 0;
  uint64_t pos_ = 0;
};

}  // namespace

std::optional<MegatronPaths> megatron_paths(const std::string& path) {
  if (ends_with(path, ".idx")) return MegatronPaths{path.substr(0, path.size() - 4) + ".bin", path};
  if (ends_with(path, ".bin")) {
    const std::string idx = path.substr(0, path.size() - 4) + ".idx";
    if (is_file(idx)) return MegatronPaths{path, idx};
    return std::nullopt;
  }
  if (is_file(path)) return std::nullopt;
  const bool bin = is_file(path + ".bin"), idx = is_file(path + ".idx");
  if (bin && idx) return MegatronPaths{path + ".bin", path + ".idx"};
  if (bin || idx)
    throw IoError("Megatron dataset " + path + " has " + (bin ? ".bin" : ".idx") + " but no " +
                  (bin ? ".idx" : ".bin") + ": cannot open " + path + (bin ? ".idx" : ".bin"));
  return std::nullopt;  // a missing flat file: opening it says so
}

DType megatron_token_dtype(uint8_t code, const std::string& idx_path) {
  switch (code) {
    case 1:
      return {DType::kUInt, 8};
    case 2:
      return {DType::kInt, 8};
    case 3:
      return {DType::kInt, 16};
    case 4:
      return {DType::kInt, 32};
    case 5:
      return {DType::kInt, 64};
    case 6:
    case 7:
      throw InvalidArgument("Megatron index " + idx_path + " holds " +
                            (code == 6 ? "float64" : "float32") + " values (dtype code " +
                            std::to_string(code) + "), not token ids");
    case 8:
      return {DType::kUInt, 16};
    default:
      throw InvalidArgument("Megatron index " + idx_path + ": unknown dtype code " +
                            std::to_string(code) +
                            " (1-8: uint8, int8, int16, int32, int64, "
                            "float64, float32, uint16)");
  }
}

MegatronIndex read_megatron_index(const MappedFile& idx, uint64_t bin_size,
                                  const std::string& bin_path) {
  const std::string& path = idx.path();
  const uint64_t size = idx.bytes().size();
  auto fail = [&](const std::string& what) {
    return InvalidArgument("Megatron index " + path + ": " + what);
  };
  if (size < kMegatronIndexHeaderBytes)
    throw fail("truncated header (" + std::to_string(size) + " bytes, the header alone has " +
               std::to_string(kMegatronIndexHeaderBytes) + ")");
  std::byte header[kMegatronIndexHeaderBytes];
  RangeCopy hc{idx.bytes().data(), sizeof(header), header};
  idx.copy(copy_range, &hc);
  if (std::memcmp(header, kMegatronIndexMagic, sizeof(kMegatronIndexMagic)) != 0)
    throw fail("not a Megatron index (its first bytes are not \"MMIDIDX\\0\\0\")");
  uint64_t version, sequences, document_indices;
  std::memcpy(&version, header + 9, 8);
  const auto code = static_cast<uint8_t>(header[17]);
  std::memcpy(&sequences, header + 18, 8);
  std::memcpy(&document_indices, header + 26, 8);
  if (version != 1) throw fail("unknown version " + std::to_string(version) + " (1 is known)");

  MegatronIndex index;
  index.token_dtype = megatron_token_dtype(code, path);
  const uint64_t item = index.token_dtype.bytes();

  // The arrays' size, checked first so that every later read lies inside the file. The counts
  // are bounded by the file's size before they are multiplied, so nothing overflows.
  const uint64_t body = size - kMegatronIndexHeaderBytes;
  const bool too_many = sequences > body / 12 || document_indices > body / 8;
  const uint64_t need = too_many ? 0 : sequences * 12 + document_indices * 8;
  if (too_many || (body != need && body != need + sequences)) {
    const std::string counts = "its counts (" + std::to_string(sequences) + " sequences, " +
                               std::to_string(document_indices) + " document indices) need ";
    const std::string has = "the " + std::to_string(size) + " it has";
    if (too_many) throw fail(counts + "more bytes than " + has);
    throw fail(counts + std::to_string(kMegatronIndexHeaderBytes + need) + " bytes (or " +
               std::to_string(sequences) + " more with multimodal sequence modes), not " + has);
  }
  if (document_indices == 0)
    throw fail("no document indices (even an index of no documents holds the leading 0)");

  const uint64_t lengths_at = kMegatronIndexHeaderBytes;
  const uint64_t pointers_at = lengths_at + sequences * 4;
  const uint64_t documents_at = pointers_at + sequences * 8;
  ArrayCursor<int32_t> lengths(idx, lengths_at, sequences);
  ArrayCursor<int64_t> pointers(idx, pointers_at, sequences);
  ArrayCursor<int64_t> documents(idx, documents_at, document_indices);

  const int64_t first = documents.next();
  if (first != 0) throw fail("its document indices start at " + std::to_string(first) + ", not 0");
  index.document_ends.reserve(document_indices - 1);
  uint64_t seq = 0;       // sequences read
  uint64_t expected = 0;  // where sequence `seq` must start: right after the one before
  uint64_t tokens = 0;
  int64_t previous = 0;
  for (uint64_t d = 1; d < document_indices; ++d) {
    const int64_t end = documents.next();
    if (end < previous || static_cast<uint64_t>(end) > sequences)
      throw fail("document index " + std::to_string(d) + " is " + std::to_string(end) +
                 (end < previous ? ", below the one before (" + std::to_string(previous) + ")"
                                 : ", past the " + std::to_string(sequences) + " sequences"));
    previous = end;
    for (; seq < static_cast<uint64_t>(end); ++seq) {
      const int64_t length = lengths.next();
      const int64_t pointer = pointers.next();
      if (length < 0)
        throw fail("sequence " + std::to_string(seq) + " has a negative length (" +
                   std::to_string(length) + ")");
      if (seq == 0) {
        if (pointer < 0)
          throw fail("sequence 0 starts at a negative offset (" + std::to_string(pointer) + ")");
        expected = static_cast<uint64_t>(pointer);
        index.data_offset = expected;
        if (expected > bin_size)
          throw InvalidArgument("Megatron data file " + bin_path +
                                " is shorter than its index says: sequence 0 starts at byte " +
                                std::to_string(expected) + ", the file has " +
                                std::to_string(bin_size) + " bytes");
      } else if (pointer < 0 || static_cast<uint64_t>(pointer) != expected) {
        throw fail("sequence " + std::to_string(seq) + " starts at byte " +
                   std::to_string(pointer) + ", not right after sequence " +
                   std::to_string(seq - 1) + " (byte " + std::to_string(expected) +
                   "): sequences must lie end to end, as Megatron writes them");
      }
      // expected <= bin_size here and a length is below 2^31: no overflow.
      expected += static_cast<uint64_t>(length) * item;
      if (expected > bin_size)
        throw InvalidArgument("Megatron data file " + bin_path +
                              " is shorter than its index says: sequence " + std::to_string(seq) +
                              " ends at byte " + std::to_string(expected) + ", the file has " +
                              std::to_string(bin_size) + " bytes");
      tokens += static_cast<uint64_t>(length);
    }
    index.document_ends.push_back(tokens);
  }
  if (seq != sequences)
    throw fail("its document indices end at sequence " + std::to_string(seq) + ", not at the " +
               std::to_string(sequences) + " sequences it holds");
  if (sequences > 0 && expected != bin_size)
    throw InvalidArgument("Megatron data file " + bin_path +
                          " is longer than its index says: its sequences end at byte " +
                          std::to_string(expected) + ", the file has " + std::to_string(bin_size) +
                          " bytes");
  index.num_tokens = tokens;
  return index;
}

}  // namespace stoker
