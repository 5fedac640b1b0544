#include "stoker/ffmpeg/sidecar.h"

#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <vector>

#include "stoker/errors.h"

namespace stoker::video {

std::optional<VideoIndex> read_sidecar(const std::string& path) {
  struct stat video {
  }, side{};
  const std::string sidecar = sidecar_path(path);
  if (::stat(path.c_str(), &video) != 0 || ::stat(sidecar.c_str(), &side) != 0 ||
      !S_ISREG(side.st_mode))
    return std::nullopt;
  std::ifstream in(sidecar, std::ios::binary);
  std::vector<std::byte> bytes(static_cast<size_t>(side.st_size));
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size())))
    return std::nullopt;
  return parse_index(bytes, static_cast<uint64_t>(video.st_size));
}

VideoIndex write_sidecar(const std::string& path) {
  VideoReader reader;
  reader.open(path);
  VideoIndex index = reader.build_index();
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw IoError("cannot stat " + path);
  const std::string bytes = serialize_index(index, static_cast<uint64_t>(st.st_size));
  const std::string sidecar = sidecar_path(path);
  const std::string tmp = sidecar + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())) || !out.flush())
      throw IoError("cannot write " + tmp);
  }
  if (std::rename(tmp.c_str(), sidecar.c_str()) != 0) throw IoError("cannot write " + sidecar);
  return index;
}

}  // namespace stoker::video
