#include "stoker/sources/tokens.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "stoker/errors.h"
#include "engine/test_temp_dir.h"

namespace stoker {
namespace {

constexpr DType kU16{DType::kUInt, 16};
constexpr DType kU32{DType::kUInt, 32};

template <typename T>
std::string token_bytes(size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    const T t = static_cast<T>(i * 7 + 1);
    s.append(reinterpret_cast<const char*>(&t), sizeof(T));
  }
  return s;
}

std::string llmc_header(uint32_t version, uint32_t count) {
  std::vector<int32_t> h(256, 0);
  h[0] = static_cast<int32_t>(kLlmcTokenMagic);
  h[1] = static_cast<int32_t>(version);
  h[2] = static_cast<int32_t>(count);
  return std::string(reinterpret_cast<const char*>(h.data()), h.size() * 4);
}

// A .npy header as np.save writes it (version 1.0, padded to 64 bytes), plus `pad` extra spaces
// to move the data off its alignment.
std::string npy_header(const std::string& descr, const std::string& shape, size_t pad = 0) {
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  dict += std::string(pad, ' ');
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  return out + dict;
}

std::string write(const testing::TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir.path(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

std::string error_of(const std::string& path, DType dtype, uint64_t seq_len) {
  try {
    TokenSource src(path, dtype, seq_len);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

template <typename T>
void check_windows(const TokenSource& src, size_t tokens) {
  EXPECT_EQ(src.num_tokens(), tokens);
  EXPECT_EQ(src.size(), (tokens - 1) / 10);
  int64_t in[10], target[10];
  std::byte* slots[2] = {reinterpret_cast<std::byte*>(in), reinterpret_cast<std::byte*>(target)};
  src.read({0, 0, 9}, slots, nullptr);
  for (int t = 0; t < 10; ++t) {
    EXPECT_EQ(in[t], static_cast<int64_t>(static_cast<T>((90 + t) * 7 + 1)));
    EXPECT_EQ(target[t], static_cast<int64_t>(static_cast<T>((91 + t) * 7 + 1)));
  }
}

TEST(TokenSource, WindowsOfUint16) {
  testing::TempDir dir;
  TokenSource src(write(dir, "tokens.bin", token_bytes<uint16_t>(101)), kU16, 10);
  EXPECT_EQ(src.layout().format, TokenFileLayout::Format::kRaw);
  check_windows<uint16_t>(src, 101);
}

TEST(TokenSource, WindowsOfUint32) {
  testing::TempDir dir;
  check_windows<uint32_t>(TokenSource(write(dir, "t.bin", token_bytes<uint32_t>(101)), kU32, 10),
                          101);
}

TEST(TokenSource, LlmcHeaderedFiles) {
  testing::TempDir dir;
  const std::string v1 = write(dir, "v1.bin", llmc_header(1, 105) + token_bytes<uint16_t>(105));
  TokenSource a(v1, kU16, 10);
  EXPECT_EQ(a.layout().format, TokenFileLayout::Format::kLlmc);
  EXPECT_EQ(a.layout().data_offset, kLlmcHeaderBytes);
  check_windows<uint16_t>(a, 105);
  const std::string v2 = write(dir, "v2.bin", llmc_header(2, 101) + token_bytes<uint32_t>(101));
  check_windows<uint32_t>(TokenSource(v2, kU32, 10), 101);
  EXPECT_NE(error_of(v2, kU16, 10).find("holds uint32 tokens (llm.c header version 2), not uint16"),
            std::string::npos);
}

TEST(TokenSource, ShorterOrLongerThanItsHeaderSays) {
  testing::TempDir dir;
  const std::string cut =
      write(dir, "cut.bin", llmc_header(1, 1000) + token_bytes<uint16_t>(1000).substr(0, 998));
  EXPECT_EQ(error_of(cut, kU16, 4),
            "token file " + cut +
                " is shorter than its header says: 1000 tokens (2000 bytes) after the "
                "1024-byte header, found 998 bytes");
  const std::string extra = write(dir, "x.bin", llmc_header(1, 10) + token_bytes<uint16_t>(11));
  EXPECT_NE(error_of(extra, kU16, 4).find("is longer than its header says"), std::string::npos);
  const std::string half = write(dir, "h.bin", llmc_header(1, 10).substr(0, 100));
  EXPECT_NE(error_of(half, kU16, 4).find("truncated llm.c header"), std::string::npos);
  const std::string v9 = write(dir, "v9.bin", llmc_header(9, 0));
  EXPECT_NE(error_of(v9, kU16, 4).find("unknown llm.c header version 9"), std::string::npos);
}

TEST(TokenSource, NpyTokenFiles) {
  testing::TempDir dir;
  const std::string path =
      write(dir, "t.npy", npy_header("<u2", "(101,)") + token_bytes<uint16_t>(101));
  TokenSource src(path, kU16, 10);
  EXPECT_EQ(src.layout().format, TokenFileLayout::Format::kNpy);
  EXPECT_EQ(src.layout().data_offset, 128u);
  check_windows<uint16_t>(src, 101);
  // Tokens at an odd offset are read as well (no aligned loads).
  const std::string odd =
      write(dir, "odd.npy", npy_header("<u4", "(101,)", 3).substr(0) + token_bytes<uint32_t>(101));
  check_windows<uint32_t>(TokenSource(odd, kU32, 10), 101);
  EXPECT_NE(error_of(path, kU32, 10).find("holds uint16 tokens, not uint32"), std::string::npos);
  const std::string two_d =
      write(dir, "2d.npy", npy_header("<u2", "(10, 10)") + token_bytes<uint16_t>(100));
  EXPECT_NE(error_of(two_d, kU16, 4).find("1-d array, not 2-d"), std::string::npos);
  const std::string cut =
      write(dir, "cut.npy", npy_header("<u2", "(101,)") + token_bytes<uint16_t>(100));
  EXPECT_NE(error_of(cut, kU16, 4).find("truncated"), std::string::npos);
}

TEST(TokenSource, ClearErrors) {
  testing::TempDir dir;
  EXPECT_THROW(TokenSource("/nonexistent/tokens.bin", kU16, 8), IoError);
  const std::string odd = write(dir, "odd.bin", token_bytes<uint8_t>(7));
  EXPECT_NE(error_of(odd, kU16, 2).find("not a multiple of 2"), std::string::npos);
  const std::string small = write(dir, "small.bin", token_bytes<uint16_t>(8));
  EXPECT_THROW(TokenSource(small, kU16, 8), InvalidArgument);
  EXPECT_THROW(TokenSource(small, kU16, 0), InvalidArgument);
  EXPECT_THROW(TokenSource(small, kFloat32, 2), InvalidArgument);
  EXPECT_THROW(TokenSource(dir.dir(), kU16, 2), IoError);  // a directory
}

TEST(TokenSource, AFileTruncatedWhileMappedRaisesIoErrorNotSigbus) {
  testing::TempDir dir;
  const size_t tokens = 64 * 1024;  // 128 KiB: many pages
  const std::string path = write(dir, "shrinks.bin", token_bytes<uint16_t>(tokens));
  TokenSource src(path, kU16, 1024);
  std::vector<int64_t> in(1024), target(1024);
  std::byte* slots[2] = {reinterpret_cast<std::byte*>(in.data()),
                         reinterpret_cast<std::byte*>(target.data())};
  src.read({0, 0, 60}, slots, nullptr);
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  src.read({0, 0, 0}, slots, nullptr);  // still inside the file
  try {
    src.read({0, 0, 60}, slots, nullptr);
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_EQ(std::string(e.what()), "token file " + path +
                                         " was truncated while being read (it had 131072 bytes "
                                         "when it was opened)");
  }
  src.read({0, 0, 0}, slots, nullptr);  // the guard is reusable
}

TEST(ParseTokenFile, LayoutFromTheFirstBytesAlone) {
  const std::string raw = token_bytes<uint16_t>(10);
  const auto l = parse_token_file(std::as_bytes(std::span(raw)), raw.size(), kU16, "r");
  EXPECT_EQ(l.num_tokens, 10u);
  EXPECT_EQ(l.data_offset, 0u);
  // A head longer than the file is clipped to the file.
  const std::string h = llmc_header(1, 3) + token_bytes<uint16_t>(3);
  EXPECT_THROW(parse_token_file(std::as_bytes(std::span(h)), 1000, kU16, "h"), InvalidArgument);
}

}  // namespace
}  // namespace stoker
