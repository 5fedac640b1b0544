#include "stoker/image_text/image_text_source.h"

#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>

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

}  // namespace

ImageTextSource::ImageTextSource(std::vector<std::string> shard_paths, Options options)
    : options_(std::move(options)) {
  if (shard_paths.size() > std::numeric_limits<uint32_t>::max())
    throw InvalidArgument("too many tar shards");
  check_options();
  tars_ = std::make_unique<TarShardSet>(std::move(shard_paths));
  index({});
  plan_fields();
}

ImageTextSource::ImageTextSource(std::shared_ptr<ShardCache> cache,
                                 std::vector<std::vector<TarKey>> keys, Options options)
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
    if (f.kind == FieldKind::kImage && !f.pipeline)
      throw InvalidArgument(who + " needs a pipeline");
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
      if (f.max_length == 0) throw InvalidArgument(who + ": max_length must be at least 1");
      if (!names.insert(f.mask_name).second)
        throw InvalidArgument("two fields named '" + f.mask_name + "'");
    }
    if (f.kind == FieldKind::kJson) {
      if (f.key.empty()) throw InvalidArgument(who + " needs a key");
      if (!(f.dtype == kInt64 || f.dtype == kFloat32))
        throw InvalidArgument(who + ": dtype is float32 or int64");
    }
  }
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
        const auto shape = o.pipeline->output_shape();
        fields_.push_back({o.name, to_dtype(o.pipeline->dtype()), {shape.begin(), shape.end()}});
        break;
      }
      case FieldKind::kText: {
        const int64_t n = o.max_length;
        fields_.push_back({o.name, kInt64, {n}});
        fields_.push_back({o.mask_name, kInt64, {n}});
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
        if (specials.size() >= o.max_length)
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

void ImageTextSource::measure_patches(size_t field) {
  // Most headers sit in the first bytes; a JPEG with a large EXIF block needs the whole member.
  constexpr uint64_t kHead = 64 << 10;
  const FieldOptions& o = options_.fields[field];
  const uint64_t limit = o.max_pixels ? o.max_pixels : image::kDefaultMaxPixels;
  lengths_.assign(samples_.size(), 0);
  std::vector<std::byte> head;
  for (uint64_t i = 0; i < samples_.size(); ++i) {
    const Span& sp = span(i, field);
    try {
      image::ImageInfo info;
      tars_->read(samples_[i].shard, sp.offset, std::min(sp.size, kHead), head, path(i));
      try {
        info = image::read_info(head, limit);
      } catch (const Error&) {
        if (sp.size <= kHead) throw;
        tars_->read(samples_[i].shard, sp.offset, sp.size, head, path(i));
        info = image::read_info(head, limit);
      }
      lengths_[i] = static_cast<uint32_t>(o.patches->grid(info.height, info.width).patches());
    } catch (const Error&) {
      // A bad image: its read fails, naming the sample. As the longest a sample can be, it lets
      // on_error="skip" put any other sample in its place (a replacement must fit the batch).
      lengths_[i] = static_cast<uint32_t>(o.patches->max_patches());
    }
  }
}

uint64_t ImageTextSource::length(uint64_t index) const {
  return lengths_.empty() ? 0 : lengths_[index];
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
        o.pipeline->run(ws->buffer, rng, dst, ws->scratch);
        break;
      }
      case FieldKind::kText: {
        const std::vector<int32_t> content = o.tokenizer->encode(as_text(ws->buffer), false);
        const Framing& fr = framing_[f];
        const size_t specials = fr.prefix.size() + fr.suffix.size();
        size_t keep = content.size();
        if (keep + specials > o.max_length) {
          if (!o.truncation)
            throw InvalidArgument("a caption of " + std::to_string(keep + specials) +
                                  " tokens, longer than max_length=" +
                                  std::to_string(o.max_length) + " (truncation=False)");
          keep = o.max_length - specials;
        }
        auto* ids = reinterpret_cast<int64_t*>(dst);
        auto* mask = reinterpret_cast<int64_t*>(slots[first_slot_[f] + 1]);
        size_t n = 0;
        for (const int32_t id : fr.prefix) ids[n++] = id;
        for (size_t i = 0; i < keep; ++i) ids[n++] = content[i];
        for (const int32_t id : fr.suffix) ids[n++] = id;
        for (size_t i = 0; i < o.max_length; ++i) mask[i] = i < n ? 1 : 0;
        for (; n < o.max_length; ++n) ids[n] = o.pad_id;
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
            image::decode(ws->buffer, o.max_pixels ? o.max_pixels : image::kDefaultMaxPixels);
        const image_text::PatchGrid g = o.patches->grid(img.height, img.width);
        if (static_cast<uint64_t>(g.patches()) != lengths_[key.index])
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
