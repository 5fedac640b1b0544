// What fuzzing the image pipeline found (fuzz/fuzz_jpeg, fuzz/fuzz_png), stated as unit tests; the
// inputs themselves replay from fuzz/regressions/.
//
// DecoderReuse: a decoder reused from image to image (each worker thread keeps one) must decode
// every image as a fresh decoder does; nothing of one file may leak into the next. The fuzz
// targets compare a scratch that decoded a primer image with a fresh one on every input.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "stoker/errors.h"
#include "stoker/image/pipeline.h"
#include "test_images.h"

namespace stoker::image {
namespace {

using testing::encode_jpeg;
using testing::JpegParams;
using testing::pattern_rgb;

// The JPEG without its marker segments of type `marker` (0xDB: DQT, 0xC4: DHT) before the scan.
std::vector<std::byte> without_segments(std::vector<std::byte> jpeg, uint8_t marker) {
  size_t pos = 2;  // after SOI
  while (pos + 4 <= jpeg.size() && static_cast<uint8_t>(jpeg[pos]) == 0xFF) {
    const auto type = static_cast<uint8_t>(jpeg[pos + 1]);
    if (type == 0xDA) break;  // start of scan
    const size_t len = static_cast<size_t>(jpeg[pos + 2]) << 8 | static_cast<size_t>(jpeg[pos + 3]);
    if (type == marker) {
      jpeg.erase(jpeg.begin() + static_cast<ptrdiff_t>(pos),
                 jpeg.begin() + static_cast<ptrdiff_t>(pos + 2 + len));
    } else {
      pos += 2 + len;
    }
  }
  return jpeg;
}

class DecoderReuse : public ::testing::Test {
 protected:
  static constexpr int kSize = 32;
  ImagePipeline pipeline{{CenterCrop(kSize), ToTensor(DType::kUInt8)}};

  // A digest of the pipeline's output for `file` (FNV-1a), or the DecodeError's message.
  std::string run(const std::vector<std::byte>& file, ImageScratch& scratch) {
    std::vector<std::byte> out(pipeline.output_bytes());
    SampleRng rng(0, 0, 0);
    try {
      pipeline.run(file, rng, out.data(), scratch);
    } catch (const DecodeError& e) {
      return std::string("error: ") + e.what();
    }
    uint64_t h = 14695981039346656037ull;
    for (std::byte b : out) h = (h ^ static_cast<uint8_t>(b)) * 1099511628211ull;
    return "pixels " + std::to_string(h);
  }
  std::string fresh(const std::vector<std::byte>& file) {
    ImageScratch s;
    return run(file, s);
  }
  std::string after(const std::vector<std::byte>& before, const std::vector<std::byte>& file) {
    ImageScratch s;
    run(before, s);
    return run(file, s);
  }

  std::vector<uint8_t> a_pixels = pattern_rgb(kSize, kSize, 1);
  std::vector<uint8_t> b_pixels = pattern_rgb(kSize, kSize, 2);
};

TEST_F(DecoderReuse, AFileWithoutQuantizationTablesFailsAsOnAFreshDecoder) {
  const auto a = encode_jpeg(a_pixels.data(), kSize, kSize, 3, JpegParams{.quality = 90});
  const auto b = without_segments(
      encode_jpeg(b_pixels.data(), kSize, kSize, 3, JpegParams{.quality = 50}), 0xDB);
  const std::string expected = fresh(b);
  EXPECT_EQ(expected, "error: JPEG: Quantization table 0x00 was not defined");
  EXPECT_EQ(after(a, b), expected);  // not b's scan decoded with a's tables
}

TEST_F(DecoderReuse, AFileWithoutHuffmanTablesDecodesAsOnAFreshDecoder) {
  // a is progressive (optimized Huffman tables); b is baseline with libjpeg's standard tables,
  // which libjpeg-turbo uses when a file has none (motion-JPEG frames omit them).
  const auto a =
      encode_jpeg(a_pixels.data(), kSize, kSize, 3, JpegParams{.quality = 90, .progressive = true});
  const auto b_full = encode_jpeg(b_pixels.data(), kSize, kSize, 3, JpegParams{.quality = 80});
  const auto b = without_segments(b_full, 0xC4);
  ASSERT_LT(b.size(), b_full.size());
  const std::string expected = fresh(b);
  EXPECT_EQ(expected, fresh(b_full));
  EXPECT_EQ(after(a, b), expected);
}

// RandomResizedCrop's fallback (no random crop fitted in 10 attempts) on an image 1 pixel wide
// with a ratio range above 2: torchvision's int(round(w / ratio)) is a crop 0 pixels high. The
// crop keeps at least one pixel, and the pipeline produces the sample.
TEST(RandomResizedCropFallback, NeverAnEmptyCrop) {
  const RandomResizedCrop t(105, 262, {0.42, 1.0}, {3.8, 8.3});
  SampleRng rng(0, 0, 0);
  const CropBox b = random_resized_crop_params(9, 1, t, rng);
  EXPECT_EQ(b.height, 1);
  EXPECT_EQ(b.width, 1);
  EXPECT_EQ(b.top, 4);
  const CropBox wide =
      random_resized_crop_params(1, 9, RandomResizedCrop(8, 8, {0.5, 1.0}, {0.05, 0.1}), rng);
  EXPECT_EQ(wide.width, 1);
  EXPECT_EQ(wide.height, 1);

  ImagePipeline p({RandomResizedCrop(105, 262, {0.42, 1.0}, {3.8, 8.3}), ToTensor(DType::kUInt8)});
  const std::vector<uint8_t> column = pattern_rgb(1, 9, 3);
  const auto file = testing::encode_png(column.data(), 3, 1, 9, 2, 8);
  std::vector<std::byte> out(p.output_bytes());
  ImageScratch scratch;
  p.run(file, rng, out.data(), scratch);
}

}  // namespace
}  // namespace stoker::image
