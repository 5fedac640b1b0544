// A native FLAC stream's frames, found by their headers, for the decoder to be fed without
// FFmpeg's FLAC demuxer and parser (internal to the audio wing; decoder.cc uses it).
//
// Why: FFmpeg's FLAC parser tells frames apart by scoring every candidate header it meets, and
// its seek is a binary search that starts a fresh parser at every step. Together they were about
// a third of a short slice's time, more than the FLAC decoder's own work. A frame header states
// its first sample (a frame number times the stream's block size, or a sample number) and is
// protected by a CRC-8; STREAMINFO states the stream's rate, channels, bits and total samples.
// So a seek is an interpolation search over the bytes (one or two probes for the near-constant
// bitrate of FLAC), and a frame ends where the next header with the expected first sample
// begins: a false sync (0xFFF8 inside a frame's data) would also need the right CRC-8 and the
// next frame's number.
//
// Contract:
// - Thread safety: one FlacFrames per thread (it holds a read window and a position).
// - Errors: none thrown; open() says whether the stream is one it reads (else the caller uses
//   FFmpeg's demuxer), seek() whether the sample is inside the stream, next() whether a frame
//   is left. A frame whose data is corrupt is the decoder's to find.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

namespace stoker::audio {

// STREAMINFO's fields.
struct FlacInfo {
  uint32_t min_block = 0;
  uint32_t max_block = 0;
  uint32_t min_frame = 0;  // bytes; 0: unknown
  uint32_t max_frame = 0;  // bytes; 0: unknown
  uint32_t rate = 0;
  uint32_t channels = 0;
  uint32_t bits = 0;
  uint64_t total = 0;  // samples per channel; 0: unknown
};

class FlacFrames {
 public:
  // Reads up to n bytes at byte pos into dst; returns how many (0 at the end, < 0 on error).
  using Read = std::function<int64_t(int64_t pos, uint8_t* dst, int64_t n)>;

  // The stream of `size` bytes read by `read`: its "fLaC" marker, its metadata blocks (the first
  // one STREAMINFO) and its first frame's header. nullopt where it is not such a stream (FLAC in
  // Ogg or behind an ID3 tag, a header this does not read: the caller uses FFmpeg's demuxer).
  static std::optional<FlacFrames> open(Read read, int64_t size);

  const FlacInfo& info() const { return info_; }

  // Positions next() at the frame that holds `sample` (per channel, from the stream's start).
  // False where the stream has no such frame (the sample is past its end).
  bool seek(uint64_t sample);

  // The next frame: its bytes (valid until the next call) and its first sample. False at the
  // end of the stream.
  bool next(std::span<const uint8_t>* bytes, uint64_t* first_sample);

 private:
  struct Header {
    uint64_t first = 0;  // its first sample
    uint32_t block = 0;  // its samples per channel
    uint32_t size = 0;   // the header's bytes
  };

  FlacFrames(Read read, int64_t size) : read_(std::move(read)), size_(size) {}

  // Bytes [pos, pos + n) (fewer at the end: *got says how many) through the read window.
  const uint8_t* bytes(int64_t pos, int64_t n, int64_t* got);
  // The header at pos, if one is there.
  std::optional<Header> header_at(int64_t pos);
  // The first header at or after pos and before limit: with first sample `expect` where given,
  // else any that the header after it confirms. Its position, or -1.
  int64_t find(int64_t pos, int64_t limit, std::optional<uint64_t> expect, Header* h);

  Read read_;
  int64_t size_ = 0;
  FlacInfo info_;
  int64_t first_frame_ = 0;
  std::vector<uint8_t> window_;
  int64_t window_pos_ = 0;
  int64_t keep_ = -1;  // where a reload starts when it reaches past it: the frame next() reads
  int64_t pos_ = 0;    // the next frame's header, or -1 at the end
  Header at_;          // its header
};

}  // namespace stoker::audio
