// stoker._text.image_text: ImageTextSource (include/stoker/image_text/image_text_source.h), tar
// shards of any fields, the source of a TarShards(fields=...); PatchProcessor and TileProcessor
// (include/stoker/image_text/patch_processor.h, tile_processor.h), Qwen2-VL's and LLaVA-NeXT's
// image processors; VLMSource (vlm_source.h). In stoker._text because a caption is tokenized by
// the text wing; the pipelines come from stoker._native (shared nanobind types).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "stoker/errors.h"
#include "stoker/image/decode.h"
#include "stoker/image/pipeline.h"
#include "stoker/image_text/dynamic_images.h"
#include "stoker/image_text/image_text_source.h"
#include "stoker/image_text/patch_processor.h"
#include "stoker/image_text/tile_processor.h"
#include "stoker/image_text/vlm_source.h"
#include "stoker/shard_cache.h"
#include "stoker/sources/documents.h"
#include "stoker/sources/image_files.h"
#include "stoker/text/tokenizer.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace stoker::image_text {
namespace {

template <typename T>
T get(const nb::dict& d, const char* key, T fallback) {
  return d.contains(key) ? nb::cast<T>(d[key]) : fallback;
}

// One field from the dict python/stoker/image_text/ makes of a spec.
FieldOptions field_of(const nb::dict& d) {
  FieldOptions f;
  const std::string kind = nb::cast<std::string>(d["kind"]);
  f.name = nb::cast<std::string>(d["name"]);
  f.exts = nb::cast<std::vector<std::string>>(d["exts"]);
  if (kind == "image") {
    f.kind = FieldKind::kImage;
    if (d.contains("bucket_pipelines")) {
      for (nb::handle p : nb::cast<nb::list>(d["bucket_pipelines"]))
        f.bucket_pipelines.push_back(nb::cast<std::shared_ptr<image::ImagePipeline>>(p));
      f.sizes_name = nb::cast<std::string>(d["sizes_name"]);
      f.crops_name = nb::cast<std::string>(d["crops_name"]);
    } else {
      f.pipeline = nb::cast<std::shared_ptr<image::ImagePipeline>>(d["pipeline"]);
    }
  } else if (kind == "text") {
    f.kind = FieldKind::kText;
    f.tokenizer = nb::cast<std::shared_ptr<text::Tokenizer>>(d["tokenizer"]);
    f.max_length = nb::cast<uint32_t>(d["max_length"]);
    f.ragged = get<bool>(d, "ragged", false);
    f.truncation = nb::cast<bool>(d["truncation"]);
    f.add_special_tokens = nb::cast<bool>(d["add_special_tokens"]);
    f.pad_id = nb::cast<int64_t>(d["pad_id"]);
    f.mask_name = nb::cast<std::string>(d["mask_name"]);
  } else if (kind == "raw") {
    f.kind = FieldKind::kRaw;
  } else if (kind == "json") {
    f.kind = FieldKind::kJson;
    f.key = nb::cast<std::string>(d["key"]);
    const std::string dtype = nb::cast<std::string>(d["dtype"]);
    if (dtype != "float32" && dtype != "int64")
      throw InvalidArgument("Json: dtype is \"float32\" or \"int64\", not \"" + dtype + "\"");
    f.dtype = dtype == "int64" ? kInt64 : kFloat32;
    if (d.contains("default") && !d["default"].is_none()) {
      f.has_default = true;
      f.default_is_list = get<bool>(d, "default_is_list", false);
      f.default_value = nb::cast<std::vector<double>>(d["default"]);
    }
  } else if (kind == "label") {
    f.kind = FieldKind::kLabel;
  } else if (kind == "patches") {
    f.kind = FieldKind::kPatches;
    f.patches = nb::cast<std::shared_ptr<PatchProcessor>>(d["processor"]);
    f.grid_name = nb::cast<std::string>(d["grid_name"]);
    f.max_pixels = nb::cast<uint64_t>(d["max_pixels"]);
  } else if (kind == "npy") {
    f.kind = FieldKind::kNpy;
  } else {
    throw InvalidArgument("unknown field kind '" + kind + "'");
  }
  return f;
}

Options options_of(const nb::list& fields, bool skip_missing) {
  Options o;
  for (nb::handle h : fields) o.fields.push_back(field_of(nb::cast<nb::dict>(h)));
  o.skip_missing = skip_missing;
  return o;
}

// A shard's keys as a sidecar index holds them: (key, [(ext, member, data offset, size)]).
using KeyTuple =
    std::tuple<std::string, std::vector<std::tuple<std::string, std::string, uint64_t, uint64_t>>>;

using Floats = nb::ndarray<nb::numpy, float>;
using Ints = nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>;
using Rgb = nb::ndarray<const uint8_t, nb::shape<-1, -1, 3>, nb::c_contig, nb::device::cpu>;

// (rows [rows, *row_shape] float32, info [info_size] int64) of a decoded RGB image.
nb::tuple process(const DynamicImages& p, const uint8_t* rgb, int width, int height) {
  auto* rows = new std::vector<float>();
  auto* info = new std::vector<int64_t>(static_cast<size_t>(p.info_size()));
  nb::capsule own_r(rows, [](void* v) noexcept { delete static_cast<std::vector<float>*>(v); });
  nb::capsule own_i(info, [](void* v) noexcept { delete static_cast<std::vector<int64_t>*>(v); });
  std::vector<size_t> shape;
  {
    nb::gil_scoped_release release;
    const int64_t n = p.rows(height, width);
    shape.push_back(static_cast<size_t>(n));
    size_t floats = static_cast<size_t>(n);
    for (int64_t d : p.row_shape()) shape.push_back(static_cast<size_t>(d)), floats *= d;
    rows->resize(floats);
    std::vector<uint8_t> scratch;
    p.fill({rgb, static_cast<size_t>(width) * height * 3}, width, height, *rows, scratch);
    p.info(height, width, info->data());
  }
  const size_t info_size = info->size();
  return nb::make_tuple(Floats(rows->data(), shape.size(), shape.data(), own_r),
                        Ints(info->data(), 1, &info_size, own_i));
}

void bind_dynamic_images(nb::module_& m) {
  nb::class_<DynamicImages>(m, "DynamicImages",
                            "A processor whose images' tokens and pixels depend on their size "
                            "(include/stoker/image_text/dynamic_images.h).")
      .def("image_tokens", &DynamicImages::image_tokens, "height"_a, "width"_a)
      .def("rows", &DynamicImages::rows, "height"_a, "width"_a)
      .def_prop_ro("row_shape", &DynamicImages::row_shape)
      .def_prop_ro("info_name", &DynamicImages::info_name)
      .def(
          "process_bytes",
          [](const DynamicImages& p, nb::bytes data) {
            image::DecodedImage img;
            {
              const std::span<const std::byte> b(reinterpret_cast<const std::byte*>(data.c_str()),
                                                 data.size());
              nb::gil_scoped_release release;
              img = image::decode(b, image::kDefaultMaxPixels, DynamicImages::kAlpha);
            }
            return process(p, img.rgb.data(), img.width, img.height);
          },
          "data"_a,
          "Decodes an encoded image (JPEG, PNG, ...) and returns (rows, info) as numpy arrays.")
      .def(
          "process_rgb",
          [](const DynamicImages& p, Rgb rgb) {
            return process(p, rgb.data(), static_cast<int>(rgb.shape(1)),
                           static_cast<int>(rgb.shape(0)));
          },
          "rgb"_a, "(rows, info) of an HWC uint8 RGB array.");
}

void bind_patch_processor(nb::module_& m) {
  nb::class_<PatchProcessor, DynamicImages>(m, "PatchProcessor")
      .def(
          "__init__",
          [](PatchProcessor* self, int patch_size, int merge_size, int temporal_patch_size,
             int64_t min_pixels, int64_t max_pixels, double rescale_factor,
             std::array<float, 3> mean, std::array<float, 3> std) {
            new (self) PatchProcessor(PatchProcessorOptions{patch_size, merge_size,
                                                            temporal_patch_size, min_pixels,
                                                            max_pixels, rescale_factor, mean, std});
          },
          "patch_size"_a, "merge_size"_a, "temporal_patch_size"_a, "min_pixels"_a, "max_pixels"_a,
          "rescale_factor"_a, "mean"_a, "std"_a,
          "Qwen2-VL's image processor (include/stoker/image_text/patch_processor.h).")
      .def("resized_size", &PatchProcessor::resized_size, "height"_a, "width"_a,
           "smart_resize's (height, width).")
      .def(
          "grid",
          [](const PatchProcessor& p, int height, int width) {
            const PatchGrid g = p.grid(height, width);
            return nb::make_tuple(g.t, g.h, g.w);
          },
          "height"_a, "width"_a, "The (t, h, w) grid of an image of that size.")
      .def_prop_ro("patch_dim", &PatchProcessor::patch_dim)
      .def_prop_ro("max_patches", &PatchProcessor::max_patches);
}

void bind_tile_processor(nb::module_& m) {
  nb::class_<TileProcessor, DynamicImages>(m, "TileProcessor")
      .def(
          "__init__",
          [](TileProcessor* self, std::vector<std::array<int, 2>> pinpoints, int tile,
             int patch_size, int additional_tokens, bool drop_cls, double rescale_factor,
             std::array<float, 3> mean, std::array<float, 3> std) {
            new (self) TileProcessor(TileProcessorOptions{std::move(pinpoints), tile, patch_size,
                                                          additional_tokens, drop_cls,
                                                          rescale_factor, mean, std});
          },
          "pinpoints"_a, "tile"_a, "patch_size"_a, "additional_tokens"_a, "drop_cls"_a,
          "rescale_factor"_a, "mean"_a, "std"_a,
          "LLaVA-NeXT's any-resolution image processor "
          "(include/stoker/image_text/tile_processor.h).")
      .def("best_resolution", &TileProcessor::best_resolution, "height"_a, "width"_a)
      .def("resized_size", &TileProcessor::resized_size, "height"_a, "width"_a)
      .def("tiles", &TileProcessor::tiles, "height"_a, "width"_a)
      .def_prop_ro("max_tiles", &TileProcessor::max_tiles);
}

using Offsets = nb::ndarray<const uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

nb::dict vlm_stats(const VLMStats& s) {
  nb::dict d;
  d["conversations"] = s.conversations;
  d["kept"] = s.kept;
  d["skipped"] = s.skipped;
  d["skipped_reasons"] = s.skipped_reasons;
  d["tokens"] = s.tokens;
  d["image_tokens"] = s.image_tokens;
  d["images"] = s.images;
  d["padding"] = s.padding;
  return d;
}

void bind_vlm_source(nb::module_& m) {
  nb::class_<VLMSource, Source>(m, "VLMSource")
      .def(
          nb::new_([](std::shared_ptr<DocumentSet> documents, Offsets image_starts,
                      Offsets image_ids, std::shared_ptr<FileRanges> images, int64_t image_token,
                      std::shared_ptr<image::ImagePipeline> pipeline, int64_t tokens_per_image,
                      std::shared_ptr<DynamicImages> dynamic, uint64_t max_pixels, int64_t pad_id,
                      int64_t label_ignore, uint64_t seq_len, uint64_t max_length, bool skip_bad,
                      int threads, bool shuffle_conversations, bool token_types, bool mrope) {
            VLMOptions o;
            o.documents = std::move(documents);
            o.image_starts.assign(image_starts.data(), image_starts.data() + image_starts.shape(0));
            o.image_ids.assign(image_ids.data(), image_ids.data() + image_ids.shape(0));
            o.images = std::move(images);
            o.image_token = image_token;
            o.pipeline = std::move(pipeline);
            o.tokens_per_image = tokens_per_image;
            o.dynamic = std::move(dynamic);
            o.max_pixels = max_pixels;
            o.pad_id = pad_id;
            o.label_ignore = label_ignore;
            o.seq_len = seq_len;
            o.max_length = max_length;
            o.skip_bad = skip_bad;
            o.threads = threads;
            o.shuffle_conversations = shuffle_conversations;
            o.token_types = token_types;
            o.mrope = mrope;
            nb::gil_scoped_release release;
            return std::make_shared<VLMSource>(std::move(o));
          }),
          "documents"_a, "image_starts"_a, "image_ids"_a, "images"_a, "image_token"_a,
          "pipeline"_a.none(), "tokens_per_image"_a, "dynamic"_a.none(), "max_pixels"_a, "pad_id"_a,
          "label_ignore"_a, "seq_len"_a, "max_length"_a, "skip_bad"_a, "threads"_a,
          "shuffle_conversations"_a = true, "token_types"_a = false, "mrope"_a = false,
          "Conversations with images (include/stoker/image_text/vlm_source.h).")
      .def("lengths", &VLMSource::lengths, "Each sample's tokens, image tokens counted.")
      .def("documents_of", &VLMSource::documents_of, "index"_a, "seed"_a = 0, "epoch"_a = 0,
           "The conversations (documents) of sample `index` in that epoch, in order.")
      .def_prop_ro("stats", [](const VLMSource& s) { return vlm_stats(s.stats()); });
}

}  // namespace

void bind_image_text(nb::module_& parent) {
  nb::module_ m = parent.def_submodule("image_text", "Tar shards of any fields.");
  m.def(
      "member_image_sizes",
      [](const std::string& path, const std::vector<std::pair<uint64_t, uint64_t>>& members) {
        nb::gil_scoped_release release;
        return member_image_sizes(path, members);
      },
      "path"_a, "members"_a,
      "The (height, width) of each image member (data offset, size) of the local tar shard, "
      "from its header; (0, 0) where it cannot be read.");
  bind_dynamic_images(m);
  bind_patch_processor(m);
  bind_tile_processor(m);
  bind_vlm_source(m);
  nb::class_<ImageTextSource, Source>(m, "ImageTextSource")
      .def(nb::new_([](std::vector<std::string> paths, const nb::list& fields, bool skip_missing) {
             Options o = options_of(fields, skip_missing);
             nb::gil_scoped_release release;
             return std::make_shared<ImageTextSource>(std::move(paths), std::move(o));
           }),
           "paths"_a, "fields"_a, "skip_missing"_a,
           "Local tar shards whose samples hold the fields (dicts made by stoker.image_text).")
      .def_static(
          "remote",
          [](std::shared_ptr<ShardCache> cache, std::vector<std::vector<KeyTuple>> index,
             const nb::list& fields, bool skip_missing,
             std::vector<std::vector<std::tuple<uint64_t, int32_t, int32_t>>> image_sizes) {
            Options o = options_of(fields, skip_missing);
            std::vector<std::vector<TarKey>> keys(index.size());
            for (size_t s = 0; s < index.size(); ++s)
              for (auto& [key, members] : index[s]) {
                TarKey k{std::move(key), {}};
                for (auto& [ext, name, offset, size] : members)
                  k.members.push_back({std::move(ext), std::move(name), offset, size});
                keys[s].push_back(std::move(k));
              }
            nb::gil_scoped_release release;
            return std::make_shared<ImageTextSource>(std::move(cache), std::move(keys),
                                                     std::move(o), std::move(image_sizes));
          },
          "cache"_a, "index"_a, "fields"_a, "skip_missing"_a,
          "image_sizes"_a = std::vector<std::vector<std::tuple<uint64_t, int32_t, int32_t>>>{},
          "Remote tar shards: index[s] lists shard s's keys as (key, [(ext, member, data "
          "offset, size)]), from its sidecar; image_sizes[s] its image members as (data offset, "
          "height, width), ascending (a bucketed image field needs them).")
      .def_prop_ro("bucket_sizes", &ImageTextSource::bucket_sizes,
                   "The aspect-ratio buckets' (height, width); empty without a bucketed field.")
      .def_prop_ro("image_sizes", &ImageTextSource::image_sizes,
                   "Each sample's image (height, width) from its header, (0, 0) where unknown; "
                   "empty without a bucketed field.")
      .def(
          "buckets",
          [](const ImageTextSource& s) {
            std::vector<uint32_t> out(s.size());
            for (uint64_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint32_t>(s.bucket(i));
            return out;
          },
          "Each sample's aspect-ratio bucket (all 0 without a bucketed field).")
      .def_prop_ro("shard_samples", &ImageTextSource::shard_samples)
      .def("path", &ImageTextSource::path, "index"_a)
      .def(
          "member",
          [](const ImageTextSource& s, uint64_t index, size_t field) {
            if (index >= s.size()) throw nb::index_error("sample index out of range");
            std::vector<std::byte> b;
            {
              nb::gil_scoped_release release;
              b = s.member(index, field);
            }
            return nb::bytes(reinterpret_cast<const char*>(b.data()), b.size());
          },
          "index"_a, "field"_a, "The bytes of field `field`'s member of sample `index`.")
      .def("stats", [](const ImageTextSource& s) {
        nb::dict d;
        d["keys"] = s.stats().keys;
        d["skipped_keys"] = s.stats().skipped_keys;
        d["skipped_examples"] = s.stats().skipped_examples;
        return d;
      });
}

}  // namespace stoker::image_text
