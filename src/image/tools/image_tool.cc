// Dev tool: runs the pipeline on a file and writes the uint8 HWC output, or times it.
//
//   stoker_image_tool run FILE OUT.raw RESIZE CROP DCT_MIN_RATIO
//       Resize(RESIZE) + CenterCrop(CROP), raw CROP x CROP x 3 bytes to OUT.raw.
//   stoker_image_tool bench SECONDS DCT_MIN_RATIO FILE...
//       images/s on this thread for: full decode; Resize(256)+CenterCrop(224);
//       RandomResizedCrop(224)+flip, float32 normalised CHW.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "stoker/image/decode.h"
#include "stoker/image/pipeline.h"

using namespace stoker::image;

namespace {

std::vector<std::byte> read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> v((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.eof() && !in.good()) std::exit(2);
  auto* p = reinterpret_cast<const std::byte*>(v.data());
  return std::vector<std::byte>(p, p + v.size());
}

template <typename F>
double rate(double seconds, size_t n_files, F&& f) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  size_t done = 0;
  while (std::chrono::duration<double>(clock::now() - start).count() < seconds) {
    f(done % n_files, done);
    ++done;
  }
  return done / std::chrono::duration<double>(clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "run" && argc == 7) {
    const auto file = read_file(argv[2]);
    const ImagePipeline p({Resize(std::atoi(argv[4])), CenterCrop(std::atoi(argv[5])),
                           ToTensor(DType::kUInt8, Layout::kHWC)},
                          {.dct_min_ratio = std::atof(argv[6])});
    std::vector<std::byte> out(p.output_bytes());
    ImageScratch scratch;
    stoker::SampleRng rng(0, 0, 0);
    p.run(file, rng, out.data(), scratch);
    std::ofstream(argv[3], std::ios::binary)
        .write(reinterpret_cast<const char*>(out.data()), out.size());
    return 0;
  }
  if (mode == "bench" && argc >= 5) {
    const double secs = std::atof(argv[2]);
    const double dct = std::atof(argv[3]);
    std::vector<std::vector<std::byte>> files;
    for (int i = 4; i < argc; ++i) files.push_back(read_file(argv[i]));
    const double decode_rate =
        rate(secs, files.size(), [&](size_t i, size_t) { (void)decode(files[i]); });
    ImageScratch scratch;
    const ImagePipeline val({Resize(256), CenterCrop(224), ToTensor(DType::kUInt8)},
                            {.dct_min_ratio = dct});
    const ImagePipeline train(
        {RandomResizedCrop(224, 224), RandomHorizontalFlip(), ToTensor(DType::kFloat32),
         Normalize({0.485f, 0.456f, 0.406f}, {0.229f, 0.224f, 0.225f})},
        {.dct_min_ratio = dct});
    std::vector<std::byte> out(train.output_bytes());
    const double val_rate = rate(secs, files.size(), [&](size_t i, size_t k) {
      stoker::SampleRng rng(1, 0, k);
      val.run(files[i], rng, out.data(), scratch);
    });
    const double train_rate = rate(secs, files.size(), [&](size_t i, size_t k) {
      stoker::SampleRng rng(1, 0, k);
      train.run(files[i], rng, out.data(), scratch);
    });
    std::printf(
        "decode-only %.1f img/s  resize256+crop224 %.1f img/s  rrc224+flip+norm %.1f img/s\n",
        decode_rate, val_rate, train_rate);
    return 0;
  }
  std::fprintf(stderr, "usage: see the comment at the top of image_tool.cc\n");
  return 1;
}
