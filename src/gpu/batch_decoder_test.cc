// The GPU decode path end to end on the CPU: the real loader stages batches with GpuDecodeSource,
// and the GPU stage runs against the emulated device (the kernels' own code over host memory,
// libjpeg for nvJPEG). Compared byte for byte with the CPU pipeline.
#include <dlfcn.h>
#include <link.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "gpu/backend.h"
#include "gpu/dynlib.h"
#include "gpu/emulated_backend.h"
#include "image/test_images.h"
#include "stoker/cuda/cuda.h"
#include "stoker/errors.h"
#include "stoker/gpu/decode.h"
#include "stoker/engine.h"
#include "stoker/random.h"
#include "stoker/sources/image_source.h"
#include "engine/test_temp_dir.h"

namespace stoker::image::gpu {
namespace {

using testing::encode_jpeg;
using testing::encode_png;
using testing::pattern_rgb;

// The test's files, in a directory of its own removed when the test program exits (ctest runs
// each test in a process of its own).
const stoker::testing::TempDir& test_dir() {
  static const stoker::testing::TempDir dir;
  return dir;
}

std::string write_file(const std::string& name, const std::vector<std::byte>& bytes) {
  const std::string path = test_dir().path(name);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  return path;
}

// A Huffman table whose code counts add up to more than 256 codes: the markers are intact (the
// header checks pass), every decoder refuses the table.
std::vector<std::byte> corrupt_jpeg(int w, int h) {
  const auto rgb = pattern_rgb(w, h, 3);
  auto f = encode_jpeg(rgb.data(), w, h, 3, {.quality = 90});
  for (size_t i = 2; i + 21 < f.size(); ++i) {
    if (uint8_t(f[i]) == 0xFF && uint8_t(f[i + 1]) == 0xC4) {
      for (size_t k = 0; k < 16; ++k) f[i + 5 + k] = std::byte{0xFF};
      break;
    }
  }
  return f;
}

// Files of every route: GPU (4:4:4, 4:2:0, gray, odd sizes) and CPU (progressive, CMYK, PNG).
struct Dataset {
  std::vector<std::pair<std::string, int64_t>> samples;
  std::set<uint64_t> cpu_route;
};

Dataset make_dataset(const std::string& tag, int corrupt_at = -1) {
  Dataset d;
  for (int i = 0; i < 24; ++i) {
    const int w = 37 + 13 * i, h = 29 + 7 * ((i * 5) % 11);
    const auto rgb = pattern_rgb(w, h, i);
    std::vector<std::byte> bytes;
    bool cpu = false;
    switch (i % 6) {
      case 0:
        bytes = encode_jpeg(rgb.data(), w, h, 3, {.quality = 92});
        break;
      case 1:
        bytes = encode_jpeg(rgb.data(), w, h, 3, {.quality = 80, .subsample = true});
        break;
      case 2: {
        std::vector<uint8_t> gray(static_cast<size_t>(w) * h);
        for (size_t p = 0; p < gray.size(); ++p) gray[p] = rgb[p * 3 + 1];
        bytes = encode_jpeg(gray.data(), w, h, 1, {.quality = 90});
        break;
      }
      case 3:
        bytes = encode_jpeg(rgb.data(), w, h, 3, {.quality = 85, .progressive = true});
        cpu = true;
        break;
      case 4: {
        std::vector<uint8_t> cmyk(static_cast<size_t>(w) * h * 4);
        for (size_t p = 0; p < cmyk.size(); ++p)
          cmyk[p] = static_cast<uint8_t>(rgb[p % rgb.size()]);
        bytes = encode_jpeg(cmyk.data(), w, h, 4, {.quality = 90});
        cpu = true;
        break;
      }
      default:
        bytes = encode_png(rgb.data(), static_cast<size_t>(w) * 3, w, h, 2, 8);
        cpu = true;
    }
    if (i == corrupt_at) {
      bytes = corrupt_jpeg(w, h);
      cpu = false;
    }
    d.samples.emplace_back(write_file(tag + std::to_string(i), bytes), 100 + i);
    if (cpu) d.cpu_route.insert(i);
  }
  return d;
}

std::vector<Transform> train_transforms(DType dtype = DType::kFloat32,
                                        Layout layout = Layout::kCHW) {
  return {RandomResizedCrop(24, 32), RandomHorizontalFlip(), ToTensor(dtype, layout),
          Normalize({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f})};
}

struct Result {
  std::vector<std::byte> images;
  std::vector<int64_t> labels;
  std::vector<StagedSample> records;
};

// One epoch through the loader with the staging source, each batch through the GPU stage.
std::vector<Result> run_gpu_path(std::shared_ptr<const GpuDecodeSource> src,
                                 std::unique_ptr<DecodeBackend> backend, EngineOptions o,
                                 GpuDecodeStats* stats = nullptr) {
  GpuBatchDecoder decoder(src, std::move(backend), o.on_error);
  Engine loader(src, o);
  auto it = loader.iterate(1);
  std::vector<Result> out;
  const size_t sample_out = size_t(src->out_height()) * src->out_width() * 3 * src->element_size();
  while (auto batch = it->next()) {
    Result r;
    r.images.resize(batch->length * sample_out);
    r.labels.resize(batch->length);
    StagedBatch b{batch->length, batch->fields[0].data,
                  reinterpret_cast<int64_t*>(batch->fields[1].data),
                  reinterpret_cast<StagedSample*>(batch->fields[2].data)};
    decoder.decode(b, r.images.data(), reinterpret_cast<std::byte*>(r.labels.data()), 0);
    r.records.assign(b.records, b.records + b.length);
    out.push_back(std::move(r));
  }
  if (stats != nullptr) *stats = decoder.stats();
  return out;
}

// What the CPU path writes for sample `index`: PIL-exact (no DCT scaling) for a GPU-decoded file,
// the CPU path's own pipeline otherwise.
std::vector<std::byte> cpu_sample(const Dataset& d, const std::vector<Transform>& t, uint64_t seed,
                                  uint64_t epoch, uint64_t index, bool pil_exact) {
  PipelineOptions opt;
  if (pil_exact) opt.dct_min_ratio = 0;
  const ImagePipeline p(t, opt);
  std::vector<std::byte> file;
  ImageFolderFiles({d.samples[index]}).read(0, file);
  std::vector<std::byte> out(p.output_bytes());
  ImageScratch scratch;
  SampleRng rng(seed, epoch, index);
  p.run(file, rng, out.data(), scratch);
  return out;
}

TEST(GpuDecode, EveryBatchIsTheCpuPathsBitForBitWhateverTheRoute) {
  const Dataset d = make_dataset("routes");
  for (auto [dtype, layout] :
       {std::pair{DType::kFloat32, Layout::kCHW}, std::pair{DType::kFloat16, Layout::kHWC},
        std::pair{DType::kBFloat16, Layout::kCHW}, std::pair{DType::kUInt8, Layout::kHWC}}) {
    std::vector<Transform> t = train_transforms(dtype, layout);
    if (dtype == DType::kUInt8) t.pop_back();  // no Normalize on uint8
    auto files = std::make_shared<ImageFolderFiles>(d.samples);
    auto src = std::make_shared<const GpuDecodeSource>(files, t);
    EngineOptions o;
    o.batch_size = 5;
    o.shuffle = true;
    o.seed = 11;
    o.num_workers = 2;
    o.pin_memory = PinMemory::kOff;
    GpuDecodeStats stats;
    const auto batches = run_gpu_path(src, make_emulated_backend(), o, &stats);
    size_t seen = 0, gpu = 0;
    for (const Result& r : batches) {
      const size_t per = r.images.size() / r.labels.size();
      for (size_t s = 0; s < r.labels.size(); ++s, ++seen) {
        const StagedSample& rec = r.records[s];
        const bool on_gpu = rec.route == uint8_t(Route::kGpu);
        EXPECT_EQ(on_gpu, !d.cpu_route.count(rec.index)) << rec.index;
        gpu += on_gpu;
        EXPECT_EQ(r.labels[s], 100 + int64_t(rec.index));
        const auto want = cpu_sample(d, t, 11, 1, rec.index, on_gpu);
        ASSERT_EQ(want.size(), per);
        ASSERT_EQ(std::memcmp(want.data(), r.images.data() + s * per, per), 0)
            << "sample " << rec.index << " route " << route_name(Route(rec.route));
      }
    }
    EXPECT_EQ(seen, d.samples.size());
    EXPECT_EQ(gpu, 12u);
    EXPECT_EQ(stats.routes[int(Route::kGpu)], 12u);
    EXPECT_EQ(stats.routes[int(Route::kNotBaseline)], 4u);
    EXPECT_EQ(stats.routes[int(Route::kColorSpace)], 4u);
    EXPECT_EQ(stats.routes[int(Route::kNotJpeg)], 4u);
    EXPECT_EQ(stats.backend, "emulated");
    EXPECT_EQ(stats.batches, 5u);
  }
}

TEST(GpuDecode, CropAndFlipAreTheCpuPathsForEveryKeyAndGeometry) {
  // Many seeds and epochs, and the geometries plan_geometry composes (resize then crop with
  // padding, exact resizes): the staged plan renders the CPU path's PIL-exact bytes.
  const Dataset d = make_dataset("geom");
  const std::vector<std::vector<Transform>> chains = {
      {Resize(40), CenterCrop(32), ToTensor(DType::kUInt8, Layout::kHWC)},
      {CenterCrop(90, 300), Resize(20, 30), RandomHorizontalFlip(0.5),
       ToTensor(DType::kUInt8, Layout::kCHW)},
      {RandomResizedCrop(17, 9, {0.3, 1.0}, {0.5, 2.0}), RandomHorizontalFlip(0.5),
       ToTensor(DType::kUInt8, Layout::kHWC)},
      {Resize(9, 70), ToTensor(DType::kUInt8, Layout::kHWC)}};
  auto files = std::make_shared<ImageFolderFiles>(d.samples);
  for (const auto& t : chains) {
    auto src = std::make_shared<const GpuDecodeSource>(files, t);
    for (uint64_t seed : {0u, 3u, 99u}) {
      EngineOptions o;
      o.batch_size = 8;
      o.shuffle = seed != 0;
      o.seed = seed;
      o.num_workers = 1;
      o.pin_memory = PinMemory::kOff;
      for (const Result& r : run_gpu_path(src, make_emulated_backend(), o)) {
        const size_t per = r.images.size() / r.labels.size();
        for (size_t s = 0; s < r.labels.size(); ++s) {
          const StagedSample& rec = r.records[s];
          const auto want = cpu_sample(d, t, seed, 1, rec.index, rec.route == uint8_t(Route::kGpu));
          ASSERT_EQ(std::memcmp(want.data(), r.images.data() + s * per, per), 0)
              << "seed " << seed << " sample " << rec.index;
        }
      }
    }
  }
}

// The GPU kernels resample with the bilinear filter only: a bicubic resize is refused, by name.
TEST(GpuDecode, ABicubicResizeNeedsTheCpuPath) {
  const Dataset d = make_dataset("bicubic");
  auto files = std::make_shared<ImageFolderFiles>(d.samples);
  for (const Transform& t : {Transform(Resize(24, true, ResizeFilter::kBicubic)),
                             Transform(RandomResizedCrop(24, 24, {0.08, 1.0}, {0.75, 4.0 / 3}, true,
                                                         ResizeFilter::kBicubic))}) {
    try {
      GpuDecodeSource src(files, {t, CenterCrop(24), ToTensor()});
      ADD_FAILURE() << "a bicubic resize was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("bicubic"), std::string::npos) << e.what();
    }
  }
}

TEST(GpuDecode, ABatchLargerThanTheDecodeBufferIsDecodedInChunks) {
  const Dataset d = make_dataset("chunks");
  auto files = std::make_shared<ImageFolderFiles>(d.samples);
  GpuDecodeOptions small;
  small.decode_buffer_bytes = 250'000;  // two or three of these images at a time
  auto chunked = std::make_shared<const GpuDecodeSource>(files, train_transforms(), small);
  auto whole = std::make_shared<const GpuDecodeSource>(files, train_transforms());
  EngineOptions o;
  o.batch_size = 12;
  o.num_workers = 0;
  o.pin_memory = PinMemory::kOff;
  GpuDecodeStats a, b;
  const auto x = run_gpu_path(chunked, make_emulated_backend(), o, &a);
  const auto y = run_gpu_path(whole, make_emulated_backend(), o, &b);
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i].images, y[i].images);
  EXPECT_EQ(a.routes[int(Route::kTooLarge)], 0u);
  EXPECT_GT(a.chunks, a.batches);
  EXPECT_EQ(b.chunks, b.batches);
  EXPECT_LE(a.device_bytes_peak, small.decode_buffer_bytes + 768 * 4);
  // A sample that alone needs more than the buffer is staged for the CPU path.
  GpuDecodeOptions tiny;
  tiny.decode_buffer_bytes = 2000;
  auto cpu_only = std::make_shared<const GpuDecodeSource>(files, train_transforms(), tiny);
  GpuDecodeStats c;
  const auto z = run_gpu_path(cpu_only, make_emulated_backend(), o, &c);
  EXPECT_EQ(c.routes[int(Route::kGpu)], 0u);
  EXPECT_EQ(c.routes[int(Route::kTooLarge)], 12u);
  // Files above the payload slot take the CPU path too.
  GpuDecodeOptions slot;
  slot.file_bytes = 1;
  auto small_slot = std::make_shared<const GpuDecodeSource>(files, train_transforms(), slot);
  EXPECT_EQ(small_slot->payload_bytes(), size_t(24 * 32 * 3));  // the CPU path's pixels
  GpuDecodeStats e;
  run_gpu_path(small_slot, make_emulated_backend(), o, &e);
  EXPECT_GT(e.routes[int(Route::kFileTooLarge)], 0u);
}

TEST(GpuDecode, AFileTheGpuRefusesIsDecodedByTheCpuPathTransparently) {
  const Dataset d = make_dataset("reject");
  auto files = std::make_shared<ImageFolderFiles>(d.samples);
  auto src = std::make_shared<const GpuDecodeSource>(files, train_transforms());
  EngineOptions o;
  o.batch_size = 6;
  o.num_workers = 0;
  o.pin_memory = PinMemory::kOff;
  GpuDecodeStats stats;
  const auto batches = run_gpu_path(src, make_emulated_backend({0, 7, 13}), o, &stats);
  EXPECT_EQ(stats.routes[int(Route::kGpuFailed)], 3u);
  EXPECT_EQ(stats.skipped, 0u);
  for (const Result& r : batches) {
    const size_t per = r.images.size() / r.labels.size();
    for (size_t s = 0; s < r.labels.size(); ++s) {
      const StagedSample& rec = r.records[s];
      const bool refused = rec.index == 0 || rec.index == 7 || rec.index == 13;
      EXPECT_EQ(rec.route == uint8_t(Route::kGpuFailed), refused);
      // Refused files get the CPU path's own pipeline (DCT scaling and all), like fallbacks.
      const auto want =
          cpu_sample(d, train_transforms(), 0, 1, rec.index, rec.route == uint8_t(Route::kGpu));
      EXPECT_EQ(std::memcmp(want.data(), r.images.data() + s * per, per), 0) << rec.index;
      EXPECT_EQ(r.labels[s], 100 + int64_t(rec.index));
    }
  }
}

TEST(GpuDecode, ACorruptFileRaisesASampleErrorNamingIt) {
  const Dataset d = make_dataset("raise", /*corrupt_at=*/8);
  auto files = std::make_shared<ImageFolderFiles>(d.samples);
  auto src = std::make_shared<const GpuDecodeSource>(files, train_transforms());
  EngineOptions o;
  o.batch_size = 6;
  o.num_workers = 2;
  o.pin_memory = PinMemory::kOff;
  try {
    run_gpu_path(src, make_emulated_backend(), o);
    FAIL() << "no error";
  } catch (const SampleError& e) {
    EXPECT_EQ(e.index(), 8u);
    EXPECT_EQ(e.path(), d.samples[8].first);
    EXPECT_NE(std::string(e.what()).find(d.samples[8].first), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("JPEG"), std::string::npos) << e.what();
  }
}

TEST(GpuDecode, SkipReplacesACorruptFileExactlyAsTheCpuLoaderDoes) {
  const Dataset d = make_dataset("skip", /*corrupt_at=*/8);
  auto files = std::make_shared<ImageFolderFiles>(d.samples);
  const auto t = train_transforms();
  auto src = std::make_shared<const GpuDecodeSource>(files, t);
  EngineOptions o;
  o.batch_size = 6;
  o.shuffle = true;
  o.seed = 4;
  o.num_workers = 2;
  o.pin_memory = PinMemory::kOff;
  o.on_error = OnError::kSkip;
  GpuDecodeStats stats;
  const auto gpu = run_gpu_path(src, make_emulated_backend(), o, &stats);
  EXPECT_EQ(stats.skipped, 1u);
  ASSERT_EQ(stats.skipped_samples.size(), 1u);
  EXPECT_NE(stats.skipped_samples[0].find(d.samples[8].first), std::string::npos);

  // The CPU loader over the same files and options.
  Engine cpu(std::make_shared<ImageSource>(files, std::make_shared<const ImagePipeline>(t)), o);
  auto it = cpu.iterate(1);
  bool found = false;
  for (const Result& r : gpu) {
    auto batch = it->next();
    ASSERT_TRUE(batch);
    const size_t per = r.images.size() / r.labels.size();
    for (size_t s = 0; s < r.labels.size(); ++s) {
      EXPECT_EQ(r.labels[s], reinterpret_cast<const int64_t*>(batch->fields[1].data)[s]);
      if (r.records[s].index != 8) continue;
      found = true;  // the replacement: decoded by the CPU path on both sides
      EXPECT_EQ(std::memcmp(r.images.data() + s * per, batch->fields[0].data + s * per, per), 0);
      EXPECT_NE(r.labels[s], 108);
    }
  }
  EXPECT_TRUE(found);
  EXPECT_EQ(cpu.stats().skipped, 1u);
}

// The emulated device, with a begin() that fails the first time (as nvJPEG's does when waiting
// on the slot's event fails), counting begin() and end() calls.
class FailingBegin final : public DecodeBackend {
 public:
  FailingBegin() : inner_(make_emulated_backend()) {}
  std::string name() const override { return inner_->name(); }
  const uint8_t* upload_table(const std::vector<std::byte>& t) override {
    return inner_->upload_table(t);
  }
  void begin(uintptr_t stream) override {
    if (begins++ == 0) throw Error("begin failed");
    inner_->begin(stream);
  }
  uint8_t* arena(size_t bytes) override { return inner_->arena(bytes); }
  std::byte* host_staging(size_t bytes) override { return inner_->host_staging(bytes); }
  void upload(void* d, const void* s, size_t n) override { inner_->upload(d, s, n); }
  void decode(std::span<const JpegJob> jobs, std::vector<uint8_t>& ok, uint64_t* hw) override {
    inner_->decode(jobs, ok, hw);
  }
  void render(const internal::k::KParams& p, int32_t max_rows) override {
    inner_->render(p, max_rows);
  }
  void end() override {
    ++ends;
    inner_->end();
  }
  uint64_t device_bytes() const override { return inner_->device_bytes(); }
  uint64_t pinned_bytes() const override { return inner_->pinned_bytes(); }

  int begins = 0, ends = 0;

 private:
  std::unique_ptr<DecodeBackend> inner_;
};

TEST(GpuDecode, ABeginThatThrowsIsNotEndedAndTheNextBatchDecodes) {
  // backend.h: a begin() that throws leaves nothing held, since end() is not called for it (the
  // nvJPEG backend keeps its context guard only once its begin() cannot throw any more).
  const Dataset d = make_dataset("begin");
  auto src = std::make_shared<const GpuDecodeSource>(std::make_shared<ImageFolderFiles>(d.samples),
                                                     train_transforms());
  EngineOptions o;
  o.batch_size = 4;
  o.num_workers = 0;
  o.pin_memory = PinMemory::kOff;
  auto backend = std::make_unique<FailingBegin>();
  FailingBegin& counts = *backend;
  GpuBatchDecoder decoder(src, std::move(backend), o.on_error);
  Engine loader(src, o);
  auto batch = loader.iterate(0)->next();
  ASSERT_TRUE(batch);
  const size_t sample_out = size_t(src->out_height()) * src->out_width() * 3 * src->element_size();
  std::vector<std::byte> images(batch->length * sample_out);
  std::vector<int64_t> labels(batch->length);
  StagedBatch b{batch->length, batch->fields[0].data,
                reinterpret_cast<int64_t*>(batch->fields[1].data),
                reinterpret_cast<StagedSample*>(batch->fields[2].data)};
  auto* out = reinterpret_cast<std::byte*>(labels.data());
  EXPECT_THROW(decoder.decode(b, images.data(), out, 0), Error);
  EXPECT_EQ(counts.begins, 1);
  EXPECT_EQ(counts.ends, 0);
  decoder.decode(b, images.data(), out, 0);
  EXPECT_EQ(counts.begins, 2);
  EXPECT_EQ(counts.ends, 1);
  EXPECT_EQ(labels[0], d.samples[b.records[0].index].second);
}

TEST(GpuDecode, WithoutCudaTheNvjpegBackendSaysWhatIsMissing) {
  if (cuda_available()) GTEST_SKIP() << "CUDA is available";
  try {
    make_nvjpeg_backend(0, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("nvJPEG"), std::string::npos);
  }
}

TEST(GpuDecode, LibrariesAreFoundByNameInDirectoriesAndUnderWheelNames) {
  std::string tried;
  void* z = internal::open_library({"libz."}, {"libz.so.1"}, {}, "zlibVersion", &tried);
  ASSERT_NE(z, nullptr) << tried;
  const std::string real = internal::library_path(z);
  ASSERT_FALSE(real.empty());
  // A wheel's renamed copy (torchvision.libs/libnvjpeg.<hash>.so.12), found in its directory.
  const std::string dir = test_dir().path("libs");
  std::filesystem::create_directories(dir);
  std::filesystem::remove(dir + "/libstokerfake.1a2b3c.so.12");
  std::filesystem::create_symlink(real, dir + "/libstokerfake.1a2b3c.so.12");
  tried.clear();
  void* h = internal::open_library({"libstokerfake"}, {"libstokerfake.so.12"}, {dir},
                                   "zlibVersion", &tried);
  EXPECT_NE(h, nullptr) << tried;
  tried.clear();
  EXPECT_EQ(internal::open_library({"libstokernone"}, {"libstokernone.so.3"}, {dir},
                                   "zlibVersion", &tried),
            nullptr);
  EXPECT_NE(tried.find("libstokernone.so.3"), std::string::npos) << tried;
  EXPECT_NE(tried.find(dir), std::string::npos) << tried;
}

// Whether a file of that name (the last path component) is mapped in the process.
bool loaded_in_process(const std::string& file) {
  struct Search {
    const std::string* file;
    bool found = false;
  } search{&file};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* s = static_cast<Search*>(data);
        const std::string name = info->dlpi_name != nullptr ? info->dlpi_name : "";
        const size_t slash = name.rfind('/');
        if (name.substr(slash == std::string::npos ? 0 : slash + 1) == *s->file) s->found = true;
        return 0;
      },
      &search);
  return search.found;
}

// A fresh directory of fake libraries: each (name, built module) copied (a copy, not a link: the
// loader tells libraries apart by file, so each name is a library of its own).
std::string fake_library_dir(const std::string& dir_name,
                             const std::vector<std::pair<std::string, std::string>>& files) {
  const std::string dir = test_dir().path(dir_name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& [name, module] : files) std::filesystem::copy_file(module, dir + "/" + name);
  return dir;
}

TEST(GpuDecode, TheLibrarySearchSkipsFilesWithoutTheApiAndGoesOn) {
  // libnvjpeg2k matches the prefix "libnvjpeg", libnvrtc-builtins "libnvrtc-": same family, not
  // the API. Here the one without it sorts first (the highest name is tried first).
  const std::string dir = fake_library_dir(
      "skip", {{"libstokerfake2k.so.12", STOKER_FAKE_WITHOUT},
               {"libstokerfake.1a2b3c.so.12", STOKER_FAKE_WITH}});
  std::string tried;
  void* h = internal::open_library({"libstokerfake"}, {"libstokerfake.so.12"}, {dir},
                                   "stoker_fake_api", &tried);
  ASSERT_NE(h, nullptr) << tried;
  EXPECT_EQ(internal::library_path(h), dir + "/libstokerfake.1a2b3c.so.12");
  EXPECT_NE(tried.find(dir + "/libstokerfake2k.so.12: skipped: lacks stoker_fake_api"),
            std::string::npos)
      << tried;
  EXPECT_FALSE(loaded_in_process("libstokerfake2k.so.12"));  // closed again

  // Already loaded, without the API (torch loaded a relative): skipped too, and left loaded.
  const std::string other = fake_library_dir(
      "skip-loaded", {{"libstokerfakeb-builtins.so.13.0", STOKER_FAKE_WITHOUT},
                      {"libstokerfakeb.so.13", STOKER_FAKE_WITH}});
  void* resident = dlopen((other + "/libstokerfakeb-builtins.so.13.0").c_str(), RTLD_NOW);
  ASSERT_NE(resident, nullptr) << dlerror();
  tried.clear();
  h = internal::open_library({"libstokerfakeb"}, {"libstokerfakeb.so.13"}, {other},
                             "stoker_fake_api", &tried);
  ASSERT_NE(h, nullptr) << tried;
  EXPECT_EQ(internal::library_path(h), other + "/libstokerfakeb.so.13");
  EXPECT_NE(tried.find("libstokerfakeb-builtins.so.13.0 (loaded): skipped: lacks stoker_fake_api"),
            std::string::npos)
      << tried;
  EXPECT_TRUE(loaded_in_process("libstokerfakeb-builtins.so.13.0"));

  // Nothing with the API: none, and the message says what each file lacked.
  tried.clear();
  const std::string none =
      fake_library_dir("skip-none", {{"libstokerfakec.so.1", STOKER_FAKE_WITHOUT}});
  EXPECT_EQ(internal::open_library({"libstokerfakec"}, {"libstokerfakec.so.1"}, {none},
                                   "stoker_fake_api", &tried),
            nullptr);
  EXPECT_NE(tried.find("lacks stoker_fake_api"), std::string::npos) << tried;
}

TEST(GpuDecode, CompanionsOfALibraryInAWheelDirectoryAreLoadedForItsDlopenByName) {
  // NVRTC in nvidia/cu13/lib dlopens "libnvrtc-builtins.so.13.0" by bare name: found only when a
  // library of that soname is already loaded.
  const std::string dir = fake_library_dir(
      "companions", {{"libstokerfakertc.so.13", STOKER_FAKE_WITH},
                     {"libstokerfakertc-builtins.so.13.0", STOKER_FAKE_BUILTINS}});
  EXPECT_EQ(dlopen("libstokerfakertc-builtins.so.13.0", RTLD_NOW | RTLD_NOLOAD), nullptr);
  std::string tried;
  void* h = internal::open_library({"libstokerfakertc.so", "libstokerfakertc-"},
                                   {"libstokerfakertc.so.13"}, {dir}, "stoker_fake_api", &tried);
  ASSERT_NE(h, nullptr) << tried;
  const auto loaded = internal::load_companions(internal::library_path(h),
                                                {"libstokerfakertc-builtins.so"}, &tried);
  EXPECT_EQ(loaded, std::vector<std::string>{dir + "/libstokerfakertc-builtins.so.13.0"}) << tried;
  EXPECT_TRUE(loaded_in_process("libstokerfakertc-builtins.so.13.0"));
  // What NVRTC does: the bare name now resolves to the loaded copy.
  void* by_name = dlopen("libstokerfakertc-builtins.so.13.0", RTLD_NOW);
  EXPECT_NE(by_name, nullptr) << dlerror();
  EXPECT_NE(dlsym(by_name, "stoker_fake_other"), nullptr);
}

}  // namespace
}  // namespace stoker::image::gpu
