// A video's container and packets (VideoReader: FFmpeg's demuxers and decoders behind Stoker's
// packet index, seeks and frame selection), then frames read from the index.
//
// The input is the file, then two bytes (its last) that choose the frames wanted. Checked: opening,
// indexing and decoding throw nothing but DecodeError or IoError; a read that succeeds hands
// every wanted frame over once, in order, with the pts the index gives it; every frame's pixels
// convert to RGB; the index survives its sidecar's bytes, and the input read as a sidecar is
// refused or parsed.
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

#include "fuzz_file.h"
#include "image_fuzz.h"  // require()
#include "stoker/errors.h"
#include "stoker/ffmpeg/reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using stoker::fuzz::require;
  static stoker::fuzz::FuzzFile file;
  FuzzedDataProvider p(data, size);
  const uint8_t first = p.ConsumeIntegral<uint8_t>();
  const uint8_t step = p.ConsumeIntegral<uint8_t>();
  const std::vector<uint8_t> bytes = p.ConsumeRemainingBytes<uint8_t>();
  const std::string& path = file.write(bytes.data(), bytes.size());
  // The input as a sidecar too: refused or parsed, never a crash.
  (void)stoker::video::parse_index({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()},
                                   bytes.size());

  stoker::video::VideoReader reader;
  stoker::video::VideoIndex index;
  try {
    reader.open(path);
    index = reader.build_index();
  } catch (const stoker::DecodeError&) {
    return 0;
  } catch (const stoker::IoError&) {
    return 0;
  }
  require(std::is_sorted(index.pts.begin(), index.pts.end()), "an index out of order");
  const std::string sidecar = stoker::video::serialize_index(index, bytes.size());
  const std::optional<stoker::video::VideoIndex> back = stoker::video::parse_index(
      {reinterpret_cast<const std::byte*>(sidecar.data()), sidecar.size()}, bytes.size());
  require(back && back->pts == index.pts && back->keyframes.size() == index.keyframes.size(),
          "an index does not survive its sidecar");
  if (index.frames() == 0) return 0;
  std::vector<uint64_t> wanted;
  for (uint64_t f = first % index.frames(); f < index.frames() && wanted.size() < 4;
       f += 1 + step % 8)
    wanted.push_back(f);
  size_t next = 0;
  try {
    reader.read_frames(index, wanted, [&](size_t k, stoker::image::Picture& frame, int64_t pts) {
      require(k == next++, "a frame handed over out of order");
      require(pts == index.pts[wanted[k]], "a frame with another pts than the index's");
      const stoker::image::RgbRegion r = frame.rgb(0, 0, frame.width(), frame.height());
      require(r.x0 == 0 && r.y0 == 0 && r.x1 >= frame.width() && r.y1 >= frame.height(),
              "the whole frame asked, less converted");
    });
    require(next == wanted.size(), "a read that succeeded without every frame");
  } catch (const stoker::DecodeError&) {
  }
  return 0;
}
