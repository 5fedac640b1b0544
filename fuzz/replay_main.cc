// A main() for the fuzz targets when libFuzzer is not there (GCC builds, the ASan test lane): runs
// LLVMFuzzerTestOneInput once on each file named on the command line, or on every file of each
// directory named, so the regression inputs and seeds replay as ordinary tests.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void run_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  std::fprintf(stderr, "replay %s (%zu bytes)\n", path.c_str(), bytes.size());
  // An exact-size heap copy: ASan catches a read one byte past it, as under libFuzzer.
  std::unique_ptr<uint8_t[]> exact(new uint8_t[bytes.size()]);
  if (!bytes.empty()) std::memcpy(exact.get(), bytes.data(), bytes.size());
  LLVMFuzzerTestOneInput(exact.get(), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  size_t files = 0;
  for (int a = 1; a < argc; ++a) {
    const std::filesystem::path arg(argv[a]);
    if (std::filesystem::is_directory(arg)) {
      std::vector<std::filesystem::path> paths;
      for (const auto& e : std::filesystem::directory_iterator(arg))
        if (e.is_regular_file() && e.path().filename().string()[0] != '.')
          paths.push_back(e.path());  // not .gitkeep
      std::sort(paths.begin(), paths.end());
      for (const auto& p : paths) run_file(p), ++files;
    } else if (std::filesystem::exists(arg)) {
      run_file(arg), ++files;
    }
  }
  std::fprintf(stderr, "replayed %zu input(s)\n", files);
  return 0;
}
