#include "stoker/image_text/image_text_source.h"

#include <simdjson.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>

#include "stoker/errors.h"
#include "stoker/image/decode.h"
#include "stoker/image/pipeline.h"
#include "stoker/image_text/patch_processor.h"
#include "stoker/random.h"
#include "stoker/sources/image_files.h"
#include "stoker/sources/image_source.h"
#include "stoker/sources/npy.h"
#include "stoker/text/tokenizer.h"

namespace stoker::image_text {
namespace {

constexpr size_t kSkippedListed = 8;

struct ImageTextWorkerState final : WorkerState {
  std::vector<std::byte> buffer;
  image::ImageScratch scratch;
  std::vector<uint8_t> resized;  // a kPatches field's resized image
  simdjson::dom::parser parser;
};

std::string exts_text(const std::vector<std::string>& exts) {
  std::string s;
  for (size_t i = 0; i < exts.size(); ++i) {
    if (i > 0) s += i + 1 == exts.size() ? " or " : ", ";
    s += "." + exts[i];
  }
  return s;
}

std::string_view as_text(const std::vector<std::byte>& b) {
  return {reinterpret_cast<const char*>(b.data()), b.size()};
}

const char* kind_name(FieldKind k) {
  switch (k) {
    case FieldKind::kImage:
      return "Image";
    case FieldKind::kText:
    case FieldKind::kRaw:
      return "Text";
    case FieldKind::kJson:
      return "Json";
    case FieldKind::kLabel:
      return "Label";
    case FieldKind::kNpy:
      return "Npy";
    case FieldKind::kPatches:
      return "Image";
  }
  return "?";
}

// The value at dotted path `key` of a JSON object; false where absent or null.
bool find_value(simdjson::dom::element doc, const std::string& key, simdjson::dom::element* out) {
  simdjson::dom::element cur = doc;
  size_t pos = 0;
  for (;;) {
    const size_t dot = key.find('.', pos);
    const std::string_view part(key.data() + pos,
                                (dot == std::string::npos ? key.size() : dot) - pos);
    simdjson::dom::object o;
    if (cur.get(o) != simdjson::SUCCESS) return false;
    if (o.at_key(part).get(cur) != simdjson::SUCCESS) return false;
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  if (cur.is_null()) return false;
  *out = cur;
  return true;
}

// A JSON number as `dtype`; InvalidArgument naming the key where it is not one (or, for int64,
// not an integer).
void put_number(simdjson::dom::element v, DType dtype, const std::string& key, std::byte* dst) {
  if (dtype == kInt64) {
    int64_t i = 0;
    if (v.get(i) != simdjson::SUCCESS)
      throw InvalidArgument("JSON value '" + key + "' is " + simdjson::minify(v) +
                            ", not an integer (the field is int64)");
    std::memcpy(dst, &i, sizeof i);
    return;
  }
  double d = 0;
  if (v.get(d) != simdjson::SUCCESS)
    throw InvalidArgument("JSON value '" + key + "' is " + simdjson::minify(v) + ", not a number");
  const float f = static_cast<float>(d);
  std::memcpy(dst, &f, sizeof f);
}

void put_default(const FieldOptions& f, size_t i, std::byte* dst) {
  const double d = f.default_value[i];
  if (f.dtype == kInt64) {
    const auto v = static_cast<int64_t>(d);
    std::memcpy(dst, &v, sizeof v);
  } else {
    const auto v = static_cast<float>(d);
    std::memcpy(dst, &v, sizeof v);
  }
}

// The first bytes of an image member read for its header; the whole member where they do not
// hold it (a JPEG with large metadata before its frame header).
constexpr uint64_t kHeaderBytes = 16 * 1024;

// The size of an image whose first bytes (or all of them, `whole`) are `head`; {0, 0} where the
// header cannot be read. `again` is set where more bytes may hold it.
ImageSize header_size(std::span<const std::byte> head, bool whole, bool* again) {
  *again = false;
  try {
    const image::ImageInfo info = image::read_info(head);
    return {info.height, info.width};
  } catch (const Error&) {
    *again = !whole;
  }
  return {0, 0};
}

// The size of the image member (offset, size) of shard `shard` of `tars`, from its header.
ImageSize member_size(const TarShardSet& tars, size_t shard, uint64_t offset, uint64_t size,
                      const std::string& what, std::vector<std::byte>& buffer) {
  const uint64_t head = std::min(size, kHeaderBytes);
  tars.read(shard, offset, head, buffer, what);
  bool again = false;
  ImageSize got = header_size(buffer, head == size, &again);
  if (again) {
    tars.read(shard, offset, size, buffer, what);
    got = header_size(buffer, true, &again);
  }
  return got;
}

// The CoverCrop a bucket's pipeline starts with.
const image::CoverCrop* cover_of(const image::ImagePipeline& p) {
  return p.transforms().empty() ? nullptr : std::get_if<image::CoverCrop>(&p.transforms()[0]);
}

}  // namespace

std::vector<ImageSize> member_image_sizes(
    const std::string& path, const std::vector<std::pair<uint64_t, uint64_t>>& members) {
  const TarShardSet tars({path});
  std::vector<ImageSize> out;
  out.reserve(members.size());
  std::vector<std::byte> buffer;
  for (const auto& [offset, size] : members)
    out.push_back(member_size(tars, 0, offset, size, path, buffer));
  return out;
}

ImageTextSource::ImageTextSource(std::vector<std::string> shard_paths, Options options)
    : options_(std::move(options)) {
  if (shard_paths.size() > std::numeric_limits<uint32_t>::max())
    throw InvalidArgument("too many tar shards");
  check_options();
  tars_ = std::make_unique<TarShardSet>(std::move(shard_paths));
  index({});
  plan_fields();
  plan_lengths();
  plan_buckets({});
}

ImageTextSource::ImageTextSource(
    std::shared_ptr<ShardCache> cache, std::vector<std::vector<TarKey>> keys, Options options,
    std::vector<std::vector<std::tuple<uint64_t, int32_t, int32_t>>> image_sizes)
    : options_(std::move(options)) {
  check_options();
  tars_ = std::make_unique<TarShardSet>(std::move(cache));
  if (keys.size() != tars_->size())
    throw InvalidArgument("ImageTextSource: an index for " + std::to_string(keys.size()) +
                          " shards, a cache of " + std::to_string(tars_->size()));
  for (size_t s = 0; s < keys.size(); ++s) {
    const uint64_t size = *tars_->remote_size(s);
    for (const TarKey& k : keys[s])
      for (const TarEntry& e : k.members)
        if (e.offset > size || e.size > size - e.offset)
          throw InvalidArgument("the index of tar shard " + tars_->path(s) + " puts member '" +
                                e.name + "' past the shard's " + std::to_string(size) +
                                " bytes: the index is stale (rebuild it with `stoker index`)");
  }
  index(std::move(keys));
  plan_fields();
  if (ragged_ != SIZE_MAX)
    throw InvalidArgument("Text field '" + options_.fields[ragged_].name +
                          "': variable-length captions need every caption's length, read from "
                          "local shards; pad remote captions to a length");
  if (bucketed_ != SIZE_MAX && image_sizes.size() != tars_->size())
    throw InvalidArgument("ImageTextSource: image sizes for " + std::to_string(image_sizes.size()) +
                          " shards, a cache of " + std::to_string(tars_->size()) +
                          " (the bucketed field '" + options_.fields[bucketed_].name +
                          "' needs the images' sizes from the shards' sidecars)");
  plan_buckets(image_sizes);
}

std::vector<int32_t> ImageTextSource::caption_ids(size_t field, std::string_view text) const {
  const FieldOptions& o = options_.fields[field];
  const std::vector<int32_t> content = o.tokenizer->encode(text, false);
  const Framing& fr = framing_[field];
  const size_t specials = fr.prefix.size() + fr.suffix.size();
  size_t keep = content.size();
  if (o.max_length > 0 && keep + specials > o.max_length) {
    if (!o.truncation)
      throw InvalidArgument("a caption of " + std::to_string(keep + specials) +
                            " tokens, longer than max_length=" + std::to_string(o.max_length) +
                            " (truncation=False)");
    keep = o.max_length - specials;
  }
  std::vector<int32_t> ids(fr.prefix);
  ids.insert(ids.end(), content.begin(), content.begin() + static_cast<ptrdiff_t>(keep));
  ids.insert(ids.end(), fr.suffix.begin(), fr.suffix.end());
  return ids;
}

void ImageTextSource::for_each_sample(
    const std::function<void(uint64_t, std::vector<std::byte>&)>& fn) const {
  const size_t threads = std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  std::vector<std::thread> pool;
  std::atomic<uint64_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&] {
      std::vector<std::byte> buffer;
      for (uint64_t i; (i = next.fetch_add(1)) < samples_.size();) {
        try {
          fn(i, buffer);
        } catch (...) {
          std::lock_guard lock(mu);
          if (!error) error = std::current_exception();
          next = samples_.size();  // the others stop too
          return;
        }
      }
    });
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

void ImageTextSource::plan_lengths() {
  if (ragged_ == SIZE_MAX) return;
  lengths_.assign(samples_.size(), 0);
  for_each_sample([&](uint64_t i, std::vector<std::byte>& buffer) {
    const Span& sp = span(i, ragged_);
    tars_->read(samples_[i].shard, sp.offset, sp.size, buffer, path(i));
    try {
      lengths_[i] = static_cast<uint32_t>(caption_ids(ragged_, as_text(buffer)).size());
    } catch (const Error&) {
      lengths_[i] = 0;  // a caption the read reports (not UTF-8, too long)
    }
  });
  // The fields' first dimension: the cap, or the longest caption.
  uint32_t longest = 1;
  for (uint32_t l : lengths_) longest = std::max(longest, l);
  const FieldOptions& o = options_.fields[ragged_];
  for (size_t k = 0; k < 2; ++k)
    fields_[first_slot_[ragged_] + k].shape = {o.max_length > 0 ? int64_t{o.max_length} : longest};
}

void ImageTextSource::check_options() {
  if (options_.fields.empty()) throw InvalidArgument("ImageTextSource needs at least one field");
  std::set<std::string> names;
  int patch_fields = 0;
  for (FieldOptions& f : options_.fields) {
    const std::string who = std::string(kind_name(f.kind)) + " field '" + f.name + "'";
    if (f.exts.empty()) throw InvalidArgument(who + " has no member extension");
    for (std::string& e : f.exts)
      for (char& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!names.insert(f.name).second) throw InvalidArgument("two fields named '" + f.name + "'");
    if (f.kind == FieldKind::kImage && !f.bucket_pipelines.empty()) {
      if (bucketed_ != SIZE_MAX)
        throw InvalidArgument(who + ": one Image field at most is in aspect-ratio buckets");
      bucketed_ = static_cast<size_t>(&f - options_.fields.data());
      for (const auto& p : f.bucket_pipelines) {
        const image::CoverCrop* c = p ? cover_of(*p) : nullptr;
        if (c == nullptr)
          throw InvalidArgument(who + ": each bucket's pipeline starts with a CoverCrop");
        if (p->height() != c->height || p->width() != c->width)
          throw InvalidArgument(who + ": the transforms after the bucket's resize and crop to " +
                                std::to_string(c->height) + "x" + std::to_string(c->width) +
                                " change its size to " + std::to_string(p->height()) + "x" +
                                std::to_string(p->width()) + "; keep size-changing ones out");
        if (p->dtype() != f.bucket_pipelines[0]->dtype() ||
            p->layout() != f.bucket_pipelines[0]->layout())
          throw InvalidArgument(who + ": the buckets' pipelines differ in dtype or layout");
      }
      for (const std::string* n : {&f.sizes_name, &f.crops_name})
        if (!names.insert(*n).second) throw InvalidArgument("two fields named '" + *n + "'");
      if (ragged_ != SIZE_MAX)
        throw InvalidArgument(who +
                              ": images in buckets and variable-length captions do not "
                              "batch together; pad the captions to a length");
    } else if (f.kind == FieldKind::kImage && !f.pipeline) {
      throw InvalidArgument(who + " needs a pipeline");
    }
    if (f.kind == FieldKind::kPatches) {
      if (!f.patches) throw InvalidArgument(who + " needs a patch processor");
      if (!names.insert(f.grid_name).second)
        throw InvalidArgument("two fields named '" + f.grid_name + "'");
      if (++patch_fields > 1)
        throw InvalidArgument(who +
                              ": one field of patches per dataset (its patch count is the "
                              "sample's length)");
    }
    if (f.kind == FieldKind::kText) {
      if (!f.tokenizer) throw InvalidArgument(who + " needs a tokenizer");
      if (f.max_length == 0 && !f.ragged)
        throw InvalidArgument(who + ": max_length must be at least 1");
      if (f.ragged) {
        if (ragged_ != SIZE_MAX)
          throw InvalidArgument(who + ": one Text field at most is variable-length");
        if (bucketed_ != SIZE_MAX)
          throw InvalidArgument(who +
                                ": images in buckets and variable-length captions do not "
                                "batch together; pad the captions to a length");
        ragged_ = static_cast<size_t>(&f - options_.fields.data());
      }
      if (!names.insert(f.mask_name).second)
        throw InvalidArgument("two fields named '" + f.mask_name + "'");
    }
    if (f.kind == FieldKind::kJson) {
      if (f.key.empty()) throw InvalidArgument(who + " needs a key");
      if (!(f.dtype == kInt64 || f.dtype == kFloat32))
        throw InvalidArgument(who + ": dtype is float32 or int64");
    }
  }
  if (patch_fields > 0 && bucketed_ != SIZE_MAX)
    throw InvalidArgument(
        "a field of Qwen2-VL patches is variable-length: not with images in aspect-ratio "
        "buckets in one dataset");
}

ImageTextSource::~ImageTextSource() = default;

void ImageTextSource::index(std::vector<std::vector<TarKey>> keys) {
  const size_t nf = options_.fields.size();
  shard_samples_.reserve(tars_->size());
  for (uint32_t s = 0; s < tars_->size(); ++s) {
    uint64_t kept = 0;
    const std::vector<TarKey> shard_keys = keys.empty() ? tars_->index(s) : std::move(keys[s]);
    for (const TarKey& k : shard_keys) {
      // Per field, its member: the first of the field's extensions the key has.
      std::vector<const TarEntry*> chosen(nf, nullptr);
      bool any = false;
      for (size_t f = 0; f < nf; ++f) {
        for (const std::string& ext : options_.fields[f].exts) {
          auto it = std::find_if(k.members.begin(), k.members.end(),
                                 [&](const TarEntry& e) { return e.ext == ext; });
          if (it != k.members.end()) {
            chosen[f] = &*it;
            break;
          }
        }
        any = any || chosen[f] != nullptr;
      }
      if (!any) continue;  // a stray member: no field's extension
      ++stats_.keys;
      std::string missing;
      for (size_t f = 0; f < nf; ++f)
        if (chosen[f] == nullptr)
          missing += std::string(missing.empty() ? "" : "; ") + "no " +
                     exts_text(options_.fields[f].exts) + " member (field '" +
                     options_.fields[f].name + "')";
      if (!missing.empty()) {
        const std::string what = tars_->path(s) + ":" + k.key + ": " + missing;
        if (!options_.skip_missing)
          throw InvalidArgument("tar shard " + tars_->path(s) + ": key '" + k.key + "' has " +
                                missing + " (missing=\"skip\" leaves such keys out)");
        ++stats_.skipped_keys;
        if (stats_.skipped_examples.size() < kSkippedListed)
          stats_.skipped_examples.push_back(what);
        continue;
      }
      samples_.push_back({s, k.key});
      for (size_t f = 0; f < nf; ++f) spans_.push_back({chosen[f]->offset, chosen[f]->size});
      ++kept;
    }
    shard_samples_.push_back(kept);
  }
}

void ImageTextSource::plan_fields() {
  const size_t nf = options_.fields.size();
  first_slot_.resize(nf);
  framing_.resize(nf);
  json_shape_.resize(nf);
  npy_dtype_.resize(nf);
  npy_shape_.resize(nf);
  auto first_member = [&](size_t f) {
    if (samples_.empty())
      throw InvalidArgument(std::string(kind_name(options_.fields[f].kind)) + " field '" +
                            options_.fields[f].name +
                            "' takes its shape from the first sample, and the shards have none");
    return member(0, f);
  };
  for (size_t f = 0; f < nf; ++f) {
    const FieldOptions& o = options_.fields[f];
    first_slot_[f] = fields_.size();
    switch (o.kind) {
      case FieldKind::kImage: {
        if (o.bucket_pipelines.empty()) {
          const auto shape = o.pipeline->output_shape();
          fields_.push_back({o.name, to_dtype(o.pipeline->dtype()), {shape.begin(), shape.end()}});
          break;
        }
        FieldSpec spec{o.name, to_dtype(o.bucket_pipelines[0]->dtype()), {0, 0, 0}};
        for (const auto& p : o.bucket_pipelines) {
          const auto shape = p->output_shape();
          spec.bucket_shapes.emplace_back(shape.begin(), shape.end());
          for (size_t d = 0; d < 3; ++d) spec.shape[d] = std::max(spec.shape[d], shape[d]);
          const image::CoverCrop& c = *cover_of(*p);
          bucket_sizes_.push_back({c.height, c.width});
        }
        fields_.push_back(std::move(spec));
        fields_.push_back({o.sizes_name, kInt64, {2}});
        fields_.push_back({o.crops_name, kInt64, {2}});
        break;
      }
      case FieldKind::kText: {
        const int64_t n = o.max_length;  // ragged: set by plan_lengths()
        FieldSpec ids{o.name, kInt64, {n}}, mask{o.mask_name, kInt64, {n}};
        ids.ragged = mask.ragged = o.ragged;
        ids.pad_value = static_cast<double>(o.pad_id);
        fields_.push_back(std::move(ids));
        fields_.push_back(std::move(mask));
        if (!o.add_special_tokens) break;
        // The specials the post-processor puts around a single text: encode(t, true) is
        // prefix + encode(t, false) + suffix for the processors that frame a text.
        const std::vector<int32_t> specials = o.tokenizer->encode("", true);
        if (specials.empty()) break;
        bool found = false;
        for (const char* probe : {"a", "hello", "0", "x y"}) {
          std::vector<int32_t> full, content;
          try {
            full = o.tokenizer->encode(probe, true);
            content = o.tokenizer->encode(probe, false);
          } catch (const Error&) {
            continue;
          }
          if (content.empty() || full.size() != content.size() + specials.size()) continue;
          auto it = std::search(full.begin(), full.end(), content.begin(), content.end());
          if (it == full.end()) continue;
          const size_t p = static_cast<size_t>(it - full.begin());
          Framing fr{{full.begin(), it}, {it + static_cast<ptrdiff_t>(content.size()), full.end()}};
          std::vector<int32_t> joined = fr.prefix;
          joined.insert(joined.end(), fr.suffix.begin(), fr.suffix.end());
          if (joined != specials || p > specials.size()) continue;
          framing_[f] = std::move(fr);
          found = true;
          break;
        }
        if (!found)
          throw InvalidArgument("Text field '" + o.name +
                                "': the tokenizer's post-processor does not put its special "
                                "tokens before and after a text; pass add_special_tokens=False");
        if (o.max_length > 0 && specials.size() >= o.max_length)
          throw InvalidArgument(
              "Text field '" + o.name + "': max_length=" + std::to_string(o.max_length) +
              " leaves no room besides the " + std::to_string(specials.size()) + " special tokens");
        break;
      }
      case FieldKind::kJson: {
        std::vector<int64_t> shape;
        const std::vector<std::byte> bytes = first_member(f);
        simdjson::dom::parser parser;
        simdjson::dom::element doc, v;
        const bool parsed =
            parser.parse(reinterpret_cast<const char*>(bytes.data()), bytes.size(), true)
                .get(doc) == simdjson::SUCCESS;
        if (parsed && find_value(doc, o.key, &v)) {
          simdjson::dom::array a;
          if (v.get(a) == simdjson::SUCCESS) shape = {static_cast<int64_t>(a.size())};
        } else if (o.has_default && o.default_is_list) {
          shape = {static_cast<int64_t>(o.default_value.size())};
        }
        // Otherwise a scalar: the first sample's own read reports what is wrong with it.
        if (o.has_default) {
          const bool list = !shape.empty();
          if (list != o.default_is_list ||
              (list && static_cast<int64_t>(o.default_value.size()) != shape[0]))
            throw InvalidArgument("Json field '" + o.name +
                                  "': the default does not have the "
                                  "shape of the first sample's '" +
                                  o.key + "'");
        }
        json_shape_[f] = shape;
        fields_.push_back({o.name, o.dtype, shape});
        break;
      }
      case FieldKind::kPatches: {
        FieldSpec patches{o.name, kFloat32, {o.patches->max_patches(), o.patches->patch_dim()}};
        patches.ragged = true;
        patches.ragged_group = ragged_ != SIZE_MAX ? 1 : 0;  // after the captions' group
        fields_.push_back(std::move(patches));
        fields_.push_back({o.grid_name, kInt64, {3}});
        measure_patches(f);
        break;
      }
      case FieldKind::kLabel:
      case FieldKind::kRaw:
        fields_.push_back({o.name, kInt64, {}});
        break;
      case FieldKind::kNpy: {
        const std::vector<std::byte> bytes = first_member(f);
        const NpyHeader h = parse_npy_header(bytes, bytes.size(), path(0));
        if (h.fortran_order && h.shape.size() > 1)
          throw InvalidArgument(path(0) + ": a Fortran-order .npy array; write it in C order");
        npy_dtype_[f] = h.dtype;
        npy_shape_[f] = h.shape;
        fields_.push_back({o.name, h.dtype, h.shape});
        break;
      }
    }
  }
}

void ImageTextSource::plan_buckets(
    const std::vector<std::vector<std::tuple<uint64_t, int32_t, int32_t>>>& remote) {
  if (bucketed_ == SIZE_MAX) return;
  image_sizes_.resize(samples_.size());
  buckets_.resize(samples_.size());
  std::vector<double> aspects;  // each bucket's log(width / height)
  for (const ImageSize& b : bucket_sizes_)
    aspects.push_back(std::log(static_cast<double>(b[1]) / b[0]));
  auto nearest = [&](double aspect) {
    uint32_t best = 0;
    for (uint32_t b = 1; b < aspects.size(); ++b)
      if (std::abs(aspects[b] - aspect) < std::abs(aspects[best] - aspect)) best = b;
    return best;
  };
  for_each_sample([&](uint64_t i, std::vector<std::byte>& buffer) {
    const Span& sp = span(i, bucketed_);
    ImageSize size{0, 0};
    if (remote.empty()) {  // its header, read from the local shard
      size = member_size(*tars_, samples_[i].shard, sp.offset, sp.size, path(i), buffer);
    } else {
      const auto& listed = remote[samples_[i].shard];
      auto it = std::lower_bound(listed.begin(), listed.end(), sp.offset,
                                 [](const auto& e, uint64_t off) { return std::get<0>(e) < off; });
      if (it != listed.end() && std::get<0>(*it) == sp.offset)
        size = {std::get<1>(*it), std::get<2>(*it)};
    }
    if (size[0] <= 0 || size[1] <= 0) size = {0, 0};
    image_sizes_[i] = size;
    buckets_[i] = nearest(size[0] > 0 ? std::log(static_cast<double>(size[1]) / size[0]) : 0.0);
  });
}

void ImageTextSource::measure_patches(size_t field) {
  const FieldOptions& o = options_.fields[field];
  const uint64_t limit = o.max_pixels ? o.max_pixels : image::kDefaultMaxPixels;
  patch_counts_.assign(samples_.size(), 0);
  for_each_sample([&](uint64_t i, std::vector<std::byte>& buffer) {
    const Span& sp = span(i, field);
    const ImageSize size =
        member_size(*tars_, samples_[i].shard, sp.offset, sp.size, path(i), buffer);
    // A bad image (no header, over the decode limit) fails when it is read, naming the sample.
    // As the longest a sample can be, it lets on_error="skip" put any other sample in its place
    // (a replacement must fit the batch).
    patch_counts_[i] = static_cast<uint32_t>(o.patches->max_patches());
    if (size[0] <= 0 || static_cast<uint64_t>(size[0]) * static_cast<uint64_t>(size[1]) > limit)
      return;
    try {
      patch_counts_[i] = static_cast<uint32_t>(o.patches->grid(size[0], size[1]).patches());
    } catch (const Error&) {
    }
  });
}

uint64_t ImageTextSource::length(uint64_t index) const {
  if (!lengths_.empty()) return lengths_[index];
  return patch_counts_.empty() ? 0 : patch_counts_[index];
}

uint64_t ImageTextSource::group_length(uint64_t index, uint32_t group) const {
  // Group 1 exists only beside variable-length captions: the patches'.
  return group == 0 ? length(index) : patch_counts_[index];
}

std::string ImageTextSource::path(uint64_t index) const {
  const Sample& s = samples_[index];
  return tars_->path(s.shard) + ":" + s.key;
}

std::vector<std::byte> ImageTextSource::member(uint64_t index, size_t field) const {
  std::vector<std::byte> out;
  const Span& sp = span(index, field);
  tars_->read(samples_[index].shard, sp.offset, sp.size, out, path(index));
  return out;
}

std::unique_ptr<WorkerState> ImageTextSource::make_worker_state() const {
  return std::make_unique<ImageTextWorkerState>();
}

std::vector<uint64_t> ImageTextSource::shards() const {
  std::vector<uint64_t> b;  // a shard without samples is no block
  for (const uint64_t n : shard_samples_)
    if (n > 0) b.push_back(n);
  return b;
}

void ImageTextSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                           WorkerState* state) const {
  std::unique_ptr<WorkerState> local;
  if (state == nullptr) state = (local = make_worker_state()).get();
  auto* ws = static_cast<ImageTextWorkerState*>(state);
  const Sample& sample = samples_[key.index];
  for (size_t f = 0; f < options_.fields.size(); ++f) {
    const FieldOptions& o = options_.fields[f];
    const Span& sp = span(key.index, f);
    std::byte* dst = slots[first_slot_[f]];
    // The JSON parser reads up to SIMDJSON_PADDING bytes past the text: room for them.
    ws->buffer.reserve(sp.size + simdjson::SIMDJSON_PADDING);
    tars_->read(sample.shard, sp.offset, sp.size, ws->buffer, path(key.index));
    switch (o.kind) {
      case FieldKind::kImage: {
        SampleRng rng(key.seed, key.epoch, key.index);
        if (o.bucket_pipelines.empty()) {
          o.pipeline->run(ws->buffer, rng, dst, ws->scratch);
          break;
        }
        const ImageSize size = image_sizes_[key.index];
        if (size[0] == 0) throw DecodeError("the image's header cannot be read");
        const image::ImagePipeline& p = *o.bucket_pipelines[buckets_[key.index]];
        SampleRng draw = rng;  // the CoverCrop's draw comes first: the crop the pipeline makes
        const image::CoverBox box = image::cover_crop_params(size[0], size[1], *cover_of(p), draw);
        p.run(ws->buffer, rng, dst, ws->scratch);
        const int64_t hw[2] = {size[0], size[1]}, tl[2] = {box.top, box.left};
        std::memcpy(slots[first_slot_[f] + 1], hw, sizeof hw);
        std::memcpy(slots[first_slot_[f] + 2], tl, sizeof tl);
        break;
      }
      case FieldKind::kText: {
        const std::vector<int32_t> got = caption_ids(f, as_text(ws->buffer));
        auto* ids = reinterpret_cast<int64_t*>(dst);
        auto* mask = reinterpret_cast<int64_t*>(slots[first_slot_[f] + 1]);
        // Ragged: the rows the plan gave it, the engine pads the rest; else max_length.
        const size_t rows = o.ragged ? lengths_[key.index] : o.max_length;
        if (o.ragged ? got.size() != rows : got.size() > rows)
          throw Error("a caption of " + std::to_string(got.size()) +
                      " tokens where its index had " + std::to_string(rows) +
                      " (changed since the shards were indexed?)");
        for (size_t i = 0; i < rows; ++i) {
          ids[i] = i < got.size() ? got[i] : o.pad_id;
          mask[i] = i < got.size() ? 1 : 0;
        }
        break;
      }
      case FieldKind::kRaw: {
        if (!simdjson::validate_utf8(reinterpret_cast<const char*>(ws->buffer.data()),
                                     ws->buffer.size()))
          throw DecodeError("." + o.exts[0] + " member is not valid UTF-8");
        const auto index = static_cast<int64_t>(key.index);
        std::memcpy(dst, &index, sizeof index);
        break;
      }
      case FieldKind::kJson: {
        simdjson::dom::element doc, v;
        const auto err =
            ws->parser
                .parse(reinterpret_cast<const char*>(ws->buffer.data()), ws->buffer.size(), false)
                .get(doc);
        if (err != simdjson::SUCCESS)
          throw DecodeError("." + o.exts[0] +
                            " member does not parse as JSON: " + simdjson::error_message(err));
        const auto& shape = json_shape_[f];
        const size_t esize = o.dtype.bytes();
        if (!find_value(doc, o.key, &v)) {
          if (!o.has_default)
            throw InvalidArgument("JSON member has no '" + o.key + "' (and field '" + o.name +
                                  "' has no default)");
          for (size_t i = 0; i < o.default_value.size(); ++i) put_default(o, i, dst + i * esize);
          break;
        }
        if (shape.empty()) {
          put_number(v, o.dtype, o.key, dst);
          break;
        }
        simdjson::dom::array a;
        if (v.get(a) != simdjson::SUCCESS || static_cast<int64_t>(a.size()) != shape[0])
          throw InvalidArgument("JSON value '" + o.key + "' is " + simdjson::minify(v) +
                                ", not a list of " + std::to_string(shape[0]) + " numbers");
        size_t i = 0;
        for (simdjson::dom::element e : a) put_number(e, o.dtype, o.key, dst + (i++) * esize);
        break;
      }
      case FieldKind::kPatches: {
        const image::DecodedImage img =
            image::decode(ws->buffer, o.max_pixels ? o.max_pixels : image::kDefaultMaxPixels,
                          image_text::PatchProcessor::kAlpha);
        const image_text::PatchGrid g = o.patches->grid(img.height, img.width);
        if (static_cast<uint64_t>(g.patches()) != patch_counts_[key.index])
          throw DecodeError("the image decodes to " + std::to_string(img.width) + "x" +
                            std::to_string(img.height) + ", not the size its header gave");
        auto* out = reinterpret_cast<float*>(dst);
        o.patches->process(img.rgb, img.width, img.height,
                           {out, static_cast<size_t>(g.patches() * o.patches->patch_dim())},
                           ws->resized);
        const int64_t grid[3] = {g.t, g.h, g.w};
        std::memcpy(slots[first_slot_[f] + 1], grid, sizeof grid);
        break;
      }
      case FieldKind::kLabel: {
        int64_t label = 0;
        if (!parse_tar_label(as_text(ws->buffer), &label))
          throw InvalidArgument("invalid label '" + std::string(as_text(ws->buffer).substr(0, 64)) +
                                "' (expected a decimal integer)");
        std::memcpy(dst, &label, sizeof label);
        break;
      }
      case FieldKind::kNpy: {
        const NpyHeader h = parse_npy_header(ws->buffer, ws->buffer.size(), path(key.index));
        if (h.dtype != npy_dtype_[f] || h.shape != npy_shape_[f] ||
            (h.fortran_order && h.shape.size() > 1)) {
          auto shape_text = [](const std::vector<int64_t>& s) {
            std::string t = "(";
            for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
            return t + ")";
          };
          throw InvalidArgument(".npy member of dtype " + h.dtype.name() + " and shape " +
                                shape_text(h.shape) + ", but the first sample's is " +
                                npy_dtype_[f].name() + " " + shape_text(npy_shape_[f]) +
                                (h.fortran_order ? " (and Fortran order)" : ""));
        }
        std::memcpy(dst, ws->buffer.data() + h.data_offset, h.data_bytes);
        break;
      }
    }
  }
}

}  // namespace stoker::image_text
