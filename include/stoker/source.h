// The interface every native sample source implements.
//
// A source is a random-access collection of samples. Each sample has the same fields (for example
// an image and a label, or input tokens and target tokens), each with a fixed element type and a
// fixed shape, so that a batch of samples is a set of contiguous arrays with a leading batch
// dimension. The loader asks a source to write sample `index` straight into its slot of each
// field's batch array: no per-sample allocation, no intermediate copy.
//
// Variable-length samples (a document's tokens, an utterance's audio): a field may be ragged, its
// first dimension the sample's own length (length(index)), at most shape[0]. The loader pads a
// batch's ragged fields to the batch's longest sample (rounded up to the loader's
// pad_to_multiple_of): a batch holds them as [B, L, shape[1:]...], the rows after a sample's
// length set to the field's pad_value, and adds a field "lengths" (int64 [B]) after the source's.
// read() writes the first length(index) rows of each ragged slot, and nothing after them.
// Ragged fields of different lengths (a caption's tokens and an image's patches) are in groups
// (FieldSpec::ragged_group, numbered from 0 with none left empty, in any field order): a group's
// fields share the sample's group_length(index, group) (group 0's is length(index)), each group
// is padded to its own longest, and the engine adds one int64 [B] field a group, in group order:
// "lengths" for group 0, "<its first field>_lengths" for the others.
//
// Samples of a few shapes (images resized to their aspect-ratio bucket, SDXL's way): a field may
// be bucketed, its shape that of the sample's bucket, bucket_shapes[bucket(index)]. The loader
// plans every batch from one bucket (a budget's plan whose buckets are the source's) and holds
// the batch as [B, bucket_shapes[b]...], each sample's slot that shape's bytes; read() writes the
// sample's own bucket's shape. A source has ragged or bucketed fields, not both.
//
// Thread safety: a Source is immutable after construction; read() is called concurrently from many
// threads and must not modify shared state. Per-thread mutable state (decoder handles, scratch
// buffers) lives in the WorkerState the source creates for each thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <stop_token>
#include <string>
#include <vector>

#include "stoker/dtype.h"

namespace stoker {

struct FieldSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // per sample, without the batch dimension
  // A variable-length field (see above): shape[0] is the longest a sample can be; rows past a
  // sample's length are pad_value (converted to dtype) in a batch.
  bool ragged = false;
  double pad_value = 0;
  uint32_t ragged_group = 0;  // a ragged field's group (see above)
  // A bucketed field (see above): the shape of each bucket's samples, by bucket; `shape` is then
  // each dimension's largest. Empty: every sample has `shape`.
  std::vector<std::vector<int64_t>> bucket_shapes = {};

  size_t sample_bytes() const;
  // Bytes of one row of the first dimension (a ragged field's unit). REQUIRES: !shape.empty().
  size_t row_bytes() const;
};

// The names of the lengths fields the engine adds for `fields`' ragged groups, group by group
// (see above); empty without ragged fields.
std::vector<std::string> ragged_lengths_names(const std::vector<FieldSpec>& fields);

// Identifies the randomness of one sample: per-sample RNGs are keyed by these three numbers only.
struct SampleKey {
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint64_t index = 0;
};

// Mutable per-thread state of a source; created for a worker thread and reused for every sample
// that thread reads. The loader keeps it when the thread's epoch ends and hands it to a worker of
// a later epoch (one thread at a time, never two), so it may carry caches from one sample to any
// later one, but nothing that a sample's result may depend on.
class WorkerState {
 public:
  virtual ~WorkerState() = default;
};

// The stop token of the loader worker running on this thread: a source whose read() may block
// for long (a remote shard waiting for its fetch) waits with it, so that an iterator torn down
// mid-epoch does not wait on the network. A token that never stops on other threads.
std::stop_token reader_stop_token();
// Sets reader_stop_token() for the current thread while it lives (a loader worker's loop).
class ReaderStopScope {
 public:
  explicit ReaderStopScope(std::stop_token token);
  ~ReaderStopScope();
  ReaderStopScope(const ReaderStopScope&) = delete;
  ReaderStopScope& operator=(const ReaderStopScope&) = delete;

 private:
  std::stop_token previous_;
};

class Source {
 public:
  virtual ~Source() = default;

  virtual uint64_t size() const = 0;
  virtual const std::vector<FieldSpec>& fields() const = 0;

  // Writes sample `key.index` into `slots[f]` (fields()[f].sample_bytes() bytes each).
  // REQUIRES: key.index < size(); slots.size() == fields().size().
  // Throws on bad data; the loader wraps the exception in a SampleError naming the sample.
  virtual void read(const SampleKey& key, std::span<std::byte* const> slots,
                    WorkerState* state) const = 0;

  // The file behind sample `index`, for error messages; empty when there is none.
  virtual std::string path(uint64_t /*index*/) const { return {}; }

  // A hint that sample `index` will be read soon: a source whose samples live in memory can start
  // loading them into cache so that random access overlaps memory latency. Must not throw.
  virtual void prefetch(uint64_t /*index*/) const {}

  // A hint that samples `indices` (a batch's, or a worker's share of it) will be read next, in
  // this order, each also hinted with prefetch() shortly before its read. A source whose samples
  // live in memory can start the first access of every one at once, so that their page-table
  // walks and first cache misses overlap instead of coming one by one. Must not throw.
  virtual void prefetch_batch(std::span<const uint64_t> /*indices*/) const {}

  // The length of sample `index` along its ragged fields' first dimension, known without reading
  // the sample (an index, a header): at most each ragged field's shape[0]. Only called on a source
  // with ragged fields. REQUIRES: index < size(). Must not throw: a sample whose data turns out
  // bad fails when it is read.
  virtual uint64_t length(uint64_t /*index*/) const { return 0; }
  // The length of sample `index` along the ragged fields of `group` (0: length(index)), as
  // length() is. Only called on a source with ragged fields in that group.
  virtual uint64_t group_length(uint64_t index, uint32_t group) const {
    return group == 0 ? length(index) : 0;
  }

  // The bucket of sample `index` (< every bucketed field's bucket_shapes.size()), known without
  // reading the sample. Only called on a source with bucketed fields. REQUIRES: index < size().
  // Must not throw.
  virtual uint64_t bucket(uint64_t /*index*/) const { return 0; }

  // Per-thread state for read(); nullptr when the source needs none.
  virtual std::unique_ptr<WorkerState> make_worker_state() const { return nullptr; }

  // The class label of every sample, when the source knows them without reading any sample (an
  // image folder, tar shards); empty otherwise. A stratified order groups samples by them.
  virtual std::vector<int64_t> labels() const { return {}; }

  // Samples that live in blocks which cost much more to open than to read from once open
  // (Parquet row groups, decompressed whole): the sizes of consecutive blocks (summing to size())
  // and how many blocks a shuffled epoch keeps together. A shuffled loader then visits them in a
  // BlockOrder (block_order.h), unless it is stratified. Empty sizes: samples are independent,
  // shuffled by a full permutation.
  struct Blocks {
    std::vector<uint64_t> sizes;
    uint64_t window = 1;
  };
  virtual Blocks blocks() const { return {}; }

  // The sizes of the source's shards (consecutive samples, summing to size()): files or objects
  // that a remote reader fetches whole (tar shards, token files). A loader with shuffle and
  // EngineOptions::shard_window > 0 visits them in a BlockOrder that keeps shard_window shards
  // open per rank. Empty: the source has no shards (blocks() is then used, if any).
  virtual std::vector<uint64_t> shards() const { return {}; }
};

}  // namespace stoker
