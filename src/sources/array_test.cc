#include "stoker/sources/array.h"

#include <gtest/gtest.h>

#include <numeric>

#include "stoker/errors.h"
#include "stoker/engine.h"

namespace stoker {
namespace {

TEST(ArraySource, ReadsRowsOfDenseArrays) {
  std::vector<float> x(10 * 3);
  std::iota(x.begin(), x.end(), 0.f);
  std::vector<int64_t> y{0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  ArraySource src({{reinterpret_cast<const std::byte*>(x.data()), kFloat32, {10, 3}, {12, 4}, "x"},
                   {reinterpret_cast<const std::byte*>(y.data()), kInt64, {10}, {8}, "y"}});
  ASSERT_EQ(src.size(), 10u);
  ASSERT_EQ(src.fields()[0].shape, (std::vector<int64_t>{3}));
  ASSERT_TRUE(src.fields()[1].shape.empty());
  float row[3];
  int64_t label;
  std::byte* slots[2] = {reinterpret_cast<std::byte*>(row), reinterpret_cast<std::byte*>(&label)};
  src.read({0, 0, 4}, slots, nullptr);
  EXPECT_EQ(row[0], 12.f);
  EXPECT_EQ(row[2], 14.f);
  EXPECT_EQ(label, 4);
}

TEST(ArraySource, ReadsStridedAndReversedViews) {
  // A 4x6 int32 matrix viewed as its transpose with reversed rows: (6, 4), strides (-4, 24).
  std::vector<int32_t> m(24);
  std::iota(m.begin(), m.end(), 0);
  const auto* base = reinterpret_cast<const std::byte*>(m.data() + 5);
  ArraySource src({{base, DType{DType::kInt, 32}, {6, 4}, {-4, 24}, "t"}});
  int32_t row[4];
  std::byte* slot[1] = {reinterpret_cast<std::byte*>(row)};
  src.read({0, 0, 1}, slot, nullptr);  // column 4 of m
  EXPECT_EQ(row[0], 4);
  EXPECT_EQ(row[1], 10);
  EXPECT_EQ(row[3], 22);
}

TEST(ArraySource, RejectsMismatchedLengths) {
  std::vector<float> a(10), b(9);
  EXPECT_THROW(
      ArraySource({{reinterpret_cast<const std::byte*>(a.data()), kFloat32, {10}, {4}, "a"},
                   {reinterpret_cast<const std::byte*>(b.data()), kFloat32, {9}, {4}, "b"}}),
      InvalidArgument);
  EXPECT_THROW(ArraySource({}), InvalidArgument);
}

TEST(ArraySource, BatchesThroughTheLoader) {
  std::vector<float> x(100 * 2);
  std::iota(x.begin(), x.end(), 0.f);
  auto src = std::make_shared<ArraySource>(std::vector<ArrayView>{
      {reinterpret_cast<const std::byte*>(x.data()), kFloat32, {100, 2}, {8, 4}, "x"}});
  EngineOptions o;
  o.batch_size = 32;
  o.num_workers = 2;
  Engine loader(src, o);
  auto it = loader.iterate(0);
  auto b = it->next();
  ASSERT_EQ(b->fields[0].shape, (std::vector<int64_t>{32, 2}));
  EXPECT_EQ(reinterpret_cast<const float*>(b->fields[0].data)[63], 63.f);
  int n = 1;
  while ((b = it->next())) ++n;
  EXPECT_EQ(n, 4);
}

}  // namespace
}  // namespace stoker
