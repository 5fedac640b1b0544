// Video decoding with FFmpeg (libavformat, libavcodec, libswscale): a packet index per video and
// a per-thread reader that decodes just the frames a clip keeps.
//
// VideoIndex: the frames of a video's stream as its packets describe them, built by demuxing once
// (no decoding): each output frame's presentation timestamp, and the keyframes decoding can start
// at. Frames are counted as the decoder outputs them: packets the container marks discarded (the
// part of an edit list before its start) are not frames.
//
// VideoReader: one thread's demuxer and decoder. read_frames() seeks to the keyframe before the
// first wanted frame (or goes on forward from where it stopped, when that is nearer), decodes
// up to the last wanted frame, and hands each wanted frame to the sink as an image::Picture, whose
// pixels are converted to RGB only where the pipeline reads them. Frames that no wanted frame
// needs are not decoded where the codec says they are not references (AVDISCARD_NONREF, packet by
// packet). The frame at a timestamp is the one FFmpeg (and PyAV) decodes there; the display
// matrix (rotation) is not applied: frames are as stored, as PyAV gives them.
//
// Contract:
// - Thread safety: a VideoIndex is immutable once built; a VideoReader is one thread's.
// - Errors: IoError when a file cannot be opened; DecodeError naming the file (and the timestamp,
//   where there is one) for a file with no video stream, an unsupported codec, corrupt packets,
//   or packets that disagree with the index. A reader is usable again after an error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "stoker/image/pipeline.h"

namespace stoker::video {

struct VideoIndex {
  struct Keyframe {
    int64_t pts;
    int64_t dts;
  };
  int stream = 0;             // the video stream's index in the container
  int width = 0, height = 0;  // as the stream's parameters give them
  int64_t time_base_num = 1, time_base_den = 1;
  std::string codec;                // FFmpeg's decoder name
  std::vector<int64_t> pts;         // the output frames, in presentation order (ascending)
  std::vector<Keyframe> keyframes;  // in decode order

  uint64_t frames() const { return pts.size(); }
  double seconds(int64_t ts) const {
    return static_cast<double>(ts) * time_base_num / time_base_den;
  }
  // The keyframe decoding starts at for frame i: the last whose pts is at most pts[i] (0 when
  // none is: decoding then starts at the stream's beginning).
  size_t keyframe_for(uint64_t frame) const;
  size_t bytes() const {
    return sizeof(*this) + codec.size() + pts.size() * sizeof(int64_t) +
           keyframes.size() * sizeof(Keyframe);
  }
};

struct ReaderStats {
  uint64_t frames_decoded = 0;  // frames the decoder output (skipped non-references are not)
  uint64_t seeks = 0;
  uint64_t opens = 0;
  uint64_t decoder_reuses = 0;  // opens that kept the decoder of the video before (alike)
};

class VideoReader {
 public:
  // Called once per wanted frame, in order: its position in `wanted`, the frame, its pts. The
  // picture is valid during the call only.
  using FrameSink = std::function<void(size_t position, image::Picture& frame, int64_t pts)>;

  // decoder_threads: FFmpeg's own threads per decoder (0: FFmpeg chooses; 1: none).
  explicit VideoReader(int decoder_threads = 1);
  ~VideoReader();
  VideoReader(const VideoReader&) = delete;
  VideoReader& operator=(const VideoReader&) = delete;

  // Opens the file at `path`, unless it is the one open now (its demuxer and decoder are then
  // reused). A video encoded as the one before it (codec, size, pixel format, extradata) keeps
  // its decoder, flushed. Throws IoError or DecodeError naming it.
  void open(const std::string& path);
  // Opens a video held in memory (a tar shard's member), named `name` in messages, unless it is
  // the one open now (`bytes` is then dropped). The reader keeps the bytes while it is open.
  void open_bytes(const std::string& name, std::vector<std::byte> bytes);
  // Whether `name` is the video open now.
  bool is_open(const std::string& name) const;
  const std::string& path() const;
  // The index of the open file: a pass over its packets.
  VideoIndex build_index();
  // Decodes the frames wanted (indices into index.pts, ascending, repeats allowed) of the open
  // file, whose index `index` is. REQUIRES: open() succeeded; every wanted < index.frames().
  void read_frames(const VideoIndex& index, std::span<const uint64_t> wanted,
                   const FrameSink& sink);
  // The decode bound's unit of work (bench/bench_video.py): decodes every frame from the
  // keyframe before frame `first` to frame `last` as a plain FFmpeg loop would (a seek, no
  // frame skipped, none converted). Returns the frames decoded. REQUIRES: first <= last <
  // index.frames().
  uint64_t decode_span(const VideoIndex& index, uint64_t first, uint64_t last);
  const ReaderStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The index as a sidecar file's bytes (`stoker index` writes them beside a video, as
// <video>.stoker-index): a versioned little-endian binary of the index and the size of the video
// it describes.
std::string serialize_index(const VideoIndex& index, uint64_t video_size);
// The index in a sidecar's bytes, or nullopt when they are not one (another format or version,
// truncated, inconsistent) or describe a video of another size than `video_size` (stale).
std::optional<VideoIndex> parse_index(std::span<const std::byte> bytes, uint64_t video_size);
// Where the sidecar of the video at `path` lives.
inline std::string sidecar_path(const std::string& path) { return path + ".stoker-index"; }

// FFmpeg's libraries as linked: "libavformat 59.27.100, libavcodec 59.37.100, ...".
std::string ffmpeg_versions();

}  // namespace stoker::video
