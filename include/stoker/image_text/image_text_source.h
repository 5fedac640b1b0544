// ImageTextSource: WebDataset tar shards whose samples hold any fields (img2dataset's
// `<key>.jpg` + `<key>.txt` + `<key>.json`, a `.cls`, a `.npy`), each member decoded natively
// into its field's slot: an image through an image::ImagePipeline, a caption through a
// text::Tokenizer (ids padded or truncated to a length, and an attention mask), a number or a
// fixed-length list of numbers picked by name from a JSON object, a decimal label, a .npy array.
//
// Samples: the shards are indexed once at construction (TarShardSet, the one tar indexer of
// stoker/sources/image_files.h); a key is a sample when it has a member for every field (the
// field's first extension the key has, in the field's order). A key with none of the fields'
// extensions is not a sample (a stray member); a key with some but not all is missing members:
// InvalidArgument naming the shard, the key and the extensions missing, or with skip_missing not
// a sample, counted in stats(). Samples are in shard order, then in the order of each key's first
// member. path(i) is "shard.tar:key".
//
// Fields (what read() writes into each slot):
// - kImage: pipeline->run(member, SampleRng(seed, epoch, index)): the pipeline's shape and dtype.
//   Images equal ImageSource's over TarShardFiles for the same sample index and pipeline.
//   In aspect-ratio buckets (SDXL's, bucket_pipelines given): the image's size is read from its
//   header when the shards are indexed (local shards; remote ones give it, image_sizes), and the
//   image is in the bucket whose aspect ratio is nearest its own (|log(w/h) - log(bw/bh)|, the
//   first of equals; an image whose header cannot be read is in the bucket nearest 1:1 and fails
//   when it is read). Its pipeline is its bucket's, whose first transform is a CoverCrop to the
//   bucket's size: the field is bucketed (source.h), bucket(index) the image's. Two more fields
//   follow it: `sizes_name` (int64 [2]: the image's height and width) and `crops_name` (int64
//   [2]: the crop's top and left in the resized image, cover_crop_params' draw), which SDXL
//   conditions on. One bucketed image field at most.
// - kText: int64 [max_length] ids, then a field `mask_name` (int64 [max_length], 1 for a real
//   token). The member is UTF-8 text, encoded by the tokenizer without special tokens; with
//   add_special_tokens, the post-processor's specials for a single sequence are put around it
//   (found at construction: encode(t, true) must be prefix + encode(t, false) + suffix, as
//   TemplateProcessing, BertProcessing and RobertaProcessing frame a text). With truncation the
//   text's ids are cut to max_length less the specials, then framed: the ids `tokenizers` gives
//   with enable_truncation(max_length) and enable_padding(length=max_length, pad_id). Without
//   truncation a longer caption is an InvalidArgument. The rest is pad_id, mask 0.
//   Variable-length (`ragged`, HF's padding="longest"): both fields are ragged (source.h), a
//   sample's length its ids' count, found by tokenizing every caption when the shards are
//   indexed (local shards; a caption that cannot be tokenized then has length 0 and fails when
//   read); the engine pads a batch to its longest with pad_id (mask 0). max_length is then the
//   cap (0: none; shape[0] is the longest caption's). One ragged Text field at most, and no
//   bucketed image field with it.
// - kRaw: int64, the sample's index, once the member is checked to be UTF-8 (DecodeError
//   otherwise): the Python front reads the text itself (member()) when it assembles a batch.
// - kJson: `dtype` (float32 or int64) scalar, or [n] for a list of n numbers: the value at the
//   dotted path `key` of the member's JSON object. The shape is the first sample's (its value's,
//   or the default's where it has none); a null or absent value takes the default, and without
//   one is an InvalidArgument. An int64 field takes integers only.
// - kLabel: int64, the member's decimal integer.
// - kNpy: the member's array; dtype and shape from the first sample's header; every other sample
//   must have the same (InvalidArgument otherwise).
//
// Contract:
// - Thread safety: immutable after construction; read() is safe from any number of threads, each
//   with its own WorkerState (a member buffer, image scratch, a JSON parser, token ids).
// - Ownership: the pipelines and tokenizers are shared and must not change; the shards stay open
//   for the source's lifetime.
// - Errors: the constructor throws IoError (a shard that cannot be opened or read),
//   InvalidArgument (a corrupt tar, a missing member, no samples for a field whose shape comes
//   from the first one, a tokenizer whose specials are not a prefix and suffix, options out of
//   range). read() throws DecodeError for a caption that is not UTF-8, a JSON member that does
//   not parse, a bad image; InvalidArgument for a missing JSON value, a value of the wrong kind
//   or shape, an invalid label, an .npy of another dtype or shape, a caption too long without
//   truncation; IoError for a shard truncated since it was indexed. The loader names the sample
//   with path(index).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "stoker/dtype.h"
#include "stoker/source.h"

namespace stoker {
class ShardCache;
class TarShardSet;
struct TarKey;
namespace image {
class ImagePipeline;
}
namespace text {
class Tokenizer;
}
}  // namespace stoker

namespace stoker::image_text {

enum class FieldKind { kImage, kText, kRaw, kJson, kLabel, kNpy, kPatches };

class PatchProcessor;

struct FieldOptions {
  FieldKind kind = FieldKind::kImage;
  std::string name;               // the batch key
  std::vector<std::string> exts;  // member extensions (lowercase, no dot), in preference order

  // kImage
  std::shared_ptr<const image::ImagePipeline> pipeline;
  // kImage in aspect-ratio buckets: each bucket's pipeline (a CoverCrop to the bucket's size
  // first), and the names of the original-size and crop fields. `pipeline` is then unused.
  std::vector<std::shared_ptr<const image::ImagePipeline>> bucket_pipelines;
  std::string sizes_name, crops_name;

  // kPatches: an image as Qwen2-VL's patches (patch_processor.h), a ragged float32 field
  // [patches, patch_dim] (shape[0] max_patches()), and its grid (t, h, w), int64 [3], under
  // grid_name. At most one such field: its patch count is the sample's length() (ragged group 0;
  // group 1 beside a ragged Text field, whose ids are group 0), from the image's header, read
  // when the source is made.
  std::shared_ptr<const PatchProcessor> patches;
  std::string grid_name;
  uint64_t max_pixels = 0;  // the decode limit of its images (0: decode.h's default)

  // kText
  std::shared_ptr<const text::Tokenizer> tokenizer;
  uint32_t max_length = 77;  // ragged: 0 = no cap
  bool ragged = false;
  bool truncation = true;
  bool add_special_tokens = true;
  int64_t pad_id = 0;
  std::string mask_name;  // the attention mask's field name

  // kJson
  std::string key;  // dotted path into the object: "a.b"
  DType dtype = kFloat32;
  bool has_default = false;
  std::vector<double> default_value;  // one value for a scalar default, else a list's
  bool default_is_list = false;
};

struct Options {
  std::vector<FieldOptions> fields;
  bool skip_missing = false;
};

// An image member's size from its header, height and width; {0, 0} when unknown.
using ImageSize = std::array<int32_t, 2>;

// The sizes of images `members` (data offset, size) of the local tar shard `path`, each read
// from its header (no decode; the whole member only where the header is not in its first
// bytes); {0, 0} for a member whose header cannot be read. Throws IoError for a shard that
// cannot be read.
std::vector<ImageSize> member_image_sizes(
    const std::string& path, const std::vector<std::pair<uint64_t, uint64_t>>& members);

struct IndexStats {
  uint64_t keys = 0;                          // keys met with at least one field's member
  uint64_t skipped_keys = 0;                  // of them, missing a member (skip_missing)
  std::vector<std::string> skipped_examples;  // the first few: "shard.tar:key: no .txt member"
};

class ImageTextSource final : public Source {
 public:
  // REQUIRES: at least one field; unique field names (with the masks); each field's options as
  // above (InvalidArgument naming the field otherwise).
  ImageTextSource(std::vector<std::string> shard_paths, Options options);
  // Remote shards: shard s is cache->shard(s), its keys keys[s] (from its sidecar index: `stoker
  // index`). Nothing is fetched here but the first sample's members where a field takes its
  // shape from them (Json, Npy). REQUIRES: keys.size() == cache->size(); every member inside its
  // shard (InvalidArgument naming the shard otherwise: a stale index).
  // With a bucketed image field, image_sizes[s] lists shard s's image members as (data offset,
  // height, width) (from its sidecar's facts), ascending by offset; a member not listed has an
  // unknown size.
  ImageTextSource(
      std::shared_ptr<ShardCache> cache, std::vector<std::vector<TarKey>> keys, Options options,
      std::vector<std::vector<std::tuple<uint64_t, int32_t, int32_t>>> image_sizes = {});
  ~ImageTextSource() override;
  ImageTextSource(const ImageTextSource&) = delete;
  ImageTextSource& operator=(const ImageTextSource&) = delete;

  uint64_t size() const override { return samples_.size(); }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  std::string path(uint64_t index) const override;
  std::unique_ptr<WorkerState> make_worker_state() const override;
  std::vector<uint64_t> shards() const override;
  uint64_t bucket(uint64_t index) const override { return buckets_.empty() ? 0 : buckets_[index]; }
  uint64_t length(uint64_t index) const override;
  uint64_t group_length(uint64_t index, uint32_t group) const override;

  const IndexStats& stats() const { return stats_; }
  // Per shard, its samples (a remote dataset's block order needs them).
  const std::vector<uint64_t>& shard_samples() const { return shard_samples_; }
  // The bytes of field `field`'s member of sample `index` (a raw caption, for Python).
  // REQUIRES: index < size(), field < options' fields.
  std::vector<std::byte> member(uint64_t index, size_t field) const;
  // With a bucketed image field: the buckets' sizes (height, width), and each sample's image
  // size from its header ({0, 0}: unknown). Empty otherwise.
  const std::vector<ImageSize>& bucket_sizes() const { return bucket_sizes_; }
  const std::vector<ImageSize>& image_sizes() const { return image_sizes_; }

 private:
  struct Span {
    uint64_t offset;
    uint64_t size;
  };
  struct Sample {
    uint32_t shard;
    std::string key;
  };
  // A text field's specials, put around the caption's ids.
  struct Framing {
    std::vector<int32_t> prefix, suffix;
  };

  void check_options();
  // Selects each key's members; `keys` per shard, or empty to index the local shards.
  void index(std::vector<std::vector<TarKey>> keys);
  void plan_fields();
  // fn(i, buffer) for every sample i, on a few threads (each with its own buffer); the first
  // exception is rethrown once they stop.
  void for_each_sample(const std::function<void(uint64_t, std::vector<std::byte>&)>& fn) const;
  // With a ragged text field: every caption's length, by tokenizing it (local shards).
  void plan_lengths();
  // A text field's ids of the caption `text` (specials put around, cut to max_length); throws
  // InvalidArgument for one too long without truncation.
  std::vector<int32_t> caption_ids(size_t field, std::string_view text) const;
  // With a bucketed image field: each sample's image size (read from the local shards' headers,
  // or found in `remote` by shard and member offset) and bucket.
  void plan_buckets(const std::vector<std::vector<std::tuple<uint64_t, int32_t, int32_t>>>& remote);
  // patch_counts_ of a kPatches field: each sample's patch count from its image's header.
  void measure_patches(size_t field);
  const Span& span(uint64_t index, size_t field) const {
    return spans_[index * options_.fields.size() + field];
  }

  Options options_;
  std::unique_ptr<TarShardSet> tars_;
  std::vector<Sample> samples_;
  std::vector<Span> spans_;  // samples_.size() x fields, row-major
  std::vector<uint64_t> shard_samples_;
  std::vector<FieldSpec> fields_;
  std::vector<size_t> first_slot_;                // per option field, its first slot in fields_
  std::vector<Framing> framing_;                  // per option field (text fields only)
  std::vector<std::vector<int64_t>> json_shape_;  // per option field (json fields only)
  std::vector<DType> npy_dtype_;                  // per option field (npy fields only)
  std::vector<std::vector<int64_t>> npy_shape_;
  size_t ragged_ = SIZE_MAX;  // the ragged text field (an option index), if any
  // Per sample: a ragged text field's ids (ragged group 0), and a kPatches field's patches
  // (group 0 alone, group 1 beside variable-length captions).
  std::vector<uint32_t> lengths_, patch_counts_;
  size_t bucketed_ = SIZE_MAX;  // the bucketed image field (an option index), if any
  std::vector<ImageSize> bucket_sizes_, image_sizes_;
  std::vector<uint32_t> buckets_;
  IndexStats stats_;
};

}  // namespace stoker::image_text
