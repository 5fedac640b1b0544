#include "stoker/sources/tokens.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "stoker/errors.h"

namespace stoker {
namespace {

template <typename T>
std::string write_tokens(const std::string& name, size_t n) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream f(path, std::ios::binary);
  for (size_t i = 0; i < n; ++i) {
    const T t = static_cast<T>(i * 7 + 1);
    f.write(reinterpret_cast<const char*>(&t), sizeof(T));
  }
  return path;
}

template <typename T>
void check_windows(DType dtype) {
  const std::string path = write_tokens<T>("tokens.bin", 101);
  TokenSource src(path, dtype, 10);
  EXPECT_EQ(src.size(), 10u);  // (101 - 1) / 10
  EXPECT_EQ(src.num_tokens(), 101u);
  int64_t in[10], target[10];
  std::byte* slots[2] = {reinterpret_cast<std::byte*>(in), reinterpret_cast<std::byte*>(target)};
  src.read({0, 0, 9}, slots, nullptr);
  for (int t = 0; t < 10; ++t) {
    EXPECT_EQ(in[t], static_cast<int64_t>(static_cast<T>((90 + t) * 7 + 1)));
    EXPECT_EQ(target[t], static_cast<int64_t>(static_cast<T>((91 + t) * 7 + 1)));
  }
  std::remove(path.c_str());
}

TEST(TokenSource, WindowsOfUint16) { check_windows<uint16_t>(DType{DType::kUInt, 16}); }
TEST(TokenSource, WindowsOfUint32) { check_windows<uint32_t>(DType{DType::kUInt, 32}); }

TEST(TokenSource, ClearErrors) {
  EXPECT_THROW(TokenSource("/nonexistent/tokens.bin", DType{DType::kUInt, 16}, 8), IoError);
  const std::string odd = write_tokens<uint8_t>("odd.bin", 7);
  try {
    TokenSource(odd, DType{DType::kUInt, 16}, 2);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not a multiple of 2"), std::string::npos);
  }
  const std::string small = write_tokens<uint16_t>("small.bin", 8);
  EXPECT_THROW(TokenSource(small, DType{DType::kUInt, 16}, 8), InvalidArgument);
  EXPECT_THROW(TokenSource(small, DType{DType::kUInt, 16}, 0), InvalidArgument);
  EXPECT_THROW(TokenSource(small, kFloat32, 2), InvalidArgument);
}

}  // namespace
}  // namespace stoker
