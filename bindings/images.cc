// Image datasets: file providers (ImageFolder lists, WebDataset tar shards), the ImageSource and
// ChannelStatsSource built on them, single-image decoding for __getitem__, and the decode-only
// throughput bound of the benchmark.
//
// A pipeline arrives as a list of tuples (private format, written by stoker/transforms.py):
//   ("RandomResizedCrop", h, w, scale_lo, scale_hi, ratio_lo, ratio_hi)
//   ("Resize", shorter_side) | ("Resize", h, w)
//   ("CenterCrop", h, w)
//   ("RandomHorizontalFlip", p)
//   ("ToTensor", "uint8"|"float32"|"float16"|"bfloat16", "CHW"|"HWC")
//   ("Normalize", (m0, m1, m2), (s0, s1, s2))
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <thread>

#include "bindings.h"
#include "stoker/errors.h"
#include "stoker/image/decode.h"
#include "stoker/image/pipeline.h"
#include "stoker/sources/image_files.h"
#include "stoker/sources/image_source.h"

namespace stoker::python {
namespace {

image::DType parse_image_dtype(const std::string& s) {
  if (s == "uint8") return image::DType::kUInt8;
  if (s == "float32") return image::DType::kFloat32;
  if (s == "float16") return image::DType::kFloat16;
  if (s == "bfloat16") return image::DType::kBFloat16;
  throw InvalidArgument(
      "ToTensor dtype must be \"uint8\", \"float32\", \"float16\" or "
      "\"bfloat16\", got \"" +
      s + "\"");
}

image::Layout parse_layout(const std::string& s) {
  if (s == "CHW") return image::Layout::kCHW;
  if (s == "HWC") return image::Layout::kHWC;
  throw InvalidArgument("ToTensor layout must be \"CHW\" or \"HWC\", got \"" + s + "\"");
}

image::Transform parse_transform(const nb::tuple& t) {
  if (t.size() == 0) throw InvalidArgument("empty transform spec");
  const std::string name = nb::cast<std::string>(t[0]);
  const size_t n = t.size();
  auto i = [&](size_t k) { return nb::cast<int>(t[k]); };
  auto d = [&](size_t k) { return nb::cast<double>(t[k]); };
  if (name == "RandomResizedCrop" && n == 7)
    return image::RandomResizedCrop(i(1), i(2), {d(3), d(4)}, {d(5), d(6)});
  if (name == "Resize" && n == 2) return image::Resize(i(1));
  if (name == "Resize" && n == 3) return image::Resize(i(1), i(2));
  if (name == "CenterCrop" && n == 3) return image::CenterCrop(i(1), i(2));
  if (name == "RandomHorizontalFlip" && n == 2) return image::RandomHorizontalFlip(d(1));
  if (name == "ToTensor" && n == 3)
    return image::ToTensor(parse_image_dtype(nb::cast<std::string>(t[1])),
                           parse_layout(nb::cast<std::string>(t[2])));
  if (name == "Normalize" && n == 3)
    return image::Normalize(nb::cast<std::array<float, 3>>(t[1]),
                            nb::cast<std::array<float, 3>>(t[2]));
  throw InvalidArgument("unknown transform spec '" + name + "' with " + std::to_string(n - 1) +
                        " arguments");
}

std::shared_ptr<const image::ImagePipeline> make_pipeline(const nb::list& spec,
                                                          uint64_t max_pixels) {
  std::vector<image::Transform> transforms = parse_transforms(spec);
  image::PipelineOptions options;
  options.max_pixels = max_pixels;
  return std::make_shared<const image::ImagePipeline>(std::move(transforms), options);
}

std::vector<std::byte> read_whole_file(const std::string& path) {
  auto files = ImageFolderFiles({{path, 0}});
  std::vector<std::byte> bytes;
  files.read(0, bytes);
  return bytes;
}

nb::ndarray<nb::numpy, uint8_t> to_numpy(image::DecodedImage img) {
  auto* rgb = new std::vector<uint8_t>(std::move(img.rgb));
  nb::capsule owner(rgb, [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  const size_t shape[3] = {static_cast<size_t>(img.height), static_cast<size_t>(img.width), 3};
  return nb::ndarray<nb::numpy, uint8_t>(rgb->data(), 3, shape, owner);
}

nb::bytes read_bytes(const ImageFiles& files, uint64_t i) {
  if (i >= files.size()) throw nb::index_error("sample index out of range");
  std::vector<std::byte> buf;
  {
    nb::gil_scoped_release release;
    files.read(i, buf);
  }
  return nb::bytes(reinterpret_cast<const char*>(buf.data()), buf.size());
}

// One sample of a source, as raw bytes per field (the caller views them with the right dtype).
nb::list read_sample(const Source& src, uint64_t index, uint64_t seed, uint64_t epoch) {
  if (index >= src.size()) throw nb::index_error("sample index out of range");
  std::vector<std::vector<std::byte>> out;
  std::vector<std::byte*> slots;
  for (const auto& f : src.fields()) out.emplace_back(f.sample_bytes() + 16);
  for (auto& o : out) {
    auto addr = reinterpret_cast<uintptr_t>(o.data());
    slots.push_back(o.data() + ((16 - addr % 16) % 16));  // aligned for any dtype
  }
  {
    nb::gil_scoped_release release;
    auto state = src.make_worker_state();
    src.read({seed, epoch, index}, slots, state.get());
  }
  nb::list result;
  for (size_t f = 0; f < out.size(); ++f)
    result.append(
        nb::bytes(reinterpret_cast<const char*>(slots[f]), src.fields()[f].sample_bytes()));
  return result;
}

nb::dict decode_only(const std::vector<std::string>& paths, int threads, double min_seconds) {
  if (threads < 1) throw InvalidArgument("threads must be a positive integer");
  if (paths.empty()) throw InvalidArgument("decode_only needs at least one file");
  uint64_t images = 0, pixels = 0, failures = 0;
  double seconds = 0;
  {
    nb::gil_scoped_release release;
    std::vector<std::vector<std::byte>> files;
    files.reserve(paths.size());
    for (const auto& p : paths) files.push_back(read_whole_file(p));
    std::atomic<uint64_t> next{0}, n_images{0}, n_pixels{0}, n_fail{0};
    std::atomic<bool> stop{false};
    const auto t0 = std::chrono::steady_clock::now();
    const auto deadline = t0 + std::chrono::duration<double>(min_seconds);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&] {
        image::Decoder decoder;  // one per thread, as a loader's worker has
        image::DecodedImage img;
        for (;;) {
          // Whole passes over the files: stop only after a pass once the time is up.
          const uint64_t k = next.fetch_add(1);
          if (k % files.size() == 0 && k > 0 && std::chrono::steady_clock::now() >= deadline)
            stop = true;
          if (stop) return;
          try {
            decoder.decode(files[k % files.size()], img);
            n_images += 1;
            n_pixels += static_cast<uint64_t>(img.width) * img.height;
          } catch (const DecodeError&) {
            n_fail += 1;
          }
        }
      });
    }
    for (auto& th : pool) th.join();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    images = n_images, pixels = n_pixels, failures = n_fail;
  }
  nb::dict d;
  d["images"] = images;
  d["failures"] = failures;
  d["seconds"] = seconds;
  d["threads"] = threads;
  d["images_per_s"] = seconds > 0 ? images / seconds : 0.0;
  d["megapixels_per_s"] = seconds > 0 ? pixels / seconds / 1e6 : 0.0;
  return d;
}

}  // namespace

std::vector<image::Transform> parse_transforms(const nb::list& spec) {
  std::vector<image::Transform> transforms;
  for (nb::handle h : spec) transforms.push_back(parse_transform(nb::cast<nb::tuple>(h)));
  return transforms;
}

void register_images(nb::module_& m) {
  nb::class_<ImageFiles>(m, "ImageFiles")
      .def("__len__", &ImageFiles::size)
      .def("label", &ImageFiles::label, nb::arg("index"))
      .def("path", &ImageFiles::path, nb::arg("index"))
      .def_prop_ro("labels",
                   [](const ImageFiles& f) {
                     std::vector<int64_t> v(f.size());
                     for (uint64_t i = 0; i < v.size(); ++i) v[i] = f.label(i);
                     return v;
                   })
      .def("read", &read_bytes, nb::arg("index"), "The file bytes of sample `index`.");

  nb::class_<ImageFolderFiles, ImageFiles>(m, "ImageFolderFiles")
      .def(nb::new_([](std::vector<std::pair<std::string, int64_t>> samples) {
             return std::make_shared<ImageFolderFiles>(std::move(samples));
           }),
           nb::arg("samples"));

  nb::class_<TarShardFiles, ImageFiles>(m, "TarShardFiles")
      .def(nb::new_([](std::vector<std::string> paths) {
             nb::gil_scoped_release release;
             return std::make_shared<TarShardFiles>(std::move(paths));
           }),
           nb::arg("paths"))
      .def_prop_ro("num_shards", &TarShardFiles::num_shards);

  nb::class_<ImageSource, Source>(m, "ImageSource")
      .def(nb::new_(
               [](std::shared_ptr<ImageFiles> files, const nb::list& spec, uint64_t max_pixels) {
                 return std::make_shared<ImageSource>(std::move(files),
                                                      make_pipeline(spec, max_pixels));
               }),
           nb::arg("files"), nb::arg("pipeline"), nb::arg("max_pixels"))
      .def_prop_ro("image_shape", [](const ImageSource& s) { return s.fields()[0].shape; })
      .def_prop_ro("image_dtype", [](const ImageSource& s) { return s.fields()[0].dtype.name(); })
      .def("sample", &read_sample, nb::arg("index"), nb::arg("seed"), nb::arg("epoch"),
           "Raw bytes of each field of one sample (image, label).");

  nb::class_<ChannelStatsSource, Source>(m, "ChannelStatsSource")
      .def(nb::new_([](std::shared_ptr<ImageFiles> files, uint64_t max_pixels) {
             return std::make_shared<ChannelStatsSource>(std::move(files), max_pixels);
           }),
           nb::arg("files"), nb::arg("max_pixels"));

  m.def(
      "check_pipeline",
      [](const nb::list& spec) {
        auto p = make_pipeline(spec, image::kDefaultMaxPixels);
        const auto shape = p->output_shape();
        return std::make_pair(std::vector<int64_t>(shape.begin(), shape.end()),
                              to_dtype(p->dtype()).name());
      },
      nb::arg("pipeline"), "(output shape, dtype name); ValueError when the pipeline is invalid.");

  m.def(
      "decode_file",
      [](const std::string& path, uint64_t max_pixels) {
        image::DecodedImage img;
        {
          nb::gil_scoped_release release;
          img = image::decode(read_whole_file(path), max_pixels);
        }
        return to_numpy(std::move(img));
      },
      nb::arg("path"), nb::arg("max_pixels") = image::kDefaultMaxPixels);
  m.def(
      "decode_file",
      [](nb::bytes data, uint64_t max_pixels) {
        std::span<const std::byte> bytes(static_cast<const std::byte*>(data.data()), data.size());
        image::DecodedImage img;
        {
          nb::gil_scoped_release release;
          img = image::decode(bytes, max_pixels);
        }
        return to_numpy(std::move(img));
      },
      nb::arg("data"), nb::arg("max_pixels") = image::kDefaultMaxPixels,
      "Decodes a whole image to an HWC uint8 RGB array.");

  m.def(
      "random_resized_crop_box",
      [](int height, int width, std::pair<int, int> size, std::pair<double, double> scale,
         std::pair<double, double> ratio, uint64_t seed, uint64_t epoch, uint64_t index) {
        SampleRng rng(seed, epoch, index);
        const image::CropBox b = image::random_resized_crop_params(
            height, width, image::RandomResizedCrop(size.first, size.second, scale, ratio), rng);
        return std::make_tuple(b.top, b.left, b.height, b.width);
      },
      nb::arg("height"), nb::arg("width"), nb::arg("size"), nb::arg("scale"), nb::arg("ratio"),
      nb::arg("seed"), nb::arg("epoch"), nb::arg("index"),
      "(top, left, height, width) that RandomResizedCrop draws for sample `index` of `epoch` "
      "when it is the pipeline's first random transform.");

  m.def("decode_only", &decode_only, nb::arg("paths"), nb::arg("threads"), nb::arg("min_seconds"),
        "Decode-only throughput bound: every file in memory, full-size decodes on `threads` "
        "threads for at least min_seconds.");
}

}  // namespace stoker::python
