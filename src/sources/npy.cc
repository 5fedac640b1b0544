#include "stoker/sources/npy.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <optional>

#include "stoker/mapped_file.h"
#include "stoker/errors.h"

namespace stoker {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicBytes = 6;

// A cursor over the header's dict literal. Each method skips leading whitespace.
class Literal {
 public:
  explicit Literal(std::string_view text) : text_(text) {}

  bool at_end() {
    skip_space();
    return pos_ == text_.size();
  }
  bool accept(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  // A quoted string without escapes ('...' or "...").
  std::optional<std::string> string() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return std::nullopt;
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == std::string_view::npos) return std::nullopt;
    std::string s(text_.substr(pos_, end - pos_));
    if (s.find('\\') != std::string::npos) return std::nullopt;
    pos_ = end + 1;
    return s;
  }
  std::optional<bool> boolean() {
    skip_space();
    for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
      const size_t n = std::strlen(word);
      if (text_.substr(pos_, n) == word) {
        pos_ += n;
        return value;
      }
    }
    return std::nullopt;
  }
  // A non-negative decimal integer (Python 2 wrote a trailing L on longs).
  std::optional<int64_t> integer() {
    skip_space();
    const size_t start = pos_;
    uint64_t v = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      v = v * 10 + static_cast<uint64_t>(text_[pos_++] - '0');
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    }
    if (pos_ == start) return std::nullopt;
    if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;
    return static_cast<int64_t>(v);
  }
  char peek() {
    skip_space();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }

 private:
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  std::string_view text_;
  size_t pos_ = 0;
};

// NumPy's array-protocol type string ('<f4', '|u1', ...) as a native DType.
DType parse_descr(const std::string& d, const std::string& path) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(".npy file " + path + ": dtype '" + d + "' " + why +
                           "; supported are bool, integer, float and complex dtypes");
  };
  if (d.size() < 3 || std::strchr("<>|=", d[0]) == nullptr) throw bad("is not a plain dtype");
  uint64_t size = 0;
  for (size_t i = 2; i < d.size(); ++i) {
    if (d[i] < '0' || d[i] > '9' || size > 64) throw bad("is not a plain dtype");
    size = size * 10 + static_cast<uint64_t>(d[i] - '0');
  }
  DType t;
  switch (d[1]) {
    case 'b':
      if (size != 1) throw bad("is not supported");
      t = {DType::kBool, 8};
      break;
    case 'i':
    case 'u':
      if (size != 1 && size != 2 && size != 4 && size != 8) throw bad("is not supported");
      t = {d[1] == 'i' ? DType::kInt : DType::kUInt, static_cast<uint8_t>(size * 8)};
      break;
    case 'f':
      if (size != 2 && size != 4 && size != 8) throw bad("is not supported");
      t = {DType::kFloat, static_cast<uint8_t>(size * 8)};
      break;
    case 'c':
      if (size != 8 && size != 16) throw bad("is not supported");
      t = {DType::kComplex, static_cast<uint8_t>(size * 8)};
      break;
    default:
      throw bad("is not supported");
  }
  const bool little = std::endian::native == std::endian::little;
  if (size > 1 && ((d[0] == '>' && little) || (d[0] == '<' && !little)))
    throw InvalidArgument(".npy file " + path + ": dtype '" + d +
                          "' has non-native byte order; convert it with "
                          "a.astype(a.dtype.newbyteorder('='))");
  return t;
}

uint32_t little_endian(const std::byte* p, int n) {
  uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

NpyHeader parse_npy_header(std::span<const std::byte> head, uint64_t file_size,
                           const std::string& path) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(".npy file " + path + ": " + why);
  };
  if (head.size() > file_size) head = head.first(file_size);
  if (head.size() < kMagicBytes + 2 || std::memcmp(head.data(), kMagic, kMagicBytes) != 0)
    throw bad("not a .npy file (no \\x93NUMPY magic string)");
  const int major = static_cast<uint8_t>(head[6]);
  if (major < 1 || major > 3)
    throw bad("unsupported format version " + std::to_string(major) + "." +
              std::to_string(static_cast<uint8_t>(head[7])));
  const int len_bytes = major == 1 ? 2 : 4;
  const size_t prefix = kMagicBytes + 2 + len_bytes;
  if (head.size() < prefix) throw bad("truncated header");
  const uint64_t header_len = little_endian(head.data() + kMagicBytes + 2, len_bytes);
  if (header_len > kNpyMaxHeaderBytes)
    throw bad("header of " + std::to_string(header_len) + " bytes is too large");
  if (prefix + header_len > head.size())
    throw bad("truncated header (" + std::to_string(header_len) + " bytes announced, " +
              std::to_string(head.size() - prefix) + " present)");
  const std::string_view text(reinterpret_cast<const char*>(head.data()) + prefix, header_len);

  NpyHeader h;
  h.data_offset = prefix + header_len;
  Literal lit(text);
  std::optional<std::string> descr;
  std::optional<bool> fortran;
  std::optional<std::vector<int64_t>> shape;
  if (!lit.accept('{')) throw bad("malformed header (not a dict)");
  while (!lit.accept('}')) {
    const std::optional<std::string> key = lit.string();
    if (!key || !lit.accept(':')) throw bad("malformed header (expected 'key': value)");
    if (*key == "descr") {
      if (descr) throw bad("malformed header (two 'descr' keys)");
      if (lit.peek() == '[') throw bad("structured dtypes are not supported");
      descr = lit.string();
      if (!descr) throw bad("malformed header ('descr' is not a string)");
    } else if (*key == "fortran_order") {
      if (fortran) throw bad("malformed header (two 'fortran_order' keys)");
      fortran = lit.boolean();
      if (!fortran) throw bad("malformed header ('fortran_order' is not True or False)");
    } else if (*key == "shape") {
      if (shape) throw bad("malformed header (two 'shape' keys)");
      if (!lit.accept('(')) throw bad("malformed header ('shape' is not a tuple)");
      shape.emplace();
      while (!lit.accept(')')) {
        const std::optional<int64_t> dim = lit.integer();
        if (!dim) throw bad("malformed header (a dimension of 'shape' is not an integer >= 0)");
        if (shape->size() == 64) throw bad("more than 64 dimensions");
        shape->push_back(*dim);
        if (!lit.accept(',') && lit.peek() != ')')
          throw bad("malformed header ('shape' is not a tuple of integers)");
      }
    } else {
      throw bad("malformed header (unexpected key '" + *key + "')");
    }
    if (!lit.accept(',') && lit.peek() != '}') throw bad("malformed header (expected , or })");
  }
  if (!lit.at_end()) throw bad("malformed header (text after the dict)");
  if (!descr || !fortran || !shape)
    throw bad("malformed header (it needs the keys 'descr', 'fortran_order' and 'shape')");

  h.dtype = parse_descr(*descr, path);
  h.fortran_order = *fortran;
  h.shape = std::move(*shape);
  // The byte extent with empty dimensions counted as 1 bounds every stride (view() computes them
  // in int64), and the size in bytes too.
  uint64_t extent = h.dtype.bytes();
  bool empty = false;
  for (int64_t d : h.shape) {
    empty = empty || d == 0;
    if (__builtin_mul_overflow(extent, static_cast<uint64_t>(std::max<int64_t>(d, 1)), &extent) ||
        extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw bad("shape too large (its size in bytes overflows)");
  }
  h.data_bytes = empty ? 0 : extent;
  if (file_size < h.data_offset || file_size - h.data_offset < h.data_bytes)
    throw bad("truncated: the header describes " + std::to_string(h.data_bytes) +
              " bytes of data after offset " + std::to_string(h.data_offset) +
              " but the file has " + std::to_string(file_size) + " bytes");
  return h;
}

NpyFile::NpyFile(const std::string& path) : file_(std::make_unique<MappedFile>(path, ".npy file")) {
  const std::span<const std::byte> bytes = file_->bytes();
  header_ = parse_npy_header(bytes, bytes.size(), path);
}

NpyFile::~NpyFile() = default;

ArrayView npy_array_view(const NpyHeader& header, const std::byte* file_start, std::string name) {
  ArrayView v;
  v.data = file_start + header.data_offset;
  v.dtype = header.dtype;
  v.shape = header.shape;
  v.strides.resize(v.shape.size());
  int64_t stride = static_cast<int64_t>(header.dtype.bytes());
  const size_t n = v.shape.size();
  for (size_t k = 0; k < n; ++k) {
    const size_t d = header.fortran_order ? k : n - 1 - k;
    v.strides[d] = stride;
    stride *= std::max<int64_t>(v.shape[d], 1);  // no overflow: parse_npy_header checked
  }
  v.name = std::move(name);
  return v;
}

const std::string& NpyFile::path() const { return file_->path(); }

ArrayView NpyFile::view(std::string name) const {
  ArrayView v = npy_array_view(header_, file_->bytes().data(), std::move(name));
  v.mapping = file_.get();
  return v;
}

}  // namespace stoker
