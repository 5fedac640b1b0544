// Dev tool: where the time of an image sample goes, stage by stage, on one thread.
//
//   stoker_decode_stages [--reps N] [--crops K] [--seed S] FILE...
//
// Every figure is CPU time of this thread (CLOCK_THREAD_CPUTIME_ID), which another process on
// the machine disturbs far less than wall time; each is the median over N passes over the files
// (every pass visits each file, and K RandomResizedCrop(224) draws per file for the crop
// stages). Files are read into memory first; each stage makes its own pass over all of them (no
// stage finds a file's bytes in cache from the one before), and the pipelines write into the
// slots of a 64-image batch, as a loader does. Output: milliseconds per image by stage and by
// kind of file (baseline colour, progressive, grayscale), and for each decoding variant the
// pipeline's time and its mean absolute difference (uint8, over every output pixel) against the
// exact path (full-size decode, PIL's IDCT and upsampling, then crop and resize).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "../decode_region.h"
#include "../geometry.h"
#include "../libjpeg.h"
#include "../resample.h"
#include "stoker/image/decode.h"
#include "stoker/image/pipeline.h"

using namespace stoker::image;
namespace in = stoker::image::internal;

namespace {

int64_t cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::vector<std::byte> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> v((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto* p = reinterpret_cast<const std::byte*>(v.data());
  return std::vector<std::byte>(p, p + v.size());
}

struct File {
  std::string path;
  std::vector<std::byte> bytes;
  std::string kind;  // "baseline", "progressive", "grayscale"
  int width = 0, height = 0;
};

// libjpeg with errors turned into exit: the tool's inputs are known-good files.
struct Jpeg {
  jpeg_decompress_struct cinfo{};
  jpeg_error_mgr err{};
  Jpeg() {
    cinfo.err = jpeg_std_error(&err);
    jpeg_create_decompress(&cinfo);
  }
  ~Jpeg() { jpeg_destroy_decompress(&cinfo); }
  void header(const File& f) {
    jpeg_mem_src(&cinfo, reinterpret_cast<const unsigned char*>(f.bytes.data()), f.bytes.size());
    jpeg_read_header(&cinfo, TRUE);
  }
};

std::string kind_of(const File& f) {
  Jpeg j;
  j.header(f);
  std::string k = j.cinfo.progressive_mode      ? "progressive"
                  : j.cinfo.num_components == 1 ? "grayscale"
                                                : "baseline";
  jpeg_abort_decompress(&j.cinfo);
  return k;
}

// Per stage and kind: total ns and count in one pass.
struct Pass {
  std::map<std::pair<std::string, std::string>, std::pair<int64_t, int64_t>> t;
  void add(const std::string& stage, const std::string& kind, int64_t ns) {
    auto& a = t[{stage, kind}];
    a.first += ns;
    a.second += 1;
    auto& b = t[{stage, "all"}];
    b.first += ns;
    b.second += 1;
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Variant {
  std::string name;
  PipelineOptions options;
};

const std::vector<Transform> kTrainF32 = {
    RandomResizedCrop(224, 224), RandomHorizontalFlip(), ToTensor(DType::kFloat32),
    Normalize({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f})};
const std::vector<Transform> kTrainU8 = {RandomResizedCrop(224, 224), RandomHorizontalFlip(),
                                         ToTensor(DType::kUInt8, Layout::kHWC)};

}  // namespace

int main(int argc, char** argv) {
  int reps = 5, crops = 4;
  uint64_t seed = 1;
  std::vector<File> files;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--crops" && i + 1 < argc) {
      crops = std::atoi(argv[++i]);
    } else if (a == "--seed" && i + 1 < argc) {
      seed = std::strtoull(argv[++i], nullptr, 10);
    } else {
      File f;
      f.path = a;
      f.bytes = read_file(a);
      files.push_back(std::move(f));
    }
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: stoker_decode_stages [--reps N] [--crops K] [--seed S] FILE...\n");
    return 1;
  }
  std::map<std::string, int> kinds;
  for (File& f : files) {
    f.kind = kind_of(f);
    const ImageInfo info = read_info(f.bytes);
    f.width = info.width;
    f.height = info.height;
    ++kinds[f.kind];
  }

  const std::vector<Variant> variants = {
      {"exact (full size, PIL's IDCT)", {.dct_min_ratio = 0}},
      {"DCT scale, region >= 2.0x out", {.dct_min_ratio = 2.0}},
      {"DCT scale, region >= 1.5x out", {.dct_min_ratio = 1.5}},
      {"DCT scale, region >= 1.25x out", {.dct_min_ratio = 1.25}},
      {"DCT scale, region >= 1.0x out", {.dct_min_ratio = 1.0}},
      {"exact + fast IDCT", {.dct_min_ratio = 0, .fast_idct = true}},
      {"exact + replicated chroma", {.dct_min_ratio = 0, .fancy_upsampling = false}},
      {">= 2.0x + fast IDCT", {.dct_min_ratio = 2.0, .fast_idct = true}},
      {">= 2.0x + replicated chroma", {.dct_min_ratio = 2.0, .fancy_upsampling = false}},
      {">= 1.0x + replicated chroma", {.dct_min_ratio = 1.0, .fancy_upsampling = false}},
  };
  std::vector<ImagePipeline> f32, u8;
  for (const Variant& v : variants) {
    f32.emplace_back(kTrainF32, v.options);
    u8.emplace_back(kTrainU8, v.options);
  }

  // Accuracy first (not timed): every variant's uint8 output against the exact one.
  std::vector<double> mad_sum(variants.size(), 0), mad_worst(variants.size(), 0);
  std::vector<int> max_diff(variants.size(), 0);
  {
    ImageScratch scratch;
    std::vector<std::byte> ref(u8[0].output_bytes()), out(u8[0].output_bytes());
    size_t n = 0;
    for (size_t i = 0; i < files.size(); ++i) {
      for (int k = 0; k < crops; ++k, ++n) {
        stoker::SampleRng r0(seed, 0, i * crops + k);
        u8[0].run(files[i].bytes, r0, ref.data(), scratch);
        for (size_t v = 1; v < variants.size(); ++v) {
          stoker::SampleRng rv(seed, 0, i * crops + k);
          u8[v].run(files[i].bytes, rv, out.data(), scratch);
          int64_t sum = 0;
          for (size_t b = 0; b < out.size(); ++b) {
            const int d = std::abs(int(ref[b]) - int(out[b]));
            sum += d;
            max_diff[v] = std::max(max_diff[v], d);
          }
          const double mad = double(sum) / double(out.size());
          mad_sum[v] += mad;
          mad_worst[v] = std::max(mad_worst[v], mad);
        }
      }
    }
    for (double& m : mad_sum) m /= double(n);
  }

  std::vector<std::byte> out(f32[0].output_bytes());
  // A loader writes each sample into its slot of a batch buffer that is not in cache: 64 slots.
  constexpr size_t kBatch = 64;
  std::vector<std::byte> batch(f32[0].output_bytes() * kBatch);
  size_t slot = 0;
  std::vector<Pass> passes;
  Decoder decoder;
  DecodedImage img;
  in::RegionDecoder region;
  ImageScratch scratch;
  Jpeg j;
  in::AxisCoeffs h, v;
  std::vector<uint8_t> tmp, row;
  std::vector<std::byte> buf;
  // Each stage runs over every file in turn (its own pass), so that no stage finds the file's
  // bytes or its decoder's buffers in cache from the stage before, as a loader does not.
  using Stage = std::function<int64_t(size_t file, int crop)>;
  std::vector<std::pair<std::string, Stage>> per_file, per_crop;
  auto timed = [](auto&& fn) {
    const int64_t t = cpu_ns();
    fn();
    return cpu_ns() - t;
  };
  per_file.emplace_back("read file (open, pread, close)", [&](size_t i, int) {
    return timed([&] {  // the file from the page cache, into a reused buffer (ImageFolderFiles)
      buf.resize(files[i].bytes.size());
      const int fd = ::open(files[i].path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0 || ::pread(fd, buf.data(), buf.size(), 0) < 0) std::exit(2);
      ::close(fd);
    });
  });
  per_file.emplace_back("header", [&](size_t i, int) {
    return timed([&] { region.open(files[i].bytes, kDefaultMaxPixels); });
  });
  per_file.emplace_back("entropy only, whole image", [&](size_t i, int) {
    return timed([&] {  // entropy decoding of every block, no IDCT (jpeg_read_coefficients)
      j.header(files[i]);
      jpeg_read_coefficients(&j.cinfo);
      jpeg_abort_decompress(&j.cinfo);
    });
  });
  per_file.emplace_back("full decode (the bound's work)", [&](size_t i, int) {
    return timed([&] { decoder.decode(files[i].bytes, img); });
  });
  for (auto [name, opt] :
       {std::pair{"full decode, fast IDCT", in::JpegOptions{true, true}},
        std::pair{"full decode, replicated chroma", in::JpegOptions{false, false}}}) {
    per_file.emplace_back(name, [&, opt](size_t i, int) {
      return timed([&] {
        region.open(files[i].bytes, kDefaultMaxPixels);
        region.decode(8, {0, 0, files[i].width, files[i].height}, opt);
      });
    });
  }
  for (int num : {1, 2, 3, 4, 5, 6, 7}) {
    per_file.emplace_back("full decode at scale " + std::to_string(num) + "/8",
                          [&, num](size_t i, int) {
                            const File& f = files[i];
                            return timed([&] {
                              region.open(f.bytes, kDefaultMaxPixels);
                              region.decode(num, {0, 0, in::scaled_size(f.width, num),
                                                  in::scaled_size(f.height, num)});
                            });
                          });
  }
  // The exact path's region for a crop, as ImagePipeline::run plans it (dct_min_ratio 0).
  auto exact_region = [&](size_t i, int k) {
    stoker::SampleRng rng(seed, 0, i * crops + k);
    const in::GeometryPlan plan =
        in::plan_geometry(kTrainF32, files[i].width, files[i].height, rng);
    in::compute_coeffs(plan.x.spec(), h);
    in::compute_coeffs(plan.y.spec(), v);
    return std::pair{plan, in::Rect{plan.x.lo + h.lo, plan.y.lo + v.lo, plan.x.lo + h.hi,
                                    plan.y.lo + v.hi}};
  };
  per_crop.emplace_back("crop: entropy down to the crop's last row", [&](size_t i, int k) {
    const in::Rect want = exact_region(i, k).second;
    return timed([&] {
      j.header(files[i]);
      jpeg_start_decompress(&j.cinfo);
      if (want.y1 < files[i].height)
        jpeg_skip_scanlines(&j.cinfo, static_cast<JDIMENSION>(want.y1));
      jpeg_abort_decompress(&j.cinfo);
    });
  });
  per_crop.emplace_back("crop: region decode, full size", [&](size_t i, int k) {
    const in::Rect want = exact_region(i, k).second;
    return timed([&] {
      region.open(files[i].bytes, kDefaultMaxPixels);
      region.decode(8, want);
    });
  });
  per_crop.emplace_back("crop: resample (uint8, rows discarded)", [&](size_t i, int k) {
    const auto [plan, want] = exact_region(i, k);
    region.open(files[i].bytes, kDefaultMaxPixels);
    const in::DecodedRegion r = region.decode(8, want);
    return timed([&] {
      in::shift_coeffs(h, plan.x.lo - r.rect.x0);
      in::shift_coeffs(v, plan.y.lo - r.rect.y0);
      in::resample_rgb8(
          r.rgb, r.stride, h, v, tmp, row, [](void*, int, const uint8_t*) {}, nullptr);
    });
  });
  per_crop.emplace_back("crop: exact pipeline, uint8 HWC output", [&](size_t i, int k) {
    stoker::SampleRng rv(seed, 0, i * crops + k);
    return timed([&] { u8[0].run(files[i].bytes, rv, out.data(), scratch); });
  });
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    per_crop.emplace_back("pipeline: " + variants[vi].name, [&, vi](size_t i, int k) {
      stoker::SampleRng rv(seed, 0, i * crops + k);
      std::byte* dst = batch.data() + (slot++ % kBatch) * out.size();
      return timed([&] { f32[vi].run(files[i].bytes, rv, dst, scratch); });
    });
  }
  for (int rep = 0; rep < reps; ++rep) {
    Pass p;
    for (auto& [name, stage] : per_file)
      for (size_t i = 0; i < files.size(); ++i) p.add(name, files[i].kind, stage(i, 0));
    for (auto& [name, stage] : per_crop)
      for (size_t i = 0; i < files.size(); ++i)
        for (int k = 0; k < crops; ++k) p.add(name, files[i].kind, stage(i, k));
    passes.push_back(std::move(p));
    std::fprintf(stderr, "pass %d/%d done\n", rep + 1, reps);
  }

  std::vector<std::string> stages;  // in the order measured
  {
    const char* fixed[] = {"read file (open, pread, close)", "header",
                           "entropy only, whole image",      "full decode (the bound's work)",
                           "full decode, fast IDCT",         "full decode, replicated chroma"};
    for (const char* s : fixed) stages.push_back(s);
    for (int num : {1, 2, 3, 4, 5, 6, 7})
      stages.push_back("full decode at scale " + std::to_string(num) + "/8");
    stages.push_back("crop: entropy down to the crop's last row");
    stages.push_back("crop: region decode, full size");
    stages.push_back("crop: resample (uint8, rows discarded)");
    stages.push_back("crop: exact pipeline, uint8 HWC output");
  }
  std::vector<std::string> cols = {"all"};
  for (const auto& [k, _] : kinds) cols.push_back(k);
  std::printf("%zu files (", files.size());
  for (const auto& [k, n] : kinds) std::printf("%s %d, ", k.c_str(), n);
  std::printf("%d crops each), %d passes; CPU ms per image (crop rows: per crop), median\n", crops,
              reps);
  std::printf("%-46s", "stage");
  for (const auto& c : cols) std::printf(" %12s", c.c_str());
  std::printf(" %9s\n", "vs full");
  auto figure = [&](const std::string& stage, const std::string& col) {
    std::vector<double> v;
    for (const Pass& p : passes) {
      auto it = p.t.find({stage, col});
      if (it != p.t.end() && it->second.second > 0)
        v.push_back(double(it->second.first) / double(it->second.second) * 1e-6);
    }
    return median(v);
  };
  const double full = figure("full decode (the bound's work)", "all");
  auto print_row = [&](const std::string& stage, const std::string& label) {
    std::printf("%-46s", label.c_str());
    for (const auto& c : cols) std::printf(" %12.3f", figure(stage, c));
    std::printf(" %8.2fx\n", full / figure(stage, "all"));
  };
  for (const auto& s : stages) print_row(s, s);
  std::printf("\n%-46s", "pipeline (RRC 224, flip, float32, normalize)");
  for (const auto& c : cols) std::printf(" %12s", c.c_str());
  std::printf(" %9s %8s %8s %5s\n", "vs full", "MAD", "worst", "max");
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    const std::string stage = "pipeline: " + variants[vi].name;
    std::printf("%-46s", variants[vi].name.c_str());
    for (const auto& c : cols) std::printf(" %12.3f", figure(stage, c));
    std::printf(" %8.2fx %8.3f %8.3f %5d\n", full / figure(stage, "all"), mad_sum[vi],
                mad_worst[vi], max_diff[vi]);
  }
  return 0;
}
