// The extension module stoker._video: the video, LeRobot and FFmpeg wings (src/video/,
// src/lerobot/, src/ffmpeg/), apart from stoker._native because it links FFmpeg's libraries, which
// a user without video need not have. Its classes derive from stoker._native's (Source), whose
// module it imports first; nanobind shares their types and the exception translation (errors.cc)
// between the two modules.
#include "stoker/lerobot/lerobot_source.h"
#include "stoker/video/video_source.h"

#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "stoker/errors.h"
#include "stoker/ffmpeg/reader.h"
#include "stoker/ffmpeg/sidecar.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace stoker::python {
namespace {

ClipOptions clip_options(uint32_t frames, uint32_t stride, double fps, uint32_t clips_per_video,
                         bool random, bool timestamps, bool cthw, bool exact_size,
                         int decoder_threads, uint64_t index_cache_bytes) {
  ClipOptions o;
  o.frames = frames;
  o.stride = stride;
  o.fps = fps;
  o.clips_per_video = clips_per_video;
  o.random = random;
  o.timestamps = timestamps;
  o.cthw = cthw;
  o.exact_size = exact_size;
  o.decoder_threads = decoder_threads;
  o.index_cache_bytes = index_cache_bytes;
  return o;
}

nb::dict stats_dict(const VideoStats& v) {
  nb::dict out;
  out["clips"] = v.clips;
  out["frames_delivered"] = v.frames_delivered;
  out["frames_decoded"] = v.frames_decoded;
  out["seeks"] = v.seeks;
  out["opens"] = v.opens;
  out["decoder_reuses"] = v.decoder_reuses;
  out["index_builds"] = v.index_builds;
  out["index_cache_bytes"] = v.index_cache_bytes;
  out["decode_seconds"] = v.decode_seconds;
  out["transform_seconds"] = v.transform_seconds;
  return out;
}

// A step value's element type: the three lerobot's items hold.
DType value_dtype(const std::string& name) {
  if (name == "float32") return kFloat32;
  if (name == "int64") return kInt64;
  if (name == "bool") return DType{DType::kBool, 8};
  throw InvalidArgument("LeRobotSource: a value of " + name +
                        ", not float32, int64 or bool");
}

using ValueSpec =
    std::tuple<std::string, std::string, std::vector<int64_t>, nb::bytes, std::vector<int64_t>>;
using CameraSpec =
    std::tuple<std::string, std::shared_ptr<image::ImagePipeline>, bool, std::vector<int64_t>,
               std::vector<std::string>, std::vector<double>>;

std::shared_ptr<LeRobotSource> make_lerobot(const std::vector<ValueSpec>& values,
                                            std::vector<float> timestamps,
                                            const std::vector<CameraSpec>& cameras,
                                            std::vector<uint64_t> starts, std::vector<int64_t> ids,
                                            std::vector<int64_t> labels, double tolerance,
                                            int decoder_threads, uint64_t index_cache_bytes) {
  std::vector<StepValue> vs;
  for (const auto& [name, dtype, shape, data, deltas] : values) {
    const auto* p = static_cast<const std::byte*>(data.data());
    vs.push_back({name, value_dtype(dtype), shape, std::vector<std::byte>(p, p + data.size()),
                  deltas});
  }
  std::vector<StepCamera> cs;
  for (const auto& [name, pipeline, exact_size, deltas, video, from] : cameras)
    cs.push_back({name, pipeline, exact_size, deltas, video, from});
  return std::make_shared<LeRobotSource>(std::move(vs), std::move(timestamps), std::move(cs),
                                         StepEpisodes{std::move(starts), std::move(ids)},
                                         std::move(labels), tolerance, decoder_threads,
                                         index_cache_bytes);
}

nb::dict describe(const video::VideoIndex& index) {
  nb::dict out;
  out["width"] = index.width;
  out["height"] = index.height;
  out["codec"] = index.codec;
  out["frames"] = index.frames();
  out["keyframes"] = index.keyframes.size();
  std::vector<double> seconds(index.pts.size());
  for (size_t i = 0; i < seconds.size(); ++i) seconds[i] = index.seconds(index.pts[i]);
  out["seconds"] = seconds;
  return out;
}

nb::dict probe(const std::string& path) {
  video::VideoIndex index;
  {
    nb::gil_scoped_release release;
    video::VideoReader reader;
    reader.open(path);
    index = reader.build_index();
  }
  return describe(index);
}

// Builds the index of the video at `path` and writes it beside it (`stoker index`).
nb::dict write_index(const std::string& path) {
  video::VideoIndex index;
  {
    nb::gil_scoped_release release;
    index = video::write_sidecar(path);
  }
  return describe(index);
}

nb::dict probe_bytes(nb::bytes data, const std::string& name) {
  std::vector<std::byte> bytes(static_cast<const std::byte*>(data.data()),
                               static_cast<const std::byte*>(data.data()) + data.size());
  video::VideoIndex index;
  {
    nb::gil_scoped_release release;
    video::VideoReader reader;
    reader.open_bytes(name, std::move(bytes));
    index = reader.build_index();
  }
  return describe(index);
}

}  // namespace

#ifdef STOKER_TESTING
void register_video_testing(nb::module_& m);  // testing_video.cc
#endif

}  // namespace stoker::python

NB_MODULE(_video, m) {
  using namespace stoker;
  using namespace stoker::python;
  nb::module_::import_("stoker._native");  // Source, ImagePipeline, the exception translator

  m.def("ffmpeg_versions", &video::ffmpeg_versions,
        "FFmpeg's libraries as linked: 'libavformat 59.27.100, ...'.");
  m.def("probe", &probe, "path"_a,
        "A video's stream as its packet index gives it: width, height, codec, frames, "
        "keyframes, seconds (each frame's presentation time).");
  m.def("probe", &probe_bytes, "data"_a, "name"_a, "probe() of a video in memory.");
  m.def("write_index", &write_index, "path"_a,
        "Indexes the video at `path` and writes <path>.stoker-index beside it (atomically); "
        "returns what probe() does.");
#ifdef STOKER_TESTING
  nb::module_ testing =
      m.def_submodule("testing", "Benchmark helpers (STOKER_TESTING builds only).");
  register_video_testing(testing);
#endif

  nb::class_<VideoSource, Source>(m, "VideoSource")
      .def(nb::new_([](const std::vector<std::tuple<std::string, int64_t, double, double>>& videos,
                       std::shared_ptr<image::ImagePipeline> pipeline, uint32_t frames,
                       uint32_t stride, double fps, uint32_t clips_per_video, bool random,
                       bool timestamps, bool cthw, bool exact_size, int decoder_threads,
                       uint64_t index_cache_bytes) {
             std::vector<VideoFile> files;
             files.reserve(videos.size());
             for (const auto& [path, label, start, end] : videos)
               files.push_back({path, label, start, end});
             const ClipOptions o =
                 clip_options(frames, stride, fps, clips_per_video, random, timestamps, cthw,
                              exact_size, decoder_threads, index_cache_bytes);
             return std::make_shared<VideoSource>(std::move(files), std::move(pipeline), o);
           }),
           "videos"_a, "pipeline"_a, "frames"_a, "stride"_a, "fps"_a, "clips_per_video"_a,
           "random"_a, "timestamps"_a, "cthw"_a, "exact_size"_a, "decoder_threads"_a,
           "index_cache_bytes"_a, "videos: (path, label, start seconds, end seconds or 0) each.")
      .def(nb::new_([](std::shared_ptr<ImageFiles> files,
                       std::shared_ptr<image::ImagePipeline> pipeline, uint32_t frames,
                       uint32_t stride, double fps, uint32_t clips_per_video, bool random,
                       bool timestamps, bool cthw, bool exact_size, int decoder_threads,
                       uint64_t index_cache_bytes) {
             const ClipOptions o =
                 clip_options(frames, stride, fps, clips_per_video, random, timestamps, cthw,
                              exact_size, decoder_threads, index_cache_bytes);
             return std::make_shared<VideoSource>(std::move(files), std::move(pipeline), o);
           }),
           "files"_a, "pipeline"_a, "frames"_a, "stride"_a, "fps"_a, "clips_per_video"_a,
           "random"_a, "timestamps"_a, "cthw"_a, "exact_size"_a, "decoder_threads"_a,
           "index_cache_bytes"_a,
           "Videos whose bytes `files` reads (TarShardFiles(paths, media=\"videos\")).")
      .def_prop_ro("clip_shape", [](const VideoSource& s) { return s.fields()[0].shape; })
      .def_prop_ro("clip_dtype", [](const VideoSource& s) { return s.fields()[0].dtype.name(); })
      .def("stats", [](const VideoSource& s) { return stats_dict(s.stats()); });

  nb::class_<LeRobotSource, Source>(m, "LeRobotSource")
      .def(nb::new_(&make_lerobot), "values"_a, "timestamps"_a, "cameras"_a, "starts"_a,
           "episode_ids"_a, "labels"_a, "tolerance"_a, "decoder_threads"_a,
           "index_cache_bytes"_a,
           "The steps of a LeRobot dataset (stoker/lerobot/lerobot_source.h). values: (name, "
           "dtype, shape, bytes of every row, deltas) each; cameras: (name, pipeline, exact_size, "
           "deltas, video per episode, start seconds per episode) each; starts: the episodes' "
           "first rows and the rows.")
      .def("stats", [](const LeRobotSource& s) { return stats_dict(s.stats()); });
}
