#include "stoker/sources/image_source.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>

#include "image/test_images.h"
#include "stoker/errors.h"
#include "engine/test_temp_dir.h"

// Counts this thread's operator new calls while counting is on: a warm worker state must read a
// sample without allocating (the libjpeg context and buffers are kept from sample to sample).
// GCC cannot see that the replaced new and delete below match (malloc / free).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
thread_local bool g_count_allocations = false;
thread_local size_t g_allocations = 0;
}  // namespace

void* operator new(std::size_t n) {
  if (g_count_allocations) ++g_allocations;
  if (void* p = std::malloc(n != 0 ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace stoker {
namespace {

using image::testing::encode_jpeg;
using image::testing::pattern_rgb;

// The test's files, in a directory of its own removed when the test program exits (ctest runs
// each test in a process of its own).
const testing::TempDir& test_dir() {
  static const testing::TempDir dir;
  return dir;
}

std::shared_ptr<ImageFolderFiles> write_images(const std::string& tag, int n) {
  std::vector<std::pair<std::string, int64_t>> samples;
  for (int i = 0; i < n; ++i) {
    const int w = 120 + 17 * i, h = 90 + 11 * i;
    const auto rgb = pattern_rgb(w, h, i);
    const auto jpeg = encode_jpeg(rgb.data(), w, h, 3, {.quality = 90});
    const std::string path = test_dir().path(tag + std::to_string(i) + ".jpg");
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(jpeg.data()),
               static_cast<std::streamsize>(jpeg.size()));
    samples.emplace_back(path, 10 + i);
  }
  return std::make_shared<ImageFolderFiles>(std::move(samples));
}

TEST(ImageSource, WritesWhatThePipelineWritesAndTheLabel) {
  auto files = write_images("imgsrc", 4);
  auto pipeline = std::make_shared<const image::ImagePipeline>(std::vector<image::Transform>{
      image::RandomResizedCrop(32, 48), image::RandomHorizontalFlip(),
      image::ToTensor(image::DType::kFloat32),
      image::Normalize({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f})});
  ImageSource src(files, pipeline);
  ASSERT_EQ(src.size(), 4u);
  ASSERT_EQ(src.fields().size(), 2u);
  EXPECT_EQ(src.fields()[0].name, "image");
  EXPECT_EQ(src.fields()[0].dtype, kFloat32);
  EXPECT_EQ(src.fields()[0].shape, (std::vector<int64_t>{3, 32, 48}));
  EXPECT_EQ(src.fields()[1].dtype, kInt64);
  EXPECT_TRUE(src.fields()[1].shape.empty());
  EXPECT_EQ(src.path(2), files->path(2));

  auto state = src.make_worker_state();
  image::ImageScratch scratch;
  for (uint64_t i = 0; i < 4; ++i) {
    std::vector<float> got(3 * 32 * 48), want(3 * 32 * 48);
    int64_t label = -1;
    std::byte* slots[2] = {reinterpret_cast<std::byte*>(got.data()),
                           reinterpret_cast<std::byte*>(&label)};
    src.read({7, 3, i}, slots, state.get());
    std::vector<std::byte> bytes;
    files->read(i, bytes);
    SampleRng rng(7, 3, i);
    pipeline->run(bytes, rng, reinterpret_cast<std::byte*>(want.data()), scratch);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << i;
    EXPECT_EQ(label, static_cast<int64_t>(10 + i));
  }
}

TEST(ImageSource, MapsEveryImageDType) {
  auto files = write_images("dtypes", 1);
  const std::pair<image::DType, DType> cases[] = {
      {image::DType::kUInt8, kUInt8},
      {image::DType::kFloat32, kFloat32},
      {image::DType::kFloat16, DType{DType::kFloat, 16}},
      {image::DType::kBFloat16, DType{DType::kBFloat, 16}}};
  for (const auto& [in, out] : cases) {
    auto p = std::make_shared<const image::ImagePipeline>(std::vector<image::Transform>{
        image::CenterCrop(8, 6), image::ToTensor(in, image::Layout::kHWC)});
    ImageSource src(files, p);
    EXPECT_EQ(src.fields()[0].dtype, out);
    EXPECT_EQ(src.fields()[0].shape, (std::vector<int64_t>{8, 6, 3}));
    EXPECT_EQ(src.fields()[0].sample_bytes(), p->output_bytes());
  }
}

TEST(ImageSource, BadFileThrowsDecodeError) {
  const std::string path = test_dir().path("not_an_image.jpg");
  std::ofstream(path) << "hello, I am text";
  auto files =
      std::make_shared<ImageFolderFiles>(std::vector<std::pair<std::string, int64_t>>{{path, 0}});
  auto p = std::make_shared<const image::ImagePipeline>(
      std::vector<image::Transform>{image::CenterCrop(8)});
  ImageSource src(files, p);
  std::vector<std::byte> img(p->output_bytes());
  int64_t label;
  std::byte* slots[2] = {img.data(), reinterpret_cast<std::byte*>(&label)};
  EXPECT_THROW(src.read({0, 0, 0}, slots, src.make_worker_state().get()), DecodeError);
}

std::shared_ptr<ImageFolderFiles> write_files(const std::string& tag,
                                              const std::vector<image::testing::NamedFile>& in) {
  std::vector<std::pair<std::string, int64_t>> samples;
  for (size_t i = 0; i < in.size(); ++i) {
    const std::string path = test_dir().path(tag + std::to_string(i));
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(in[i].bytes.data()),
               static_cast<std::streamsize>(in[i].bytes.size()));
    samples.emplace_back(path, static_cast<int64_t>(i));
  }
  return std::make_shared<ImageFolderFiles>(std::move(samples));
}

TEST(ImageSource, OneWorkerStateForEveryKindOfFileEvenAfterBadOnes) {
  const auto mixed = image::testing::mixed_files();
  auto files = write_files("mixed", mixed);
  auto pipeline = std::make_shared<const image::ImagePipeline>(
      std::vector<image::Transform>{image::RandomResizedCrop(40, 32), image::RandomHorizontalFlip(),
                                    image::ToTensor(image::DType::kFloat32)});
  ImageSource src(files, pipeline);
  auto reused = src.make_worker_state();
  const size_t n = pipeline->output_bytes();
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    for (uint64_t i = 0; i < mixed.size(); ++i) {
      SCOPED_TRACE(mixed[i].name);
      std::vector<std::byte> got(n), want(n);
      int64_t label = -1;
      std::byte* slots[2] = {got.data(), reinterpret_cast<std::byte*>(&label)};
      if (!mixed[i].good) {
        EXPECT_THROW(src.read({5, epoch, i}, slots, reused.get()), DecodeError);
        continue;
      }
      src.read({5, epoch, i}, slots, reused.get());
      std::byte* fresh_slots[2] = {want.data(), reinterpret_cast<std::byte*>(&label)};
      src.read({5, epoch, i}, fresh_slots, src.make_worker_state().get());
      EXPECT_EQ(got, want);
      EXPECT_EQ(label, static_cast<int64_t>(i));
    }
  }
}

TEST(ImageSource, AWarmWorkerStateReadsAJpegWithoutAllocating) {
  auto files = write_images("warm", 3);
  auto pipeline = std::make_shared<const image::ImagePipeline>(
      std::vector<image::Transform>{image::RandomResizedCrop(24, 24), image::RandomHorizontalFlip(),
                                    image::ToTensor(image::DType::kFloat32)});
  ImageSource src(files, pipeline);
  auto state = src.make_worker_state();
  std::vector<std::byte> out(pipeline->output_bytes());
  int64_t label;
  std::byte* slots[2] = {out.data(), reinterpret_cast<std::byte*>(&label)};
  for (uint64_t i = 0; i < 3; ++i) src.read({1, 0, i}, slots, state.get());  // warm-up
  for (uint64_t i = 0; i < 3; ++i) {
    g_allocations = 0;
    g_count_allocations = true;
    src.read({1, 0, i}, slots, state.get());
    g_count_allocations = false;
    EXPECT_EQ(g_allocations, 0u) << "sample " << i;
  }
}

TEST(ChannelStatsSource, SumsOfTheFullDecode) {
  auto files = write_images("stats", 2);
  ChannelStatsSource src(files);
  ASSERT_EQ(src.fields()[0].shape, (std::vector<int64_t>{7}));
  auto state = src.make_worker_state();
  for (uint64_t i = 0; i < 2; ++i) {
    double out[7];
    std::byte* slots[1] = {reinterpret_cast<std::byte*>(out)};
    src.read({0, 0, i}, slots, state.get());
    std::vector<std::byte> bytes;
    files->read(i, bytes);
    const auto img = image::decode(bytes);
    double sum[3] = {0, 0, 0}, sq[3] = {0, 0, 0};
    for (size_t p = 0; p < img.rgb.size(); ++p) {
      const double v = img.rgb[p] / 255.0;
      sum[p % 3] += v;
      sq[p % 3] += v * v;
    }
    for (int c = 0; c < 3; ++c) {
      EXPECT_NEAR(out[c], sum[c], 1e-6 * sum[c]);
      EXPECT_NEAR(out[3 + c], sq[c], 1e-6 * sq[c]);
    }
    EXPECT_EQ(out[6], double(img.width) * img.height);
  }
  ChannelStatsSource tiny(files, 100);
  double out[7];
  std::byte* slots[1] = {reinterpret_cast<std::byte*>(out)};
  EXPECT_THROW(tiny.read({0, 0, 0}, slots, nullptr), DecodeError);
}

}  // namespace
}  // namespace stoker
