// The sources wing (stoker._native.sources).
//
// Native sources: arrays (and the files mapped for them), token corpora (TokenCorpus, a
// DocumentSet) packed into sequences (PackedTokenSource), mixtures of sources.
// Image datasets: file providers (ImageFolder lists, WebDataset tar shards), and the ImageSource
// and ChannelStatsSource built on them (image.cc parses their pipelines).
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "stoker/errors.h"
#include "stoker/image/pipeline.h"
#include "stoker/mapped_file.h"
#include "stoker/sources/array.h"
#include "stoker/sources/array_documents.h"
#include "stoker/sources/document_source.h"
#include "stoker/sources/documents.h"
#include "stoker/sources/image_files.h"
#include "stoker/sources/image_source.h"
#include "stoker/sources/mixture.h"
#include "stoker/sources/npy.h"
#include "stoker/sources/packing.h"
#include "stoker/sources/token_corpus.h"

namespace stoker::python {
namespace {

using AnyArray = nb::ndarray<nb::ro, nb::device::cpu>;

DType parse_token_dtype(const std::string& name) {
  if (name == "uint16") return {DType::kUInt, 16};
  if (name == "uint32") return {DType::kUInt, 32};
  throw InvalidArgument("dtype must be \"uint16\" or \"uint32\", got \"" + name + "\"");
}

Pack parse_pack_mode(const std::string& name) {
  if (name == "concat") return Pack::kConcat;
  if (name == "document") return Pack::kDocument;
  if (name == "best_fit") return Pack::kBestFit;
  throw InvalidArgument("mode must be \"concat\", \"document\" or \"best_fit\", got \"" + name +
                        "\"");
}

const char* pack_mode_name(Pack mode) {
  switch (mode) {
    case Pack::kDocument:
      return "document";
    case Pack::kBestFit:
      return "best_fit";
    default:
      return "concat";
  }
}

// `guards[a]` is the mapping array `a` lies in, an NpyFile or a FileMapping (its reads survive
// the file being truncated), or None for memory Stoker did not map; missing entries are None.
std::shared_ptr<ArraySource> make_array_source(std::vector<AnyArray> arrays,
                                               std::vector<std::string> names,
                                               std::vector<nb::object> guards) {
  struct Owner {
    std::vector<AnyArray> arrays;
    std::vector<std::shared_ptr<const void>> files;
  };
  auto owner = std::make_shared<Owner>();
  std::vector<ArrayView> views;
  for (size_t a = 0; a < arrays.size(); ++a) {
    const AnyArray& arr = arrays[a];
    ArrayView v;
    v.data = static_cast<const std::byte*>(arr.data());
    const auto dt = arr.dtype();
    if (dt.lanes != 1) throw InvalidArgument("vector dtypes are not supported");
    v.dtype = {static_cast<DType::Code>(dt.code), dt.bits};
    const int64_t item = dt.bits / 8;
    for (size_t d = 0; d < arr.ndim(); ++d) {
      v.shape.push_back(static_cast<int64_t>(arr.shape(d)));
      v.strides.push_back(arr.stride(d) * item);
    }
    v.name = a < names.size() ? names[a] : std::to_string(a);
    if (a < guards.size() && !guards[a].is_none()) {
      // ArraySource checks that the array lies inside the mapping.
      std::shared_ptr<const void> file;
      if (nb::isinstance<NpyFile>(guards[a])) {
        auto npy = nb::cast<std::shared_ptr<const NpyFile>>(guards[a]);
        v.mapping = npy->view().mapping;
        file = std::move(npy);
      } else {
        auto mapped = nb::cast<std::shared_ptr<const MappedFile>>(guards[a]);
        v.mapping = mapped.get();
        file = std::move(mapped);
      }
      owner->files.push_back(std::move(file));
    }
    views.push_back(std::move(v));
  }
  // The source keeps the arrays (and so their Python owners) and the guarding files alive.
  owner->arrays = std::move(arrays);
  return std::make_shared<ArraySource>(std::move(views), std::move(owner));
}

// A .npy file's array: read-only NumPy over the native mapping; the array keeps `file` alive.
nb::object npy_array(const NpyFile& file) {
  const ArrayView v = file.view();
  std::vector<size_t> shape(v.shape.begin(), v.shape.end());
  std::vector<int64_t> strides;
  for (int64_t s : v.strides) strides.push_back(s / static_cast<int64_t>(v.dtype.bytes()));
  const nb::dlpack::dtype dtype{static_cast<uint8_t>(v.dtype.code), v.dtype.bits, 1};
  return nb::ndarray<nb::numpy, nb::ro>(v.data, shape.size(), shape.data(), nb::find(&file),
                                        strides.data(), dtype, nb::device::cpu::value)
      .cast();
}

// The bytes of a mapped file: a read-only uint8 array over the mapping, which keeps `file` alive.
nb::object file_bytes(const MappedFile& file) {
  const std::span<const std::byte> bytes = file.bytes();
  const size_t shape[1] = {bytes.size()};
  return nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(bytes.data(), 1, shape, nb::find(&file))
      .cast();
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

// Field f's shape for sample `index`: a ragged field's first dimension is the sample's length, a
// bucketed field's shape its bucket's.
std::vector<int64_t> sample_shape(const Source& src, size_t f, uint64_t index) {
  const FieldSpec& spec = src.fields()[f];
  if (!spec.bucket_shapes.empty()) return spec.bucket_shapes[src.bucket(index)];
  std::vector<int64_t> shape = spec.shape;
  if (spec.ragged) shape[0] = static_cast<int64_t>(src.group_length(index, spec.ragged_group));
  return shape;
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
  for (size_t f = 0; f < out.size(); ++f) {
    size_t bytes = src.fields()[f].dtype.bytes();  // the sample's own rows, or its bucket's
    for (int64_t d : sample_shape(src, f, index)) bytes *= static_cast<size_t>(d);
    result.append(nb::bytes(reinterpret_cast<const char*>(slots[f]), bytes));
  }
  return result;
}

// Document d of a corpus as a new int64 array (for tests and inspection; the packers read
// documents natively).
nb::object read_document(const DocumentSet& docs, uint64_t d) {
  if (d >= docs.num_documents()) throw nb::index_error("document index out of range");
  auto* v = new std::vector<int64_t>(docs.document_length(d));
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  {
    nb::gil_scoped_release release;
    docs.read(d, 0, v->size(), v->data());
  }
  return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(v->data(), {v->size()}, owner).cast();
}

const char* format_name(TokenCorpus::Format f) {
  switch (f) {
    case TokenCorpus::Format::kLlmc:
      return "llm.c";
    case TokenCorpus::Format::kNpy:
      return "npy";
    case TokenCorpus::Format::kMegatron:
      return "megatron";
    default:
      return "raw";
  }
}

}  // namespace

void register_sources(nb::module_& m) {
  nb::class_<Source>(m, "Source")
      .def("__len__", &Source::size)
      .def_prop_ro("field_names",
                   [](const Source& s) {
                     std::vector<std::string> names;
                     for (const auto& f : s.fields()) names.push_back(f.name);
                     return names;
                   })
      .def(
          "labels",
          [](const Source& s) -> nb::object {
            auto* v = new std::vector<int64_t>(s.labels());
            if (v->empty()) {
              delete v;
              return nb::none();
            }
            nb::capsule owner(
                v, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
            return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(v->data(), {v->size()}, owner)
                .cast();
          },
          "Every sample's class label when the source knows them without reading (an int64 "
          "array), else None.")
      .def(
          "blocks",
          [](const Source& s) {
            Source::Blocks b = s.blocks();
            return std::make_pair(std::move(b.sizes), b.window);
          },
          "(sizes, window) of the blocks a shuffled loader keeps together (Parquet row groups); "
          "sizes empty when the source has none.")
      .def("shards", &Source::shards,
           "The sizes of the source's shards (consecutive samples, fetched whole by a remote "
           "reader), for shuffle=\"shards\"; empty when it has none.")
      .def_prop_ro("field_dtypes",
                   [](const Source& s) {
                     std::vector<std::string> out;
                     for (const auto& f : s.fields()) out.push_back(f.dtype.name());
                     return out;
                   })
      .def_prop_ro("field_shapes",
                   [](const Source& s) {
                     std::vector<std::vector<int64_t>> out;
                     for (const auto& f : s.fields()) out.push_back(f.shape);
                     return out;
                   })
      .def_prop_ro(
          "field_ragged",
          [](const Source& s) {
            std::vector<bool> out;
            for (const auto& f : s.fields()) out.push_back(f.ragged);
            return out;
          },
          "Whether each field is variable-length (its first dimension the sample's length).")
      .def_prop_ro(
          "lengths_names", [](const Source& s) { return ragged_lengths_names(s.fields()); },
          "The fields the engine adds to a batch for the ragged groups: \"lengths\", then "
          "\"<field>_lengths\" for each further group.")
      .def(
          "lengths",
          [](const Source& s) {
            auto* v = new std::vector<int64_t>(s.size());
            {
              nb::gil_scoped_release release;
              for (uint64_t i = 0; i < v->size(); ++i) (*v)[i] = static_cast<int64_t>(s.length(i));
            }
            nb::capsule owner(
                v, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
            return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(v->data(), {v->size()}, owner);
          },
          "Every sample's length along its ragged fields (an int64 array), read without the "
          "samples; zeros for a source without ragged fields.")
      .def("path", &Source::path, nb::arg("index"),
           "What sample `index` is read from, as errors name it (a file); empty when nothing.")
      .def(
          "sample_shapes",
          [](const Source& s, uint64_t index) {
            if (index >= s.size()) throw nb::index_error("sample index out of range");
            std::vector<std::vector<int64_t>> out;
            for (size_t f = 0; f < s.fields().size(); ++f) out.push_back(sample_shape(s, f, index));
            return out;
          },
          nb::arg("index"),
          "Each field's shape for sample `index` (a ragged field's first dimension its length, a "
          "bucketed field's its bucket's), known without reading it.")
      .def("sample", &read_sample, nb::arg("index"), nb::arg("seed"), nb::arg("epoch"),
           "Sample `index` read with (seed, epoch)'s randomness: one bytes object per field.");

  nb::class_<ArraySource, Source>(m, "ArraySource")
      .def(nb::new_(&make_array_source), nb::arg("arrays"), nb::arg("names"),
           nb::arg("guards") = std::vector<nb::object>{});

  nb::class_<MixtureSource, Source>(m, "MixtureSource")
      .def(nb::new_([](const std::vector<std::shared_ptr<Source>>& sources,
                       std::vector<std::string> names) {
             return std::make_shared<MixtureSource>(
                 std::vector<std::shared_ptr<const Source>>(sources.begin(), sources.end()),
                 std::move(names));
           }),
           nb::arg("sources"), nb::arg("names"),
           "The sources end to end (include/stoker/sources/mixture.h); the same fields each.")
      .def_prop_ro("sizes", &MixtureSource::sizes)
      .def(
          "locate",
          [](const MixtureSource& s, uint64_t index) {
            if (index >= s.size())
              throw nb::index_error(("index " + std::to_string(index) + " out of range for " +
                                     std::to_string(s.size()) + " samples")
                                        .c_str());
            return s.locate(index);
          },
          nb::arg("index"), "(source, its sample) of global sample `index`.");

  // Abstract: the packers' bindings take any DocumentSet as std::shared_ptr<const DocumentSet>.
  nb::class_<DocumentSet>(m, "DocumentSet",
                          "Token documents (a corpus of shards): the input of the token packers.")
      .def_prop_ro("num_documents", &DocumentSet::num_documents)
      .def_prop_ro("num_tokens", &DocumentSet::num_tokens)
      .def(
          "document_length",
          [](const DocumentSet& docs, uint64_t d) {
            if (d >= docs.num_documents()) throw nb::index_error("document index out of range");
            return docs.document_length(d);
          },
          nb::arg("d"))
      .def("document", &read_document, nb::arg("d"),
           "Document d's tokens: a new int64 array (ids checked against the vocabulary).");

  nb::class_<TokenCorpus, DocumentSet>(
      m, "TokenCorpus",
      "Token shards (raw, llm.c, .npy token files; Megatron .bin/.idx pairs) as one set of "
      "documents numbered across them.")
      .def(nb::new_([](const std::vector<std::string>& paths, const std::string& dtype,
                       std::optional<uint64_t> split_at, uint64_t vocab_size) {
             const DType token_dtype = parse_token_dtype(dtype);
             nb::gil_scoped_release release;  // split_at scans every token of flat shards
             return std::make_shared<TokenCorpus>(paths, token_dtype, split_at, vocab_size);
           }),
           nb::arg("paths"), nb::arg("dtype"), nb::arg("split_at").none() = nb::none(),
           nb::arg("vocab_size") = 0)
      .def_prop_ro("num_shards", &TokenCorpus::num_shards)
      .def_prop_ro("shard_paths",
                   [](const TokenCorpus& c) {
                     std::vector<std::string> out;
                     for (uint64_t s = 0; s < c.num_shards(); ++s) out.push_back(c.shard_path(s));
                     return out;
                   })
      .def_prop_ro(
          "formats",
          [](const TokenCorpus& c) {
            std::vector<std::string> out;
            for (uint64_t s = 0; s < c.num_shards(); ++s)
              out.push_back(format_name(c.shard_format(s)));
            return out;
          },
          "Per shard: \"raw\", \"llm.c\", \"npy\" or \"megatron\".")
      .def_prop_ro("vocab_size", &TokenCorpus::vocab_size)
      .def(
          "document_start",
          [](const TokenCorpus& c, uint64_t d) {
            if (d > c.num_documents()) throw nb::index_error("document index out of range");
            return c.document_start(d);
          },
          nb::arg("d"))
      .def(
          "document_at",
          [](const TokenCorpus& c, uint64_t token) {
            if (token >= c.num_tokens()) throw nb::index_error("token position out of range");
            return c.document_at(token);
          },
          nb::arg("token"));

  nb::class_<ArrayDocuments, DocumentSet>(
      m, "ArrayDocuments",
      "The rows of a list column as documents: `values` (every row's ids, any integer type) "
      "and `offsets` (int32 or int64, rows + 1), read in place.")
      .def(nb::new_(
               [](AnyArray values, AnyArray offsets, const std::string& name, uint64_t vocab_size) {
                 const auto one_d = [&](const AnyArray& a, const char* what) {
                   if (a.ndim() != 1 || (a.shape(0) > 1 && a.stride(0) != 1))
                     throw InvalidArgument(name + ": " + what + " must be a contiguous 1-d array");
                   if (a.dtype().lanes != 1) throw InvalidArgument(name + ": vector dtypes");
                   return DType{static_cast<DType::Code>(a.dtype().code), a.dtype().bits};
                 };
                 const DType vt = one_d(values, "values"), ot = one_d(offsets, "offsets");
                 if (offsets.shape(0) == 0)
                   throw InvalidArgument(name + ": offsets need rows + 1 entries, got none");
                 auto owner = std::make_shared<std::pair<AnyArray, AnyArray>>(values, offsets);
                 return std::make_shared<ArrayDocuments>(values.data(), vt, values.shape(0),
                                                         offsets.data(), ot, offsets.shape(0) - 1,
                                                         name, vocab_size, owner);
               }),
           nb::arg("values"), nb::arg("offsets"), nb::arg("name"), nb::arg("vocab_size") = 0);

  m.def(
      "image_pixels",
      [](std::shared_ptr<ImageFiles> files, int threads, uint64_t max_pixels) {
        std::vector<uint64_t> pixels;
        {
          nb::gil_scoped_release release;
          pixels = image_pixels(*files, threads, max_pixels);
        }
        return to_array(std::move(pixels));
      },
      nb::arg("files"), nb::arg("threads"), nb::arg("max_pixels") = image::kDefaultMaxPixels,
      "Each image's width x height from its header (a uint64 array; 0 where unreadable).");

  nb::class_<DocumentSource, Source>(
      m, "DocumentSource",
      "A DocumentSet's documents as variable-length samples: input_ids and labels (the next "
      "token of the same document), ragged. See stoker/sources/document_source.h.")
      .def(nb::new_([](std::shared_ptr<DocumentSet> documents, int64_t pad_id, int64_t label_ignore,
                       uint64_t max_length) {
             nb::gil_scoped_release release;  // O(documents)
             return std::make_shared<DocumentSource>(std::move(documents), pad_id, label_ignore,
                                                     max_length);
           }),
           nb::arg("documents"), nb::arg("pad_id") = 0, nb::arg("label_ignore") = -100,
           nb::arg("max_length") = 0);

  nb::class_<PackedTokenSource, Source>(
      m, "PackedTokenSource",
      "Training sequences of seq_len tokens from a DocumentSet: \"concat\" windows (input, "
      "target), or \"document\" windows / \"best_fit\" bins (input_ids, labels, position_ids, "
      "cu_seqlens, max_seqlen[, loss_mask]). See stoker/sources/packing.h.")
      .def(nb::new_([](std::shared_ptr<DocumentSet> documents, const std::string& mode,
                       uint64_t seq_len, std::optional<int64_t> eos, bool shuffle_documents,
                       int64_t label_ignore, bool loss_mask, uint64_t max_segments) {
             PackOptions o;
             o.mode = parse_pack_mode(mode);
             o.seq_len = seq_len;
             o.eos = eos;
             o.shuffle_documents = shuffle_documents;
             o.label_ignore = label_ignore;
             o.loss_mask = loss_mask;
             o.max_segments = max_segments;
             nb::gil_scoped_release release;  // O(documents), or O(pieces log L) for best_fit
             return std::make_shared<PackedTokenSource>(std::move(documents), o);
           }),
           nb::arg("documents"), nb::arg("mode"), nb::arg("seq_len"),
           nb::arg("eos").none() = nb::none(), nb::arg("shuffle_documents") = false,
           nb::arg("label_ignore") = -100, nb::arg("loss_mask") = false,
           nb::arg("max_segments") = 0)
      .def_prop_ro("mode", [](const PackedTokenSource& s) { return pack_mode_name(s.mode()); })
      .def_prop_ro("seq_len", &PackedTokenSource::seq_len)
      .def_prop_ro("max_segments", &PackedTokenSource::max_segments)
      .def_prop_ro("padded_tokens", &PackedTokenSource::padded_tokens,
                   "Padding tokens per epoch (the same every epoch).")
      .def_prop_ro("padding_fraction", &PackedTokenSource::padding_fraction)
      .def_prop_ro("num_pieces", &PackedTokenSource::num_pieces)
      .def_prop_ro("samples_per_shard", &PackedTokenSource::samples_per_shard,
                   "Concat over a TokenCorpus: the samples whose first token is in each shard.");

  nb::class_<NpyFile>(m, "NpyFile",
                      "A .npy file mapped read-only (Stoker's own header parser). Pass it as an "
                      "ArraySource guard so that reads survive the file being truncated.")
      .def(nb::init<const std::string&>(), nb::arg("path"))
      .def_prop_ro("path", &NpyFile::path)
      .def_prop_ro("array", &npy_array,
                   "The file's array: read-only, over the mapping (reading it from Python is not "
                   "guarded).");

  nb::class_<MappedFile>(
      m, "FileMapping",
      "A whole file mapped read-only by Stoker. Arrays rebuilt over its bytes "
      "(a file NumPy mapped, mapped again) pass it as their ArraySource guard, so "
      "that reads survive the file being truncated.")
      .def(nb::new_([](const std::string& path) {
             return std::make_shared<MappedFile>(path,
                                                 path.ends_with(".npy") ? ".npy file" : "file");
           }),
           nb::arg("path"))
      .def_prop_ro("path", &MappedFile::path)
      .def_prop_ro("bytes", &file_bytes,
                   "The file's bytes as mapped: a read-only uint8 array (reading it from Python is "
                   "not guarded).");

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

  using U32 = nb::ndarray<const uint32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  using U64 = nb::ndarray<const uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
  nb::class_<FileRanges, ImageFiles>(m, "FileRanges")
      .def(nb::new_([](std::vector<std::string> files, U32 file, U64 offset, U64 size,
                       std::vector<std::string> names) {
             const size_t n = file.shape(0);
             if (offset.shape(0) != n || size.shape(0) != n)
               throw InvalidArgument("FileRanges: file, offset and size differ in length");
             std::vector<FileRanges::Range> ranges(n);
             for (size_t i = 0; i < n; ++i) ranges[i] = {file(i), offset(i), size(i)};
             return std::make_shared<FileRanges>(std::move(files), std::move(ranges),
                                                 std::move(names));
           }),
           nb::arg("files"), nb::arg("file"), nb::arg("offset"), nb::arg("size"), nb::arg("names"),
           "Byte ranges of files as images (include/stoker/sources/image_files.h); a size of "
           "2**64 - 1 is the whole file.");

  nb::class_<TarShardFiles, ImageFiles>(m, "TarShardFiles")
      .def(nb::new_([](std::vector<std::string> paths, const std::string& media) {
             if (media != "images" && media != "videos")
               throw InvalidArgument("TarShardFiles: media is \"images\" or \"videos\"");
             nb::gil_scoped_release release;
             return std::make_shared<TarShardFiles>(
                 std::move(paths), media == "videos" ? TarMedia::kVideos : TarMedia::kImages);
           }),
           nb::arg("paths"), nb::arg("media") = "images")
      .def_prop_ro("num_shards", &TarShardFiles::num_shards);

  nb::class_<ImageSource, Source>(m, "ImageSource")
      .def(nb::new_([](std::shared_ptr<ImageFiles> files, const nb::list& spec, uint64_t max_pixels,
                       const std::string& alpha) {
             return std::make_shared<ImageSource>(
                 std::move(files), make_pipeline(spec, max_pixels, parse_alpha(alpha)));
           }),
           nb::arg("files"), nb::arg("pipeline"), nb::arg("max_pixels"), nb::arg("alpha") = "drop")
      .def_prop_ro("image_shape", [](const ImageSource& s) { return s.fields()[0].shape; })
      .def_prop_ro("image_dtype", [](const ImageSource& s) { return s.fields()[0].dtype.name(); })
      .def_prop_ro("image_layout", [](const ImageSource& s) {
        return s.layout() == image::Layout::kCHW ? "CHW" : "HWC";
      });

  nb::class_<ChannelStatsSource, Source>(m, "ChannelStatsSource")
      .def(nb::new_([](std::shared_ptr<ImageFiles> files, uint64_t max_pixels) {
             return std::make_shared<ChannelStatsSource>(std::move(files), max_pixels);
           }),
           nb::arg("files"), nb::arg("max_pixels"));
}

}  // namespace stoker::python
