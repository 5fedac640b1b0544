#include <gtest/gtest.h>

#include <cstring>

#include "convert.h"
#include "stoker/errors.h"
#include "stoker/image/transforms.h"

namespace stoker::image {
namespace {

template <typename T>
T element(const OutputTable& t, int c, int v) {
  T x;
  std::memcpy(&x, t.table.data() + (c * 256 + v) * sizeof(T), sizeof(T));
  return x;
}

TEST(OutputTable, WithoutToTensorIsTheIdentityInUint8Chw) {
  const OutputTable t = output_table({CenterCrop(8)});
  EXPECT_EQ(t.dtype, DType::kUInt8);
  EXPECT_EQ(t.layout, Layout::kCHW);
  ASSERT_EQ(t.table.size(), 768u);
  for (int c = 0; c < 3; ++c)
    for (int v = 0; v < 256; ++v) EXPECT_EQ(element<uint8_t>(t, c, v), v);
}

TEST(OutputTable, ToTensorScalesAndNormalizeAppliesPerChannelInFloat32) {
  const std::array<float, 3> mean{0.485f, 0.456f, 0.406f}, stdev{0.229f, 0.224f, 0.225f};
  const OutputTable t = output_table(
      {CenterCrop(8), ToTensor(DType::kFloat32, Layout::kHWC), Normalize(mean, stdev)});
  EXPECT_EQ(t.dtype, DType::kFloat32);
  EXPECT_EQ(t.layout, Layout::kHWC);
  ASSERT_EQ(t.table.size(), 768u * 4);
  for (int c = 0; c < 3; ++c)
    for (int v : {0, 1, 128, 255})
      EXPECT_EQ(element<float>(t, c, v), (static_cast<float>(v) / 255.0f - mean[c]) / stdev[c]);
  const OutputTable plain = output_table({ToTensor()});
  EXPECT_EQ(element<float>(plain, 2, 255), 1.0f);
  EXPECT_EQ(element<float>(plain, 0, 51), 51 / 255.0f);
}

TEST(OutputTable, HalfTypesConvertTheFloat32Value) {
  const std::array<float, 3> mean{0.5f, 0.25f, 0}, stdev{0.5f, 2, 1};
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    const OutputTable t = output_table({ToTensor(dt), Normalize(mean, stdev)});
    ASSERT_EQ(t.table.size(), 768u * 2);
    EXPECT_EQ(element_size(dt), 2u);
    for (int c = 0; c < 3; ++c)
      for (int v : {0, 77, 255}) {
        const float f = (static_cast<float>(v) / 255.0f - mean[c]) / stdev[c];
        EXPECT_EQ(element<uint16_t>(t, c, v),
                  dt == DType::kFloat16 ? internal::float_to_half(f) : internal::float_to_bf16(f));
      }
  }
}

TEST(OutputTable, ValidatesTheOrderAndEachTransform) {
  EXPECT_THROW(output_table({ToTensor(), CenterCrop(8)}), InvalidArgument);
  EXPECT_THROW(output_table({ToTensor(), RandomHorizontalFlip()}), InvalidArgument);
  EXPECT_THROW(output_table({ToTensor(), ToTensor()}), InvalidArgument);
  EXPECT_THROW(output_table({Normalize({0, 0, 0}, {1, 1, 1})}), InvalidArgument);
  EXPECT_THROW(output_table({ToTensor(DType::kUInt8), Normalize({0, 0, 0}, {1, 1, 1})}),
               InvalidArgument);
  EXPECT_THROW(output_table({ToTensor(), Normalize({0, 0, 0}, {1, 1, 1}),
                             Normalize({0, 0, 0}, {1, 1, 1})}),
               InvalidArgument);
  // Each transform's own check comes first, in list order.
  RandomHorizontalFlip bad(0.5);
  bad.p = 2;
  try {
    output_table({bad, ToTensor(), ToTensor()});
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RandomHorizontalFlip"), std::string::npos);
  }
  EXPECT_NO_THROW(output_table({}));
  EXPECT_EQ(stage_of(CenterCrop(8), false), Stage::kFused);
  EXPECT_EQ(stage_of(RandomVerticalFlip(), false), Stage::kFused);
  EXPECT_EQ(stage_of(ColorJitter({{0.5, 1.5}}, {}, {}, {}), false), Stage::kImage);
  EXPECT_EQ(stage_of(RandomErasing(), false), Stage::kImage);
  EXPECT_EQ(stage_of(RandomErasing(), true), Stage::kTensor);
  EXPECT_EQ(stage_of(ToTensor(), false), Stage::kOutput);
  EXPECT_EQ(stage_of(Normalize({0, 0, 0}, {1, 1, 1}), true), Stage::kOutput);
}

}  // namespace
}  // namespace stoker::image
