// VLMSource: conversations with images for vision-language models (LLaVA's, Qwen2-VL's), as a
// Hugging Face processor makes them: the conversation rendered by the chat template and
// tokenized, each image placeholder token expanded to the model's number of image tokens, labels
// on the assistant's tokens only, and each image processed into pixel values.
//
// Inputs. `documents`: the conversations already rendered and tokenized (a TextCorpus built with
// the chat template and assistant_only), one document a conversation, each image written by the
// template as one `image_token`. Document d's images are image_ids[image_starts[d] ..
// image_starts[d + 1]), indices into `images` (FileRanges: files, tar members, or bytes written
// to one file), in the order of the conversation's placeholders.
//
// The images' tokens:
// - fixed (`pipeline`, CLIP-style resize, crop and normalize, LLaVA-1.5's): every image is
//   `tokens_per_image` tokens (LLaVA-1.5: 576) and pipeline's [3, H, W] pixels;
// - dynamic (`dynamic`, a DynamicImages: Qwen2-VL's PatchProcessor, LLaVA-NeXT's
//   TileProcessor): an image is dynamic->image_tokens(h, w) tokens and rows(h, w) pixel rows of
//   row_shape(), its size (h, w) read from its header when the source is made (never decoded
//   then).
// A conversation is expanded: each image_token becomes its image's count of image_token, the
// ids transformers' processor call gives for the text apply_chat_template rendered.
//
// Samples. Unpacked (seq_len 0): sample i is kept conversation i. Packed (seq_len > 0): the
// kept conversations are packed whole into samples of at most seq_len tokens, image tokens
// counted, by best-fit decreasing over their lengths (ties by document order); each sample's
// conversations in document order. The packs are chosen at construction from the lengths: size()
// and each sample's lengths are the same every epoch. With shuffle_conversations, each epoch
// permutes the conversations of each class (the same tokens, images and patches) among
// themselves (an EpochOrder keyed by the SampleKey's seed, hashed apart from the loader's, the
// epoch and the class): which conversations share a pack changes, the padding does not. Every
// kept conversation is in exactly one sample an epoch.
//
// Fields. Ragged group 0, the sample's tokens (length(i)):
//   "input_ids"      int64  the expanded tokens (padding: pad_id).
//   "labels"         int64  the token where it is trained on (DocumentSet::read_trained: an
//                           assistant's), label_ignore elsewhere and on every image token:
//                           transformers' labels, not shifted (the model shifts them).
//   "attention_mask" int64  unpacked: 1 (padding 0).
//   "position_ids"   int64  packed: 0 at each conversation's first token. With mrope, [tokens,
//                           4] instead: that text position, then Qwen2-VL's M-RoPE (t, h, w)
//                           positions, transformers' get_rope_index of the conversation alone
//                           (text tokens all three the running position; an image's tokens
//                           that position plus their (0, row, column) in the merged grid, the
//                           running position then advancing by the grid's longer side). The
//                           four rows are what transformers' Qwen2-VL models take for packed
//                           sequences ([4, batch, tokens] once moved to the front).
//   "mm_token_type_ids" int64  with token_types, the last field: 1 on an image token, 0
//                           elsewhere (padding 0): what Qwen2-VL's processor returns and its
//                           model's M-RoPE needs.
// Ragged group 1, "pixel_values" float32: fixed, [images, 3, H, W]; dynamic, [rows,
// *row_shape()], the sample's images' rows one after the other (Qwen2-VL: [patches, patch_dim];
// LLaVA-NeXT: [tiles, 3, tile, tile]).
// Dynamic, ragged group 2: dynamic->info_name() int64 [images, info_size()], each image's
// (Qwen2-VL: "image_grid_thw" (t, h, w); LLaVA-NeXT: "image_sizes" (height, width)).
// Packed, the last ragged group: "cu_seqlens" int32 [conversations + 1]: 0 and each
// conversation's end; and "max_seqlen" int32 [], the longest conversation of the pack.
// length(i) and lengths() are the tokens: Budget(tokens=...) counts the image tokens.
//
// Bad conversations, found at construction: a conversation with more or fewer placeholders
// than images; an image that is missing or empty (dynamic: whose header cannot be read, or
// whose size the processor refuses); a
// conversation longer than max_length (unpacked, 0: none) or seq_len (packed). With skip_bad
// each is left out and counted (stats()); otherwise the constructor throws SampleError naming the
// first in document order: index the document, path documents->path(d), the cause
// InvalidArgument (IoError for an image that cannot be read). An image that fails to decode when
// read fails that sample's read() (DecodeError), and the loader names the sample.
//
// Randomness: an image's pipeline draws from SampleRng(seed, epoch, its image id): the same
// pixels whatever the packing or the sample it is in.
//
// Contract:
// - Thread safety: immutable after construction; read() is safe from any number of threads,
//   each with its own WorkerState.
// - Ownership: shares documents, images, pipeline and dynamic, which must not change.
// - Errors: the constructor throws InvalidArgument for inconsistent options (image_starts not
//   D + 1 entries, an image id out of range, neither or both of pipeline and dynamic,
//   tokens_per_image < 1 with a pipeline, a pipeline whose output is not float32 [3, H, W],
//   mrope without Qwen2-VL's PatchProcessor or unpacked) and
//   the bad conversations above.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/source.h"

namespace stoker {
class DocumentSet;
class FileRanges;
namespace image {
class ImagePipeline;
}
}  // namespace stoker

namespace stoker::image_text {

class DynamicImages;
class PatchProcessor;

struct VLMOptions {
  std::shared_ptr<const DocumentSet> documents;
  std::vector<uint64_t> image_starts;  // documents + 1
  std::vector<uint64_t> image_ids;     // into images
  std::shared_ptr<const FileRanges> images;
  int64_t image_token = -1;
  // fixed: the pipeline and its tokens; dynamic: the processor.
  std::shared_ptr<const image::ImagePipeline> pipeline;
  int64_t tokens_per_image = 0;
  std::shared_ptr<const DynamicImages> dynamic;
  uint64_t max_pixels = 0;  // the decode limit (0: decode.h's default)
  int64_t pad_id = 0;
  int64_t label_ignore = -100;
  uint64_t seq_len = 0;               // > 0: packed
  uint64_t max_length = 0;            // unpacked: the longest conversation kept (0: any)
  bool shuffle_conversations = true;  // packed: see above
  bool token_types = false;           // the mm_token_type_ids field
  bool mrope = false;                 // packed Qwen2-VL: M-RoPE position_ids (above)
  bool skip_bad = false;
  int threads = 0;  // for the construction's scan (0: the cores, at most 8)
};

struct VLMStats {
  uint64_t conversations = 0;  // documents given
  uint64_t kept = 0;
  uint64_t skipped = 0;
  std::vector<std::string> skipped_reasons;  // the first few, "<path>: <reason>"
  uint64_t tokens = 0;                       // the kept conversations' expanded tokens
  uint64_t image_tokens = 0;
  uint64_t images = 0;
  uint64_t padding = 0;  // packed: seq_len * samples - tokens
};

class VLMSource final : public Source {
 public:
  explicit VLMSource(VLMOptions options);
  ~VLMSource() override;

  uint64_t size() const override { return pack_starts_.size() - 1; }
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  uint64_t length(uint64_t index) const override;
  uint64_t group_length(uint64_t index, uint32_t group) const override;
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  std::string path(uint64_t index) const override;
  std::unique_ptr<WorkerState> make_worker_state() const override;

  // Each sample's tokens (length(i)).
  std::vector<uint64_t> lengths() const;
  // The documents (conversations) of sample i in that epoch, in order.
  std::vector<uint64_t> documents_of(uint64_t index, uint64_t seed = 0, uint64_t epoch = 0) const;
  const VLMStats& stats() const { return stats_; }

 private:
  struct Conversation {
    uint64_t document = 0;
    uint64_t tokens = 0;   // expanded
    uint64_t patches = 0;  // dynamic: its images' pixel rows
    uint64_t image_tokens = 0;
  };
  // An image's size (dynamic, from its header), tokens and pixel rows; tokens 0: unusable.
  struct ImageShape {
    int height = 0, width = 0;
    uint64_t tokens = 0, rows = 0;
  };
  uint64_t image_tokens(uint64_t image) const { return shapes_[image].tokens; }
  // The kept conversation in slot j of pack_order_ in that epoch.
  uint64_t conversation_at(uint64_t j, uint64_t seed, uint64_t epoch) const;
  uint64_t image_patches(uint64_t image) const { return shapes_[image].rows; }
  ImageShape probe(uint64_t image, std::vector<std::byte>& buffer) const;
  void probe_images();
  void scan();
  void plan_packs();
  void plan_classes();
  void make_fields();

  VLMOptions options_;
  std::vector<FieldSpec> fields_;
  std::vector<Conversation> kept_;
  std::vector<uint64_t> pack_starts_;  // sample i is kept_[pack_order_[pack_starts_[i] ..]]
  std::vector<uint64_t> pack_order_;
  // Packed and shuffled: each kept conversation's class and rank in it, and the classes' members
  // (kept conversations, in document order) one class after another.
  std::vector<uint32_t> class_of_;
  std::vector<uint64_t> rank_in_class_, class_starts_, class_members_;
  // Per sample: its tokens, images and pixel rows (dynamic).
  std::vector<uint64_t> sample_tokens_, sample_images_, sample_patches_;
  std::vector<ImageShape> shapes_;        // per image
  const PatchProcessor* qwen_ = nullptr;  // mrope: dynamic as Qwen2-VL's
  uint64_t image_bytes_ = 0;              // fixed: one image's pixels
  uint64_t row_floats_ = 0;               // dynamic: one pixel row's floats
  size_t cu_slot_ = 0;                    // packed: cu_seqlens' slot (max_seqlen's next)
  size_t types_slot_ = 0;                 // with token_types: mm_token_type_ids' slot (the last)
  VLMStats stats_;
};

}  // namespace stoker::image_text
