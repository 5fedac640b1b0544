// .npy files (NumPy's format, versions 1.0, 2.0 and 3.0): the header parser, and a file mapped
// read-only as the array its header describes.
//
// The header is a Python dict literal, {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)},
// after a magic string, a version and a length. Supported element types are those of ArraySource:
// bool, signed and unsigned integers, floats and complex numbers, in native byte order (or one
// byte). Structured, object, string and datetime dtypes are refused, as is a non-native byte order.
//
// Thread safety: parse_npy_header is reentrant; an NpyFile is immutable after construction.
// Errors: InvalidArgument naming the file and what is wrong (not a .npy file, an unsupported
// version or dtype, a malformed header, a shape whose size overflows, fewer data bytes than the
// header describes); IoError when the file cannot be opened or mapped.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "stoker/dtype.h"
#include "stoker/sources/array.h"

namespace stoker {

struct NpyHeader {
  DType dtype;
  std::vector<int64_t> shape;  // empty for a 0-d array
  bool fortran_order = false;
  uint64_t data_offset = 0;  // where the array's bytes start in the file
  uint64_t data_bytes = 0;   // itemsize x the product of the shape
};

// The largest header accepted (NumPy's np.load refuses more than 10,000 bytes by default).
inline constexpr uint64_t kNpyMaxHeaderBytes = 1 << 20;

// Parses the header at the start of a .npy file of `file_size` bytes. `head` is the file's first
// bytes: the whole header (at most 12 + kNpyMaxHeaderBytes bytes), or the whole file if shorter.
// `path` names the file in messages. Checks that the file holds data_bytes after the header.
NpyHeader parse_npy_header(std::span<const std::byte> head, uint64_t file_size,
                           const std::string& path);

// The array a header describes, over the file's bytes starting at `file_start` (C or Fortran
// order strides). REQUIRES: file_start points at the header.data_offset + header.data_bytes
// bytes of the file (parse_npy_header checked the file holds them).
ArrayView npy_array_view(const NpyHeader& header, const std::byte* file_start,
                         std::string name = {});

class MappedFile;

// A .npy file mapped read-only. view() is the array (C or Fortran order) over the mapping, valid
// while the NpyFile lives; rows are read in place, nothing is copied. The view carries the
// mapping as its guard (ArrayView::mapping): an ArraySource reading it survives the file being
// truncated, throwing IoError naming the file for the rows that are gone. Reading view().data
// directly is not guarded.
class NpyFile {
 public:
  explicit NpyFile(const std::string& path);
  ~NpyFile();
  NpyFile(const NpyFile&) = delete;
  NpyFile& operator=(const NpyFile&) = delete;

  const std::string& path() const;
  const NpyHeader& header() const { return header_; }
  // REQUIRES: a header with at least one dimension for ArraySource (a 0-d array is one element).
  ArrayView view(std::string name = {}) const;

 private:
  std::unique_ptr<MappedFile> file_;
  NpyHeader header_;
};

}  // namespace stoker
