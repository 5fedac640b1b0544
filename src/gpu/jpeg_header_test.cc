#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "image/test_images.h"
#include "stoker/errors.h"
#include "stoker/image/decode.h"
#include "stoker/gpu/decode.h"

namespace stoker::image::gpu {
namespace {

using testing::encode_jpeg;
using testing::encode_png;
using testing::JpegParams;
using testing::pattern_rgb;

std::vector<std::byte> jpeg(int w, int h, int comps, JpegParams p = {}) {
  std::vector<uint8_t> px;
  if (comps == 3) {
    px = pattern_rgb(w, h, 1);
  } else {
    px.resize(static_cast<size_t>(w) * h * comps);
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>(i * 7 + i / 13);
  }
  p.quality = 90;
  return encode_jpeg(px.data(), w, h, comps, p);
}

// Offset of the first marker `m` (its 0xFF), or npos.
size_t find_marker(const std::vector<std::byte>& f, uint8_t m) {
  for (size_t i = 2; i + 1 < f.size(); ++i)
    if (uint8_t(f[i]) == 0xFF && uint8_t(f[i + 1]) == m) return i;
  return std::string::npos;
}

TEST(ClassifyJpeg, TakesBaselineYCbCrAndGrayInEverySubsamplingNvjpegBatches) {
  for (bool subsample : {false, true}) {
    JpegHeader h;
    const auto f = jpeg(123, 77, 3, {.subsample = subsample});
    EXPECT_EQ(classify_jpeg(f, &h), Route::kGpu);
    EXPECT_EQ(h.width, 123);
    EXPECT_EQ(h.height, 77);
    EXPECT_EQ(h.components, 3);
    EXPECT_EQ(h.precision, 8);
    EXPECT_EQ(h.sof, 0);
    EXPECT_EQ(h.scans, 1);
    EXPECT_TRUE(h.eoi);
    EXPECT_TRUE(h.jfif);
    EXPECT_EQ(h.h_samp[0], subsample ? 2 : 1);
    EXPECT_EQ(h.v_samp[0], subsample ? 2 : 1);
    // The same size as the CPU decoder reads.
    const ImageInfo info = read_info(f);
    EXPECT_EQ(info.width, h.width);
    EXPECT_EQ(info.height, h.height);
  }
  JpegHeader g;
  EXPECT_EQ(classify_jpeg(jpeg(64, 48, 1), &g), Route::kGpu);
  EXPECT_EQ(g.components, 1);
}

TEST(ClassifyJpeg, SendsWhatNvjpegBatchesCannotTakeToTheCpu) {
  JpegHeader h;
  EXPECT_EQ(classify_jpeg(jpeg(96, 64, 3, {.progressive = true}), &h), Route::kNotBaseline);
  EXPECT_EQ(h.sof, 2);
  EXPECT_GT(h.scans, 1);
  EXPECT_TRUE(h.eoi);
  EXPECT_EQ(classify_jpeg(jpeg(40, 30, 4, {.adobe = true})), Route::kColorSpace);   // YCCK
  EXPECT_EQ(classify_jpeg(jpeg(40, 30, 4, {.adobe = false})), Route::kColorSpace);  // CMYK

  const auto rgb = pattern_rgb(20, 10);
  EXPECT_EQ(classify_jpeg(encode_png(rgb.data(), 60, 20, 10, 2, 8)), Route::kNotJpeg);
  EXPECT_EQ(classify_jpeg({}), Route::kNotJpeg);
  const std::string html = "<html>not found</html>";
  EXPECT_EQ(classify_jpeg(std::as_bytes(std::span(html))), Route::kNotJpeg);
}

TEST(ClassifyJpeg, ReadsTheFrameHeaderAsLibjpegDoes) {
  const auto base = jpeg(64, 64, 3);
  const size_t sof = find_marker(base, 0xC0);
  ASSERT_NE(sof, std::string::npos);
  {  // 12-bit samples
    auto f = base;
    f[sof + 4] = std::byte{12};
    EXPECT_EQ(classify_jpeg(f), Route::kPrecision);
  }
  {  // arithmetic coding (SOF9)
    auto f = base;
    f[sof + 1] = std::byte{0xC9};
    EXPECT_EQ(classify_jpeg(f), Route::kNotBaseline);
  }
  {  // 4:1:1 (luma 4x1): the hardware decoder does not take it
    auto f = base;
    f[sof + 11] = std::byte{0x41};
    EXPECT_EQ(classify_jpeg(f), Route::kSubsampling);
  }
  {  // chroma subsampled more than luma
    auto f = base;
    f[sof + 14] = std::byte{0x22};
    EXPECT_EQ(classify_jpeg(f), Route::kSubsampling);
  }
  {  // a height defined by a DNL marker, which libjpeg refuses
    auto f = base;
    f[sof + 5] = f[sof + 6] = std::byte{0};
    EXPECT_EQ(classify_jpeg(f), Route::kBadHeader);
  }
  // Without JFIF, libjpeg reads components 'R','G','B' as RGB: never given to a YCbCr decoder.
  const size_t app0 = find_marker(base, 0xE0);
  ASSERT_NE(app0, std::string::npos);
  auto f = base;
  f[app0 + 6] = std::byte{'X'};  // "JFIX": no JFIF marker
  EXPECT_EQ(classify_jpeg(f), Route::kGpu);
  f[sof + 10] = std::byte{'R'};
  f[sof + 13] = std::byte{'G'};
  f[sof + 16] = std::byte{'B'};
  EXPECT_EQ(classify_jpeg(f), Route::kColorSpace);
}

TEST(ClassifyJpeg, SendsTruncatedAndDamagedFilesToTheCpuPathThatNamesTheError) {
  const auto f = jpeg(80, 60, 3, {.subsample = true});
  // Cut in the image data: no EOI.
  std::vector<std::byte> cut(f.begin(), f.begin() + static_cast<ptrdiff_t>(f.size() * 2 / 3));
  EXPECT_EQ(classify_jpeg(cut), Route::kNoEndMarker);
  EXPECT_THROW(decode(cut), DecodeError);
  // Cut in the header.
  std::vector<std::byte> head(f.begin(), f.begin() + 40);
  EXPECT_EQ(classify_jpeg(head), Route::kBadHeader);
  // A segment length running past the end.
  auto bad = f;
  const size_t dqt = find_marker(bad, 0xDB);
  bad[dqt + 2] = std::byte{0xFF};
  bad.resize(dqt + 100);
  EXPECT_EQ(classify_jpeg(bad), Route::kBadHeader);
}

TEST(ClassifyJpeg, NeverReadsOutsideTheFileWhateverItsBytes) {
  // Every prefix and many corruptions of real files: no crash, no out-of-bounds read (ASan).
  for (const auto& f : {jpeg(50, 40, 3), jpeg(50, 40, 3, {.progressive = true}), jpeg(30, 20, 1)}) {
    for (size_t n = 0; n <= f.size(); ++n) {
      std::vector<std::byte> prefix(f.begin(), f.begin() + static_cast<ptrdiff_t>(n));
      const Route r = classify_jpeg(prefix);
      if (n < f.size()) {
        EXPECT_NE(r, Route::kGpu) << n;
      }
    }
    std::mt19937 rng(7);
    for (int t = 0; t < 2000; ++t) {
      auto g = f;
      for (int k = 0; k < 4; ++k) g[rng() % g.size()] = std::byte(rng() & 0xFF);
      JpegHeader h;
      classify_jpeg(g, &h);
    }
  }
}

}  // namespace
}  // namespace stoker::image::gpu
