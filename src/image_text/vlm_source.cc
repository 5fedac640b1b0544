#include "stoker/image_text/vlm_source.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>

#include "stoker/errors.h"
#include "stoker/image/decode.h"
#include "stoker/image/pipeline.h"
#include "stoker/image_text/dynamic_images.h"
#include "stoker/image_text/patch_processor.h"
#include "stoker/order.h"
#include "stoker/random.h"
#include "stoker/sources/documents.h"
#include "stoker/sources/image_files.h"
#include "stoker/sources/image_source.h"

namespace stoker::image_text {
namespace {

// The first bytes of an image read for its header; the whole image where they do not hold it.
constexpr uint64_t kHeaderBytes = 16 * 1024;
constexpr size_t kReasonsKept = 8;
constexpr DType kInt32{DType::kInt, 32};
// The seed of a class's permutation, hashed apart from the loader's EpochOrder over samples.
constexpr uint64_t kClassOrderTag = 0x766c6d2d636c6173;  // "vlm-clas"

// Runs fn(i) for i in [0, n) on `threads` threads; the first exception (by i) is rethrown.
void parallel_for(uint64_t n, int threads, const std::function<void(uint64_t)>& fn) {
  const size_t count = std::clamp<size_t>(
      threads > 0 ? static_cast<size_t>(threads) : std::thread::hardware_concurrency(), 1, 8);
  std::atomic<uint64_t> next{0};
  std::exception_ptr error;
  uint64_t error_at = UINT64_MAX;
  std::mutex mu;
  const auto work = [&] {
    for (uint64_t i; (i = next.fetch_add(1)) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard lock(mu);
        if (i < error_at) error = std::current_exception(), error_at = i;
      }
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < count; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

struct VLMWorkerState final : WorkerState {
  std::vector<int64_t> tokens;
  std::vector<uint8_t> trained;
  std::vector<std::byte> buffer;
  image::ImageScratch scratch;
  std::vector<uint8_t> resized;
};

}  // namespace

VLMSource::VLMSource(VLMOptions options) : options_(std::move(options)) {
  const VLMOptions& o = options_;
  if (o.documents == nullptr) throw InvalidArgument("VLMSource: no documents");
  if (o.images == nullptr) throw InvalidArgument("VLMSource: no images");
  const uint64_t docs = o.documents->num_documents();
  if (o.image_starts.size() != docs + 1 || o.image_starts.front() != 0 ||
      o.image_starts.back() != o.image_ids.size() ||
      !std::is_sorted(o.image_starts.begin(), o.image_starts.end()))
    throw InvalidArgument("VLMSource: image_starts must be " + std::to_string(docs + 1) +
                          " increasing offsets into image_ids, from 0 to its size");
  for (uint64_t id : o.image_ids)
    if (id >= o.images->size())
      throw InvalidArgument("VLMSource: image id " + std::to_string(id) + " of " +
                            std::to_string(o.images->size()) + " images");
  if ((o.pipeline == nullptr) == (o.dynamic == nullptr))
    throw InvalidArgument("VLMSource: give a pipeline (fixed resolution) or dynamic images");
  if (o.pipeline != nullptr) {
    if (o.tokens_per_image < 1)
      throw InvalidArgument("VLMSource: tokens_per_image must be at least 1 with a pipeline");
    image_bytes_ = o.pipeline->output_bytes();
  }
  if (o.image_token < 0) throw InvalidArgument("VLMSource: image_token must be a token id");
  qwen_ = dynamic_cast<const PatchProcessor*>(o.dynamic.get());
  if (o.mrope && (qwen_ == nullptr || o.seq_len == 0))
    throw InvalidArgument("VLMSource: mrope is for packed samples of Qwen2-VL's processor");
  stats_.conversations = docs;
  probe_images();
  scan();
  plan_packs();
  make_fields();
}

VLMSource::~VLMSource() = default;

// An image's shape: dynamic, its size from its header and the processor's tokens and rows for
// it; fixed, the pipeline's tokens (the file is there). Throws the reason it cannot be used:
// IoError (missing, unreadable), DecodeError (no header), or the processor's InvalidArgument (a
// size it refuses).
VLMSource::ImageShape VLMSource::probe(uint64_t i, std::vector<std::byte>& buffer) const {
  if (options_.dynamic == nullptr) {
    if (options_.images->range_size(i) == 0)
      throw DecodeError("image " + options_.images->path(i) + " is empty");
    return {0, 0, static_cast<uint64_t>(options_.tokens_per_image), 0};
  }
  options_.images->read_prefix(i, kHeaderBytes, buffer);
  image::ImageInfo info;
  try {
    info = image::read_info(buffer);
  } catch (const Error&) {
    if (buffer.size() < kHeaderBytes) throw;
    options_.images->read(i, buffer);  // a header after large metadata
    info = image::read_info(buffer);
  }
  const DynamicImages& p = *options_.dynamic;
  return {info.height, info.width, static_cast<uint64_t>(p.image_tokens(info.height, info.width)),
          static_cast<uint64_t>(p.rows(info.height, info.width))};
}

// Every image a conversation holds, probed; tokens 0 for one that cannot be used (the
// conversations holding it are bad, the reason found again in scan()).
void VLMSource::probe_images() {
  shapes_.assign(options_.images->size(), ImageShape{});
  std::vector<uint8_t> used(options_.images->size(), 0);
  for (uint64_t id : options_.image_ids) used[id] = 1;
  parallel_for(shapes_.size(), options_.threads, [&](uint64_t i) {
    if (!used[i]) return;
    thread_local std::vector<std::byte> buffer;
    try {
      shapes_[i] = probe(i, buffer);
    } catch (const Error&) {
    }
  });
}

void VLMSource::scan() {
  const VLMOptions& o = options_;
  const DocumentSet& docs = *o.documents;
  const uint64_t n = docs.num_documents();
  std::vector<Conversation> all(n);
  std::vector<std::exception_ptr> bad(n);
  parallel_for(n, o.threads, [&](uint64_t d) {
    thread_local std::vector<int64_t> tokens;
    try {
      tokens.resize(docs.document_length(d));
      docs.read(d, 0, tokens.size(), tokens.data());
      const uint64_t placeholders =
          static_cast<uint64_t>(std::count(tokens.begin(), tokens.end(), o.image_token));
      const uint64_t first = o.image_starts[d], images = o.image_starts[d + 1] - first;
      if (placeholders != images)
        throw InvalidArgument("the conversation has " + std::to_string(placeholders) +
                              " image placeholder" + (placeholders == 1 ? "" : "s") + " and " +
                              std::to_string(images) + " image" + (images == 1 ? "" : "s"));
      Conversation c{d, tokens.size() - placeholders, 0};
      for (uint64_t k = first; k < first + images; ++k) {
        const uint64_t id = o.image_ids[k];
        if (shapes_[id].tokens == 0) {  // probe it again for the reason
          std::vector<std::byte> buffer;
          probe(id, buffer);
          throw DecodeError("image " + o.images->path(id) + " cannot be read");
        }
        c.image_tokens += image_tokens(id);
        c.tokens += image_tokens(id);
        c.patches += image_patches(id);
      }
      const uint64_t limit = o.seq_len > 0 ? o.seq_len : o.max_length;
      if (limit > 0 && c.tokens > limit)
        throw InvalidArgument("the conversation is " + std::to_string(c.tokens) +
                              " tokens with its image tokens, more than " +
                              (o.seq_len > 0 ? "seq_len " : "max_length ") + std::to_string(limit));
      all[d] = c;
    } catch (const Error&) {
      bad[d] = std::current_exception();
    }
  });
  for (uint64_t d = 0; d < n; ++d) {
    if (bad[d] == nullptr) {
      kept_.push_back(all[d]);
      stats_.tokens += all[d].tokens;
      stats_.images += o.image_starts[d + 1] - o.image_starts[d];
      stats_.image_tokens += all[d].image_tokens;
      continue;
    }
    SampleError error(d, docs.path(d), bad[d]);
    if (!o.skip_bad) throw error;
    ++stats_.skipped;
    if (stats_.skipped_reasons.size() < kReasonsKept)
      stats_.skipped_reasons.push_back(error.what());
  }
  stats_.kept = kept_.size();
  if (kept_.empty())
    throw InvalidArgument(
        "VLMSource: no conversation left of " + std::to_string(n) +
        (stats_.skipped_reasons.empty() ? "" : "; the first: " + stats_.skipped_reasons[0]));
}

void VLMSource::plan_packs() {
  const uint64_t k = kept_.size();
  pack_order_.resize(k);
  std::iota(pack_order_.begin(), pack_order_.end(), 0);
  pack_starts_.clear();
  if (options_.seq_len == 0) {
    pack_starts_.resize(k + 1);
    std::iota(pack_starts_.begin(), pack_starts_.end(), 0);
  } else {
    // Best-fit decreasing: the longest first, each into the fullest pack it fits in.
    std::vector<uint64_t> order(k);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](uint64_t a, uint64_t b) { return kept_[a].tokens > kept_[b].tokens; });
    std::vector<std::vector<uint64_t>> packs;
    std::multimap<uint64_t, size_t> room;  // tokens left -> pack
    for (uint64_t c : order) {
      const uint64_t t = kept_[c].tokens;
      auto it = room.lower_bound(t);
      size_t p;
      uint64_t left;
      if (it == room.end()) {
        p = packs.size();
        packs.emplace_back();
        left = options_.seq_len - t;
      } else {
        p = it->second;
        left = it->first - t;
        room.erase(it);
      }
      packs[p].push_back(c);
      room.emplace(left, p);
    }
    for (auto& p : packs) std::sort(p.begin(), p.end());
    std::sort(packs.begin(), packs.end(),
              [](const auto& a, const auto& b) { return a.front() < b.front(); });
    pack_order_.clear();
    pack_starts_.push_back(0);
    for (const auto& p : packs) {
      pack_order_.insert(pack_order_.end(), p.begin(), p.end());
      pack_starts_.push_back(pack_order_.size());
    }
  }
  if (options_.seq_len > 0 && options_.shuffle_conversations) plan_classes();
  const uint64_t samples = pack_starts_.size() - 1;
  sample_tokens_.assign(samples, 0);
  sample_images_.assign(samples, 0);
  sample_patches_.assign(samples, 0);
  for (uint64_t s = 0; s < samples; ++s)
    for (uint64_t j = pack_starts_[s]; j < pack_starts_[s + 1]; ++j) {
      const Conversation& c = kept_[pack_order_[j]];
      sample_tokens_[s] += c.tokens;
      sample_images_[s] +=
          options_.image_starts[c.document + 1] - options_.image_starts[c.document];
      sample_patches_[s] += c.patches;
    }
  if (options_.seq_len > 0) stats_.padding = options_.seq_len * samples - stats_.tokens;
}

void VLMSource::plan_classes() {
  const uint64_t k = kept_.size();
  const auto images = [&](uint64_t c) {
    const uint64_t d = kept_[c].document;
    return options_.image_starts[d + 1] - options_.image_starts[d];
  };
  std::map<std::array<uint64_t, 3>, std::vector<uint64_t>> classes;
  for (uint64_t c = 0; c < k; ++c)
    classes[{kept_[c].tokens, images(c), kept_[c].patches}].push_back(c);
  class_of_.resize(k);
  rank_in_class_.resize(k);
  class_starts_ = {0};
  for (const auto& [key, members] : classes) {
    for (size_t r = 0; r < members.size(); ++r) {
      class_of_[members[r]] = static_cast<uint32_t>(class_starts_.size() - 1);
      rank_in_class_[members[r]] = r;
    }
    class_members_.insert(class_members_.end(), members.begin(), members.end());
    class_starts_.push_back(class_members_.size());
  }
}

uint64_t VLMSource::conversation_at(uint64_t j, uint64_t seed, uint64_t epoch) const {
  const uint64_t c = pack_order_[j];
  if (class_of_.empty()) return c;
  const uint32_t k = class_of_[c];
  const uint64_t first = class_starts_[k], n = class_starts_[k + 1] - first;
  if (n < 2) return c;
  const EpochOrder order(n, true, hash_key(seed, kClassOrderTag, k), epoch);
  return class_members_[first + order[rank_in_class_[c]]];
}

void VLMSource::make_fields() {
  const VLMOptions& o = options_;
  const bool packed = o.seq_len > 0;
  const auto most = [](const std::vector<uint64_t>& v) {
    return static_cast<int64_t>(std::max<uint64_t>(1, *std::max_element(v.begin(), v.end())));
  };
  const int64_t tokens = most(sample_tokens_), images = most(sample_images_);
  const auto ragged = [](std::string name, DType dtype, std::vector<int64_t> shape, double pad,
                         uint32_t group) {
    FieldSpec f{std::move(name), dtype, std::move(shape)};
    f.ragged = true;
    f.pad_value = pad;
    f.ragged_group = group;
    return f;
  };
  std::vector<int64_t> positions = {tokens};
  if (o.mrope) positions.push_back(4);
  fields_ = {ragged("input_ids", kInt64, {tokens}, static_cast<double>(o.pad_id), 0),
             ragged("labels", kInt64, {tokens}, static_cast<double>(o.label_ignore), 0),
             packed ? ragged("position_ids", kInt64, positions, 0, 0)
                    : ragged("attention_mask", kInt64, {tokens}, 0, 0)};
  uint32_t group = 1;
  if (o.pipeline != nullptr) {
    const auto s = o.pipeline->output_shape();
    fields_.push_back(ragged("pixel_values", to_dtype(o.pipeline->dtype()),
                             {images, s[0], s[1], s[2]}, 0, group++));
  } else {
    std::vector<int64_t> shape = {most(sample_patches_)};
    row_floats_ = 1;
    for (int64_t d : o.dynamic->row_shape()) shape.push_back(d), row_floats_ *= d;
    fields_.push_back(ragged("pixel_values", kFloat32, std::move(shape), 0, group++));
    fields_.push_back(
        ragged(o.dynamic->info_name(), kInt64, {images, o.dynamic->info_size()}, 0, group++));
  }
  if (packed) {
    uint64_t convs = 1;
    for (size_t s = 0; s + 1 < pack_starts_.size(); ++s)
      convs = std::max(convs, pack_starts_[s + 1] - pack_starts_[s]);
    cu_slot_ = fields_.size();
    fields_.push_back(ragged("cu_seqlens", kInt32, {static_cast<int64_t>(convs + 1)}, 0, group++));
    fields_.push_back(FieldSpec{"max_seqlen", kInt32, {}});
  }
  if (o.token_types) {
    types_slot_ = fields_.size();
    fields_.push_back(ragged("mm_token_type_ids", kInt64, {tokens}, 0, 0));
  }
}

uint64_t VLMSource::length(uint64_t index) const { return sample_tokens_[index]; }

uint64_t VLMSource::group_length(uint64_t index, uint32_t group) const {
  if (group == 0) return sample_tokens_[index];
  const bool fixed = options_.pipeline != nullptr;
  if (group == 1) return fixed ? sample_images_[index] : sample_patches_[index];
  if (group == 2 && !fixed) return sample_images_[index];
  return pack_starts_[index + 1] - pack_starts_[index] + 1;  // cu_seqlens
}

std::vector<uint64_t> VLMSource::lengths() const { return sample_tokens_; }

std::vector<uint64_t> VLMSource::documents_of(uint64_t index, uint64_t seed, uint64_t epoch) const {
  std::vector<uint64_t> out;
  for (uint64_t j = pack_starts_[index]; j < pack_starts_[index + 1]; ++j)
    out.push_back(kept_[conversation_at(j, seed, epoch)].document);
  return out;
}

std::string VLMSource::path(uint64_t index) const {
  const uint64_t first = pack_starts_[index], n = pack_starts_[index + 1] - first;
  std::string p = options_.documents->path(kept_[pack_order_[first]].document);
  if (n > 1) p += " (and " + std::to_string(n - 1) + " more conversations packed with it)";
  return p;
}

std::unique_ptr<WorkerState> VLMSource::make_worker_state() const {
  return std::make_unique<VLMWorkerState>();
}

void VLMSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                     WorkerState* state) const {
  std::unique_ptr<WorkerState> local;
  if (state == nullptr) state = (local = make_worker_state()).get();
  auto* ws = static_cast<VLMWorkerState*>(state);
  const VLMOptions& o = options_;
  const DocumentSet& docs = *o.documents;
  const bool packed = o.seq_len > 0;
  auto* ids = reinterpret_cast<int64_t*>(slots[0]);
  auto* labels = reinterpret_cast<int64_t*>(slots[1]);
  // attention_mask, or position_ids (mrope: 4 a token)
  auto* third = reinterpret_cast<int64_t*>(slots[2]);
  const int64_t merge = o.mrope ? qwen_->options().merge_size : 1;
  std::byte* pixels = slots[3];
  int64_t* info = o.dynamic != nullptr ? reinterpret_cast<int64_t*>(slots[4]) : nullptr;
  const int info_size = o.dynamic != nullptr ? o.dynamic->info_size() : 0;
  int32_t* cu = packed ? reinterpret_cast<int32_t*>(slots[cu_slot_]) : nullptr;
  int64_t* types = o.token_types ? reinterpret_cast<int64_t*>(slots[types_slot_]) : nullptr;
  uint64_t at = 0, image = 0, patch = 0;
  int32_t longest = 0;
  if (cu != nullptr) cu[0] = 0;
  for (uint64_t j = pack_starts_[key.index], c = 0; j < pack_starts_[key.index + 1]; ++j, ++c) {
    const Conversation& conv = kept_[conversation_at(j, key.seed, key.epoch)];
    const uint64_t d = conv.document, n = docs.document_length(d);
    ws->tokens.resize(n);
    docs.read(d, 0, n, ws->tokens.data());
    ws->trained.resize(n);
    docs.read_trained(d, 0, n, ws->trained.data());
    const uint64_t start = at;
    uint64_t k = o.image_starts[d];
    int64_t rope = 0;  // mrope: the running position (get_rope_index's current_pos)
    for (uint64_t t = 0; t < n; ++t) {
      const int64_t token = ws->tokens[t];
      const bool image_token = token == o.image_token;
      const uint64_t id = image_token ? o.image_ids[k++] : 0;
      const uint64_t copies = image_token ? image_tokens(id) : 1;
      // mrope: the image's merged grid (text: one position)
      int64_t rows = 1, columns = 1;
      if (image_token && o.mrope) {
        const PatchGrid g = qwen_->grid(shapes_[id].height, shapes_[id].width);
        rows = g.h / merge, columns = g.w / merge;
      }
      for (uint64_t r = 0; r < copies; ++r, ++at) {
        ids[at] = token;
        labels[at] = !image_token && ws->trained[t] ? token : o.label_ignore;
        if (types != nullptr) types[at] = image_token ? 1 : 0;
        if (!o.mrope) {
          third[at] = packed ? static_cast<int64_t>(at - start) : 1;
          continue;
        }
        const int64_t i = static_cast<int64_t>(r);
        int64_t* p = third + 4 * at;
        p[0] = static_cast<int64_t>(at - start);
        p[1] = rope + i / (rows * columns);
        p[2] = rope + i / columns % rows;
        p[3] = rope + i % columns;
      }
      rope += std::max(rows, columns);
    }
    if (at - start != conv.tokens)
      throw std::logic_error("VLMSource: a conversation changed length since it was scanned");
    if (cu != nullptr) {
      cu[c + 1] = static_cast<int32_t>(at);
      longest = std::max(longest, static_cast<int32_t>(at - start));
    }
    for (uint64_t i = o.image_starts[d]; i < o.image_starts[d + 1]; ++i, ++image) {
      const uint64_t id = o.image_ids[i];
      o.images->read(id, ws->buffer);
      if (o.pipeline != nullptr) {
        SampleRng rng(key.seed, key.epoch, id);
        o.pipeline->run(ws->buffer, rng, pixels + image * image_bytes_, ws->scratch);
        continue;
      }
      const image::DecodedImage img =
          image::decode(ws->buffer, o.max_pixels ? o.max_pixels : image::kDefaultMaxPixels,
                        DynamicImages::kAlpha);
      const ImageShape& shape = shapes_[id];
      if (img.height != shape.height || img.width != shape.width)
        throw DecodeError("image " + o.images->path(id) + " decodes to " +
                          std::to_string(img.width) + "x" + std::to_string(img.height) +
                          ", not the size its header gave");
      auto* out = reinterpret_cast<float*>(pixels) + patch * row_floats_;
      o.dynamic->fill(img.rgb, img.width, img.height, {out, shape.rows * row_floats_}, ws->resized);
      o.dynamic->info(img.height, img.width, info + image * info_size);
      patch += shape.rows;
    }
  }
  if (packed) std::memcpy(slots[cu_slot_ + 1], &longest, sizeof longest);
}

}  // namespace stoker::image_text
