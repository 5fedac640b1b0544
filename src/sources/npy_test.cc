#include "stoker/sources/npy.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "stoker/errors.h"
#include "engine/test_temp_dir.h"

namespace stoker {
namespace {

// A header as NumPy writes it: version `major`, the dict padded with spaces to a multiple of 64
// bytes, ending in a newline.
std::string header(const std::string& dict, int major = 1) {
  const size_t len_bytes = major == 1 ? 2 : 4;
  std::string d = dict;
  while ((8 + len_bytes + d.size() + 1) % 64 != 0) d += ' ';
  d += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < len_bytes; ++i) out += static_cast<char>((d.size() >> (8 * i)) & 0xff);
  return out + d;
}

NpyHeader parse(const std::string& file) {
  return parse_npy_header(std::as_bytes(std::span(file)), file.size(), "x.npy");
}

std::string error_of(const std::string& file) {
  try {
    parse(file);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(NpyHeader, WhatNumpyWrites) {
  const std::string f =
      header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }") + std::string(48, 'x');
  const NpyHeader h = parse(f);
  EXPECT_EQ(h.dtype, kFloat32);
  EXPECT_EQ(h.shape, (std::vector<int64_t>{3, 4}));
  EXPECT_FALSE(h.fortran_order);
  EXPECT_EQ(h.data_offset, 128u);  // np.save pads the header to a multiple of 64 bytes
  EXPECT_EQ(h.data_bytes, 48u);
}

TEST(NpyHeader, VersionsKeyOrderShapesAndDtypes) {
  EXPECT_EQ(parse(header("{'shape': (), 'fortran_order': True, 'descr': '|b1'}", 2) + "x").shape,
            std::vector<int64_t>{});
  const NpyHeader v3 = parse(header("{\"descr\": \"<i8\", \"fortran_order\": True, "
                                    "\"shape\": (2L,3)}",
                                    3) +
                             std::string(48, '\0'));
  EXPECT_EQ(v3.dtype, kInt64);
  EXPECT_TRUE(v3.fortran_order);
  EXPECT_EQ(v3.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(v3.data_offset, 128u);
  const NpyHeader empty =
      parse(header("{'descr': '<u2', 'fortran_order': False, 'shape': (0, 7)}"));
  EXPECT_EQ(empty.data_bytes, 0u);
  EXPECT_EQ(parse(header("{'descr': '<c16', 'fortran_order': False, 'shape': (1,)}") +
                  std::string(16, '\0'))
                .dtype,
            (DType{DType::kComplex, 128}));
  EXPECT_EQ(parse(header("{'descr': '|u1', 'fortran_order': False, 'shape': (5,)}") + "abcdefg")
                .data_bytes,
            5u);  // trailing bytes after the data are allowed, as np.load allows them
}

TEST(NpyHeader, RefusesWithAReason) {
  const std::string ok_tail = ", 'fortran_order': False, 'shape': (1,)}";
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos;
  };
  EXPECT_TRUE(has(error_of("PK\x03\x04 zip"), "not a .npy file"));
  EXPECT_TRUE(has(error_of(""), "not a .npy file"));
  std::string v4 = header("{}");
  v4[6] = 4;
  EXPECT_TRUE(has(error_of(v4), "unsupported format version 4.0"));
  EXPECT_TRUE(has(error_of(header("{'descr': [('a', '<f4')]" + ok_tail)), "structured dtypes"));
  EXPECT_TRUE(has(error_of(header("{'descr': '>f4'" + ok_tail) + "1234"), "non-native byte order"));
  EXPECT_TRUE(has(error_of(header("{'descr': '|O'" + ok_tail)), "dtype '|O' is not a plain dtype"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<U3'" + ok_tail)), "dtype '<U3' is not supported"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<f16'" + ok_tail)), "is not supported"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<f4', 'shape': (1,)}")), "it needs the keys"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<f4', 'descr': '<f4'" + ok_tail)), "two 'descr'"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<f4', 'x': 1" + ok_tail)), "unexpected key 'x'"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<f4', 'fortran_order': 0, 'shape': (1,)}")),
                  "'fortran_order' is not True or False"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}")),
                  "not an integer >= 0"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<f4', 'fortran_order': False, 'shape': (1 2)}")),
                  "not a tuple of integers"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<f4'" + ok_tail + " junk")), "text after the dict"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<f4', 'fortran_order': False, "
                                  "'shape': (4611686018427387904, 4)}")),
                  "shape too large"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<f4', 'fortran_order': False, "
                                  "'shape': (0, 4611686018427387904, 4)}")),
                  "shape too large"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)}") +
                           std::string(47, 'x')),
                  "truncated: the header describes 48 bytes of data after offset 128 but the file "
                  "has 175 bytes"));
  EXPECT_TRUE(has(error_of(header("{'descr': '<f4'" + ok_tail).substr(0, 30)), "truncated header"));
  std::string huge = header("{}", 2);
  huge[10] = '\x7f';  // a 2 GiB header length
  EXPECT_TRUE(has(error_of(huge), "too large"));
}

TEST(NpyFile, MapsCAndFortranOrderArrays) {
  testing::TempDir dir;
  // 2 x 3 int32 values 0..5: C order stores rows, Fortran order columns.
  const int32_t c_order[6] = {0, 1, 2, 3, 4, 5};
  const int32_t f_order[6] = {0, 3, 1, 4, 2, 5};
  for (bool fortran : {false, true}) {
    const std::string path = dir.path(fortran ? "f.npy" : "c.npy");
    {
      std::ofstream out(path, std::ios::binary);
      out << header(std::string("{'descr': '<i4', 'fortran_order': ") +
                    (fortran ? "True" : "False") + ", 'shape': (2, 3), }");
      out.write(reinterpret_cast<const char*>(fortran ? f_order : c_order), sizeof c_order);
    }
    NpyFile file(path);
    const ArrayView v = file.view("rows");
    ASSERT_EQ(v.shape, (std::vector<int64_t>{2, 3}));
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t c = 0; c < 3; ++c) {
        int32_t x;
        std::memcpy(&x, v.data + r * v.strides[0] + c * v.strides[1], 4);
        EXPECT_EQ(x, r * 3 + c) << "fortran " << fortran;
      }
    EXPECT_EQ(v.name, "rows");
  }
  EXPECT_THROW(NpyFile(dir.path("missing.npy")), IoError);
}

TEST(NpyFile, RowsOfNoBytesAreReadWithoutWalkingTheirDimensions) {
  // (2, 2**40, 0) int16: every row is empty; a strided copy of one would loop 2**40 times.
  const std::string f =
      header("{'descr': '<i2', 'fortran_order': False, 'shape': (2, 1099511627776, 0), }");
  const NpyHeader h = parse(f);
  EXPECT_EQ(h.data_bytes, 0u);
  ArraySource source({npy_array_view(h, reinterpret_cast<const std::byte*>(f.data()), "x")});
  std::byte none[1];
  std::byte* slots[1] = {none};
  source.read({0, 0, 1}, slots, nullptr);
  EXPECT_EQ(source.fields()[0].sample_bytes(), 0u);
}

// Writes a .npy file of int32 `values` with the given shape and order; returns its path.
std::string write_npy(const testing::TempDir& dir, const std::string& name,
                      const std::string& shape, bool fortran, const std::vector<int32_t>& values) {
  const std::string path = dir.path(name);
  std::ofstream out(path, std::ios::binary);
  out << header("{'descr': '<i4', 'fortran_order': " + std::string(fortran ? "True" : "False") +
                ", 'shape': " + shape + ", }");
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * 4));
  return path;
}

TEST(NpyFile, ARowOfAFileTruncatedWhileMappedRaisesIoErrorNamingIt) {
  testing::TempDir dir;
  // 128 rows of 256 int32 (1 KiB each) after a 128-byte header: 129 KiB, many pages.
  std::vector<int32_t> values(128 * 256);
  std::iota(values.begin(), values.end(), 0);
  const std::string c_path = write_npy(dir, "rows.npy", "(128, 256)", false, values);
  // The same numbers in Fortran order: every row is strided across the whole file.
  const std::string f_path = write_npy(dir, "cols.npy", "(256, 128)", true, values);
  NpyFile c_file(c_path), f_file(f_path);
  std::vector<int64_t> labels(128);
  std::iota(labels.begin(), labels.end(), 0);
  ArrayView in_memory{reinterpret_cast<const std::byte*>(labels.data()), kInt64, {128}, {8}, "y"};
  ArraySource rows({c_file.view("x"), in_memory});
  ArraySource cols({f_file.view("x")});
  EXPECT_EQ(rows.path(5), c_path);
  EXPECT_EQ(cols.path(5), f_path);

  std::vector<int32_t> row(256), col(128);
  int64_t label = -1;
  std::byte* row_slots[2] = {reinterpret_cast<std::byte*>(row.data()),
                             reinterpret_cast<std::byte*>(&label)};
  std::byte* col_slots[1] = {reinterpret_cast<std::byte*>(col.data())};
  rows.read({0, 0, 100}, row_slots, nullptr);
  EXPECT_EQ(row[7], 100 * 256 + 7);
  cols.read({0, 0, 3}, col_slots, nullptr);
  EXPECT_EQ(col[1], 3 + 256);  // Fortran order: element (3, 1) is the 4th of the 2nd column

  // The first page stays: the header (128 bytes) and rows 0..2; row 3 ends in the second page.
  ASSERT_EQ(::truncate(c_path.c_str(), 4096), 0);
  ASSERT_EQ(::truncate(f_path.c_str(), 4096), 0);
  for (uint64_t r = 0; r < 3; ++r) {  // rows wholly inside read the same bytes as before
    rows.read({0, 0, r}, row_slots, nullptr);
    EXPECT_TRUE(std::equal(row.begin(), row.end(), values.begin() + r * 256)) << "row " << r;
    EXPECT_EQ(label, static_cast<int64_t>(r));
  }
  const std::string cut =
      " was truncated while being read (it had 131200 bytes when it was opened)";
  try {
    rows.read({0, 0, 100}, row_slots, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()), ".npy file " + c_path + cut);
  }
  try {
    cols.read({0, 0, 3}, col_slots, nullptr);
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()), ".npy file " + f_path + cut);
  }
  // The guard is left as it was: the next read inside the file still works.
  rows.read({0, 0, 1}, row_slots, nullptr);
  EXPECT_EQ(row[0], 256);
}

TEST(NpyFile, AGuardedViewMustLieInsideItsFile) {
  testing::TempDir dir;
  std::vector<int32_t> values(16 * 4);
  std::iota(values.begin(), values.end(), 0);
  const std::string a_path = write_npy(dir, "a.npy", "(16, 4)", false, values);
  const std::string b_path = write_npy(dir, "b.npy", "(16, 4)", false, values);
  NpyFile a(a_path), b(b_path);
  // Rows reversed, a column picked, two files: all inside, the source's path names both.
  ArrayView reversed = a.view("r");
  reversed.data += 15 * reversed.strides[0];
  reversed.strides[0] = -reversed.strides[0];
  ArrayView column = a.view("c");
  column.data += 3 * 4;
  column.shape = {16};
  column.strides = {16};
  ArraySource both({reversed, column, b.view("b"), a.view("a")});
  EXPECT_EQ(both.path(0), a_path + ", " + b_path);
  int32_t r[4], c, bb[4], aa[4];
  std::byte* slots[4] = {reinterpret_cast<std::byte*>(r), reinterpret_cast<std::byte*>(&c),
                         reinterpret_cast<std::byte*>(bb), reinterpret_cast<std::byte*>(aa)};
  both.read({0, 0, 2}, slots, nullptr);
  EXPECT_EQ(r[0], 13 * 4);
  EXPECT_EQ(c, 2 * 4 + 3);
  EXPECT_EQ(bb[1], 9);
  EXPECT_EQ(aa[1], 9);

  ArrayView past_end = a.view();
  past_end.data += 4;  // the last row's last element lies past the file's end
  EXPECT_THROW(ArraySource({past_end}), InvalidArgument);
  ArrayView other = a.view();
  other.mapping = b.view().mapping;  // the bytes of a, the guard of b
  EXPECT_THROW(ArraySource({other}), InvalidArgument);
  ArrayView huge = a.view();
  huge.strides[0] = int64_t{1} << 62;
  EXPECT_THROW(ArraySource({huge}), InvalidArgument);
  ArrayView empty = a.view();
  empty.shape = {16, 0};  // no element, so nothing is ever read
  EXPECT_EQ(ArraySource({empty}).size(), 16u);
}

}  // namespace
}  // namespace stoker
