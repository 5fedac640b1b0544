// A video's index file: the packet index (stoker/ffmpeg/reader.h) written beside the video as
// <video>.stoker-index (sidecar_path), so that a source that reads the video later (VideoSource,
// LeRobotSource) need not demux it again. `stoker index` writes them; the sources read them.
//
// Contract:
// - Thread safety: free functions, safe from any thread. Two writers of the same video's sidecar
//   race harmlessly: each writes a temporary file and renames it over the sidecar, so a reader
//   sees one whole sidecar or none, never a partial one.
// - Staleness: a sidecar records the size of the video it describes; one whose video has another
//   size now is not read.
// - Errors: as each function says.
#pragma once

#include <optional>
#include <string>

#include "stoker/ffmpeg/reader.h"

namespace stoker::video {

// The index in the sidecar of the video at `path`, when there is one that describes it (the
// video's size matches); nullopt otherwise (no sidecar, an unreadable or stale one). Never throws
// for a missing or bad sidecar.
std::optional<VideoIndex> read_sidecar(const std::string& path);

// Indexes the video at `path` (a pass over its packets) and writes the index to its sidecar
// atomically (a temporary file beside it, renamed over it). Returns the index. Throws IoError when
// the video cannot be opened or stat-ed or the sidecar cannot be written, DecodeError as
// VideoReader::build_index does.
VideoIndex write_sidecar(const std::string& path);

}  // namespace stoker::video
