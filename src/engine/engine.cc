#include "stoker/engine.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <typeinfo>
#include <vector>

#include "engine/engine_state.h"
#include "engine/skip_policy.h"
#include "stoker/budget.h"
#include "stoker/cuda/cuda.h"
#include "stoker/errors.h"
#include "stoker/random.h"

namespace stoker {
namespace {

constexpr size_t kFieldAlign = 64;
constexpr uint64_t kPrefetchAhead = 8;  // samples hinted ahead of the one being read

EngineOptions resolve(EngineOptions o) {
  // -1 is "auto" (0 for cpu_budget); any other value below the range is out of it.
  check_knobs(o.num_workers == -1 ? std::nullopt : std::optional<int64_t>(o.num_workers),
              o.prefetch_factor == -1 ? std::nullopt : std::optional<int64_t>(o.prefetch_factor),
              o.cpu_budget == 0 ? std::nullopt : std::optional<int64_t>(o.cpu_budget));
  if (o.cpu_budget == 0) o.cpu_budget = usable_cores();
  if (o.num_workers == -1) o.num_workers = o.cpu_budget;
  if (o.prefetch_factor == -1) o.prefetch_factor = kDefaultPrefetchFactor;
  o.memory_budget = resolve_memory_budget(o.memory_budget);
  bool unavailable = false;
  o.pin_memory = resolve_pinned(o.pin_memory, &unavailable) ? PinMemory::kOn : PinMemory::kOff;
  check_repeats(o.repeats, o.mixture                               ? SampleOrder::kMixture
                           : o.classes || !o.class_weights.empty() ? SampleOrder::kStratified
                                                                   : SampleOrder::kPlain);
  if (o.stripes == 0) o.stripes = o.world_size;
  return o;
}

// The global positions of an epoch: every sample `repeats` times.
uint64_t epoch_positions(const Source& source, const EngineOptions& o) {
  if (o.repeats > 1 && source.size() > UINT64_MAX / 2 / o.repeats)
    throw InvalidArgument("repeats=" + std::to_string(o.repeats) + " of " +
                          std::to_string(source.size()) + " samples overflows an epoch");
  return source.size() * std::max<uint64_t>(o.repeats, 1);
}

size_t align_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

uint64_t round_up(uint64_t n, uint64_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

// Elements of an array of `shape` (1 for a scalar).
uint64_t shape_elements(std::span<const int64_t> shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

template <class T>
void fill_as(std::byte* dst, size_t count, T value) {
  for (size_t i = 0; i < count; ++i) std::memcpy(dst + i * sizeof(T), &value, sizeof(T));
}

// Whether a ragged field's pad value can be written in its dtype (a float16's cannot, but 0).
bool can_pad(const FieldSpec& f) {
  if (f.pad_value == 0) return true;
  const DType d = f.dtype;
  if (d.code == DType::kInt || d.code == DType::kUInt || d.code == DType::kBool) return true;
  return (d.code == DType::kFloat && (d.bits == 32 || d.bits == 64)) ||
         (d.code == DType::kBFloat && d.bits == 16);
}

// Sets `rows` rows of ragged field `f` at `dst` to its pad value.
void pad_rows(std::byte* dst, const FieldSpec& f, size_t row_bytes, uint64_t rows) {
  const size_t bytes = rows * row_bytes, count = bytes / f.dtype.bytes();
  if (bytes == 0) return;
  if (f.pad_value == 0) {
    std::memset(dst, 0, bytes);
    return;
  }
  const double v = f.pad_value;
  switch (f.dtype.code) {
    case DType::kInt:
    case DType::kUInt:
    case DType::kBool:
      switch (f.dtype.bits) {
        case 8:
          return fill_as(dst, count, static_cast<int8_t>(v));
        case 16:
          return fill_as(dst, count, static_cast<int16_t>(v));
        case 32:
          return fill_as(dst, count, static_cast<int32_t>(v));
        default:
          return fill_as(dst, count, static_cast<int64_t>(v));
      }
    case DType::kBFloat: {
      const float x = static_cast<float>(v);
      uint32_t bits;
      std::memcpy(&bits, &x, sizeof bits);
      return fill_as(dst, count, static_cast<uint16_t>(bits >> 16));
    }
    default:
      if (f.dtype.bits == 64) return fill_as(dst, count, v);
      return fill_as(dst, count, static_cast<float>(v));
  }
}

// What an autotuned loader learned applies to another loader over the same data with the same
// batch size and CPU budget: the source's type, length, fields and first and last files.
std::string autotune_key_of(const Source& source, const EngineOptions& o) {
  std::string key = typeid(source).name();
  for (uint64_t v : {source.size(), o.batch_size, static_cast<uint64_t>(o.cpu_budget)}) {
    key.push_back('|');
    key.append(std::to_string(v));
  }
  for (const FieldSpec& f : source.fields()) {
    key.push_back('|');
    key.append(f.name).push_back(':');
    key.append(f.dtype.name());
    for (int64_t d : f.shape) {
      key.push_back(',');
      key.append(std::to_string(d));
    }
  }
  if (source.size() > 0) {
    key.push_back('|');
    key.append(source.path(0)).push_back('|');
    key.append(source.path(source.size() - 1));
  }
  return key;
}

}  // namespace

void check_knobs(std::optional<int64_t> num_workers, std::optional<int64_t> prefetch_factor,
                 std::optional<int64_t> cpu_budget) {
  if (num_workers && (*num_workers < 0 || *num_workers > kMaxWorkers))
    throw InvalidArgument("num_workers must be \"auto\" or an integer in [0, " +
                          std::to_string(kMaxWorkers) + "], got " + std::to_string(*num_workers));
  if (prefetch_factor && (*prefetch_factor < 1 || *prefetch_factor > kMaxPrefetchFactor))
    throw InvalidArgument("prefetch_factor must be \"auto\" or an integer in [1, " +
                          std::to_string(kMaxPrefetchFactor) + "], got " +
                          std::to_string(*prefetch_factor));
  if (cpu_budget && (*cpu_budget < 1 || *cpu_budget > kMaxWorkers))
    throw InvalidArgument("cpu_budget must be unset (the usable cores) or an integer in [1, " +
                          std::to_string(kMaxWorkers) + "], got " + std::to_string(*cpu_budget));
}

void check_repeats(uint64_t repeats, SampleOrder order) {
  if (repeats < 1)
    throw InvalidArgument(
        "repeats must be a positive integer (each sample this many times an epoch), got 0");
  if (repeats > 1 && order != SampleOrder::kPlain)
    throw InvalidArgument(
        "repeats is for the plain order (shuffle=True or False): not with shuffle=\"stratified\", "
        "class_weights, a Mixture, a Budget, a sampler, a batch_sampler or an IterableDataset, "
        "which order whole batches or streams by rules of their own");
}

uint64_t resolve_memory_budget(uint64_t memory_budget) {
  return memory_budget != 0 ? memory_budget : physical_memory_bytes() / 2;
}

bool resolve_pinned(PinMemory pin_memory, bool* unavailable) {
  const bool cuda = pin_memory != PinMemory::kOff && cuda_available();
  if (unavailable) *unavailable = pin_memory == PinMemory::kOn && !cuda;
  return cuda;
}

std::unique_ptr<WorkerState> Engine::State::take_worker_state() {
  {
    std::lock_guard lock(worker_states_mu_);
    if (!worker_states_.empty()) {
      std::unique_ptr<WorkerState> state = std::move(worker_states_.back());
      worker_states_.pop_back();
      return state;
    }
  }
  return source->make_worker_state();
}

void Engine::State::keep_worker_state(std::unique_ptr<WorkerState> state) {
  if (!state) return;
  std::lock_guard lock(worker_states_mu_);
  if (worker_states_.size() < static_cast<size_t>(std::max(1, options.num_workers)))
    worker_states_.push_back(std::move(state));
}

Engine::State::State(std::shared_ptr<const Source> src, const EngineOptions& opts)
    : source(std::move(src)),
      options(resolve(opts)),
      plan(epoch_positions(*source, options), options.batch_size, options.drop_last, options.rank,
           options.world_size) {
  pin_unavailable = opts.pin_memory == PinMemory::kOn && options.pin_memory != PinMemory::kOn;
  autotune_workers = opts.num_workers == -1 && options.num_workers > 1;
  autotune_prefetch = opts.prefetch_factor == -1 && options.num_workers > 0;
  autotune_prefetch_now = options.prefetch_factor;
  fields = source->fields();
  if (options.pad_to_multiple_of == 0) throw InvalidArgument("pad_to_multiple_of must be >= 1");
  std::vector<uint64_t> longest;  // per ragged group, its fields' longest sample
  for (const FieldSpec& f : fields) {
    if (!f.ragged) continue;
    if (f.shape.empty() || !can_pad(f))
      throw InvalidArgument("ragged field " + f.name +
                            ": needs a first dimension and a pad value " + "its dtype holds");
    const uint32_t g = f.ragged_group;
    if (g >= ragged.size()) {
      ragged.resize(g + 1, {0, SIZE_MAX, 0});
      longest.resize(g + 1, 0);
    }
    if (ragged[g].first_field == SIZE_MAX) ragged[g].first_field = &f - fields.data();
    longest[g] = std::max<uint64_t>(longest[g], f.shape[0]);
  }
  for (size_t g = 0; g < ragged.size(); ++g)
    if (ragged[g].first_field == SIZE_MAX)
      throw InvalidArgument("ragged fields in group " + std::to_string(ragged.size() - 1) +
                            " but none in group " + std::to_string(g));
  for (const FieldSpec& f : fields) bucketed = bucketed || !f.bucket_shapes.empty();
  if (bucketed) {
    if (!ragged.empty()) throw InvalidArgument("a source has ragged or bucketed fields, not both");
    if (!options.budget)
      throw InvalidArgument(
          "a source of bucketed fields (images in aspect-ratio buckets) needs batches planned by "
          "its buckets: a budget's plan");
    if (options.batch_transform)
      throw InvalidArgument("a batch transform mixes images of one shape: not bucketed fields");
  }
  if (options.budget) {
    if (options.classes || !options.class_weights.empty() || options.mixture ||
        options.repeats > 1 || options.batch_transform || options.shard_window > 0)
      throw InvalidArgument(
          "batches by a budget are planned by the budget: not with a stratified or class-weighted "
          "order, a mixture, repeats, a batch transform or shuffle=\"shards\"");
    if (options.budget->num_samples() != source->size())
      throw InvalidArgument("the budget's plan has " +
                            std::to_string(options.budget->num_samples()) +
                            " samples but the source has " + std::to_string(source->size()));
  }
  if (!ragged.empty() && options.batch_transform)
    throw InvalidArgument("a batch transform mixes images: not a source of ragged fields");
  const std::vector<std::string> names = ragged_lengths_names(fields);
  for (size_t g = 0; g < ragged.size(); ++g) {
    ragged[g].lengths_field = fields.size();
    fields.push_back({names[g], kInt64, {}});
  }
  if (options.batch_transform) {
    mix_fields = options.batch_transform->check(fields);
    fields.push_back(options.batch_transform->soft_label_field());
  }
  // A buffer holds the largest batch: batch_size samples, or the budget's largest.
  uint64_t rows = options.batch_size;
  if (options.budget) rows = std::max<uint64_t>(options.budget->max_batch_size(), 1);
  for (uint32_t g = 0; g < ragged.size(); ++g) {
    if (options.budget) {
      std::vector<uint64_t> lengths(source->size());
      for (uint64_t i = 0; i < lengths.size(); ++i) lengths[i] = length_of(i, g);
      ragged[g].capacity = options.budget->max_padded_elements(lengths, options.pad_to_multiple_of);
    } else {
      ragged[g].capacity = rows * round_up(longest[g], options.pad_to_multiple_of);
    }
  }
  size_t bytes = 0;
  for (const FieldSpec& f : fields) {
    bytes = align_up(bytes, kFieldAlign);
    field_offsets.push_back(bytes);
    sample_bytes.push_back(f.ragged ? f.row_bytes() : f.sample_bytes());
    if (!f.bucket_shapes.empty()) {  // the budget's largest batch of one bucket's shape
      std::vector<uint64_t> elements(source->size());
      for (uint64_t i = 0; i < elements.size(); ++i) {
        const uint64_t b = source->bucket(i);
        if (b >= f.bucket_shapes.size())
          throw InvalidArgument("sample " + std::to_string(i) + " is in bucket " +
                                std::to_string(b) + " of " +
                                std::to_string(f.bucket_shapes.size()) + " of field " + f.name);
        elements[i] = shape_elements(f.bucket_shapes[b]);
      }
      bytes += f.dtype.bytes() * options.budget->max_padded_elements(elements, 1);
      continue;
    }
    bytes += f.ragged ? f.row_bytes() * ragged[f.ragged_group].capacity : f.sample_bytes() * rows;
  }
  // Large batches: the workers fill each batch together, so an autotuned depth starts at one
  // batch in flight for all of them (with the consumer's, two buffers) and deepens only when
  // workers are measurably blocked by it; small batches start at two per worker, where hand-off
  // latency matters more than memory.
  if (autotune_prefetch && bytes > kSmallBatchBytes) {
    options.prefetch_factor = 1;
    autotune_prefetch_now = 1;
    autotune_shared_depth = true;
  }
  if (autotune_workers || autotune_prefetch) {
    autotune_key = autotune_key_of(*source, options);
    const AutotuneStart start = autotune_start(
        AutotuneMemory::recall(autotune_key), options.num_workers, usable_cores(),
        autotune_prefetch_now, autotune_prefetch ? kAutotuneMaxPrefetch : options.prefetch_factor);
    if (autotune_workers) autotune_active = start.workers;
    if (autotune_prefetch) autotune_prefetch_now = start.prefetch;
  }
  if (options.shard_window > 0 &&
      (!options.shuffle || options.mixture || options.classes || !options.class_weights.empty()))
    throw InvalidArgument(
        "shuffle=\"shards\" (shard_window) is a shuffled order of its own: not with shuffle "
        "off, a stratified order, class weights or a mixture");
  if (options.mixture) {
    if (options.classes || !options.class_weights.empty())
      throw InvalidArgument("a mixture cannot also be stratified or class-weighted");
    uint64_t total = 0;
    for (uint64_t n : options.mixture->sizes) total += n;
    if (total != source->size())
      throw InvalidArgument("the mixture's sources hold " + std::to_string(total) +
                            " samples but the loader's source has " +
                            std::to_string(source->size()));
    // Checks the order's sizes and schedule now, not at the first epoch.
    MixturePlan(*options.mixture, options.seed, options.shuffle, 0, options.batch_size,
                options.drop_last, options.rank, options.world_size);
    mixture_samples = std::make_unique<std::atomic<uint64_t>[]>(options.mixture->sizes.size());
  } else if (options.classes) {
    if (!options.shuffle) throw InvalidArgument("a stratified order needs shuffle");
    if (options.classes->num_samples() != source->size())
      throw InvalidArgument("the labels cover " + std::to_string(options.classes->num_samples()) +
                            " samples but the dataset has " + std::to_string(source->size()));
    stratified.emplace(options.classes, options.class_weights, options.seed, options.batch_size,
                       options.drop_last, options.rank, options.world_size);
  } else if (!options.class_weights.empty()) {
    throw InvalidArgument("class_weights need the classes of the samples");
  } else if (options.shuffle && !options.budget) {
    // A shard order visits the shards (else the blocks) with the loader's window; a source with
    // blocks alone keeps its own window.
    Source::Blocks b{options.shard_window > 0 ? source->shards() : std::vector<uint64_t>{}, 0};
    const char* what = "shards";
    if (b.sizes.empty()) {
      b = source->blocks();
      what = "blocks";
      if (options.shard_window > 0) b.window = options.shard_window;
    } else {
      b.window = options.shard_window;
    }
    if (options.shard_window > 0 && b.sizes.empty())
      throw InvalidArgument(
          "shuffle=\"shards\" needs a source with shards (tar shards, token files, Parquet row "
          "groups); this one has none: use shuffle=True");
    if (!b.sizes.empty()) {
      uint64_t total = 0;
      for (uint64_t size : b.sizes) total += size;
      if (total != source->size())
        throw InvalidArgument(std::string("the source's ") + what + " hold " +
                              std::to_string(total) + " samples but it has " +
                              std::to_string(source->size()));
      blocks = std::move(b);
    }
  }
  options.shard_window = blocks ? blocks->window : 0;
  pool = BatchPool::create(
      std::max<size_t>(bytes, 1), options.memory_budget,
      options.pin_memory == PinMemory::kOn ? MemoryKind::kPinned : MemoryKind::kPageable);
}

std::shared_ptr<Batch> Engine::State::make_batch(const BatchPlan& plan, const EpochDraws& draws,
                                                 uint64_t epoch, uint64_t b, Buffer buffer) const {
  auto batch = std::make_shared<Batch>();
  batch->epoch = epoch;
  batch->index = b;
  batch->length = draws.batch_length(plan, b);
  batch->pinned = pool->kind() == MemoryKind::kPinned;
  // Ragged fields: padded to the batch's longest sample. Bucketed: the shape of its bucket.
  uint64_t bucket = 0;
  std::vector<uint64_t> padded(ragged.size(), 0);  // per ragged group
  std::vector<uint64_t> indices;
  if (!ragged.empty() || bucketed) {
    indices.resize(batch->length);
    draws.draw(plan, b, indices);
  }
  if (bucketed && !indices.empty()) {
    bucket = source->bucket(indices[0]);
    for (uint64_t i : indices)
      if (source->bucket(i) != bucket)
        throw Error("batch " + std::to_string(b) + " mixes samples of buckets " +
                    std::to_string(bucket) + " and " + std::to_string(source->bucket(i)) +
                    ": a bucketed source's batches must be planned by its buckets");
  }
  for (uint32_t g = 0; g < ragged.size(); ++g) {
    for (uint64_t i : indices) padded[g] = std::max(padded[g], length_of(i, g));
    padded[g] = round_up(padded[g], options.pad_to_multiple_of);
    if (padded[g] * batch->length > ragged[g].capacity)
      throw Error("batch " + std::to_string(b) + " of " + std::to_string(batch->length) +
                  " samples padded to " + std::to_string(padded[g]) + " exceeds its buffer's " +
                  std::to_string(ragged[g].capacity) +
                  " rows (a source's length() above its shape?)");
  }
  const auto& specs = fields;
  batch->fields.reserve(specs.size());
  for (size_t f = 0; f < specs.size(); ++f) {
    BatchField field{buffer.get() + field_offsets[f], specs[f].dtype, {}, specs[f].name};
    field.shape.push_back(static_cast<int64_t>(batch->length));
    if (specs[f].ragged) {
      field.shape.push_back(static_cast<int64_t>(padded[specs[f].ragged_group]));
      field.shape.insert(field.shape.end(), specs[f].shape.begin() + 1, specs[f].shape.end());
    } else if (!specs[f].bucket_shapes.empty()) {
      const std::vector<int64_t>& shape = specs[f].bucket_shapes[bucket];
      field.shape.insert(field.shape.end(), shape.begin(), shape.end());
    } else {
      field.shape.insert(field.shape.end(), specs[f].shape.begin(), specs[f].shape.end());
    }
    batch->fields.push_back(std::move(field));
  }
  batch->buffer = std::move(buffer);
  return batch;
}

EpochDraws Engine::State::epoch_draws(uint64_t epoch, std::shared_ptr<const MixturePlan> mixture,
                                      uint64_t stripes) const {
  const EngineOptions& o = options;
  if (stratified) return EpochDraws(stratified->epoch(epoch));
  if (o.mixture) {
    if (!mixture)
      mixture = std::make_shared<const MixturePlan>(
          *o.mixture, o.seed, o.shuffle, epoch, o.batch_size, o.drop_last, o.rank, o.world_size,
          MixturePlan::epoch_start(*o.mixture, o.seed, o.shuffle, epoch, o.batch_size, o.drop_last,
                                   o.world_size));
    return EpochDraws(std::move(mixture));
  }
  std::optional<BlockOrder> order;
  if (blocks)
    order.emplace(blocks->sizes, blocks->window, stripes > 0 ? stripes : o.stripes, o.seed, epoch);
  return EpochDraws(source->size(), o.shuffle, o.seed, epoch, o.repeats, std::move(order));
}

void Engine::State::delivered(const EpochDraws& draws, const Batch& batch) {
  ++batches;
  samples += batch.length;
  if (!ragged.empty()) {  // group 0's rows
    const auto* lengths =
        reinterpret_cast<const int64_t*>(batch.fields[ragged[0].lengths_field].data);
    uint64_t rows = 0;
    for (uint64_t s = 0; s < batch.length; ++s) rows += static_cast<uint64_t>(lengths[s]);
    ragged_rows += rows;
    ragged_padded_rows +=
        batch.length * static_cast<uint64_t>(batch.fields[ragged[0].first_field].shape[1]);
  }
  if (draws.mixture()) {
    const std::vector<uint64_t> counts = draws.mixture()->batch_counts(batch.index);
    for (size_t c = 0; c < counts.size(); ++c) mixture_samples[c] += counts[c];
  }
}

void Engine::State::fill(Batch& batch, const BatchPlan& plan, const EpochDraws& draws,
                         WorkerState* worker, uint64_t begin, uint64_t end, uint64_t* failed_at) {
  const auto start = std::chrono::steady_clock::now();
  std::byte* slots[16];
  std::vector<std::byte*> many;                    // only for sources with more than 16 fields
  const size_t nfields = source->fields().size();  // the batch transform's field is not read
  std::byte** slot = nfields <= 16 ? slots : (many.resize(nfields), many.data());
  const uint64_t n = end - begin;
  std::vector<uint64_t> indices(n);  // the range's samples, mapped at once
  // The draws' cycles, where they key the randomness in place of the epoch.
  std::vector<uint64_t> cycles(draws.keyed_by_cycle() ? n : 0);
  draws.draw(plan, batch.index, indices, cycles, begin);
  // Samples are visited in a random order: hint all of them, then each one kPrefetchAhead samples
  // early, so that many memory accesses are in flight at once instead of one miss at a time.
  source->prefetch_batch(indices);
  for (uint64_t s = 0; s < std::min<uint64_t>(kPrefetchAhead, n); ++s) source->prefetch(indices[s]);
  // Ragged fields: rows of the batch's padded length; "lengths" gets each sample's. A sample's
  // slot is one sample of the batch's shape (a ragged field's padded rows, a bucketed field's
  // bucket).
  uint64_t bucket = UINT64_MAX;
  std::vector<uint64_t> padded(ragged.size());  // per ragged group
  std::vector<int64_t*> lengths(ragged.size());
  for (size_t g = 0; g < ragged.size(); ++g) {
    lengths[g] = reinterpret_cast<int64_t*>(batch.fields[ragged[g].lengths_field].data);
    padded[g] = static_cast<uint64_t>(batch.fields[ragged[g].first_field].shape[1]);
  }
  if (bucketed && n > 0) bucket = source->bucket(indices[0]);
  std::vector<size_t> stride(nfields);
  for (size_t f = 0; f < nfields; ++f) {
    const std::vector<int64_t>& shape = batch.fields[f].shape;
    stride[f] = fields[f].dtype.bytes() *
                shape_elements(std::span<const int64_t>(shape).subspan(shape.empty() ? 0 : 1));
  }
  for (uint64_t s = 0; s < n; ++s) {
    if (s + kPrefetchAhead < n) source->prefetch(indices[s + kPrefetchAhead]);
    const uint64_t at = begin + s;
    for (size_t f = 0; f < nfields; ++f) slot[f] = batch.fields[f].data + at * stride[f];
    try {
      const uint64_t read = read_sample(cycles.empty() ? batch.epoch : cycles[s], indices[s],
                                        {slot, nfields}, worker, padded, bucket);
      for (uint32_t g = 0; g < ragged.size(); ++g) {
        const uint64_t length = length_of(read, g);
        lengths[g][at] = static_cast<int64_t>(length);
        for (size_t f = 0; f < nfields; ++f)
          if (fields[f].ragged && fields[f].ragged_group == g)
            pad_rows(slot[f] + length * sample_bytes[f], fields[f], sample_bytes[f],
                     padded[g] - length);
      }
    } catch (...) {
      if (failed_at != nullptr) *failed_at = at;
      read_ns += elapsed_ns(start);
      throw;
    }
  }
  read_ns += elapsed_ns(start);
}

void Engine::State::transform(Batch& batch, const BatchPlan& plan, const EpochDraws& draws) {
  const BatchTransform* t = options.batch_transform.get();
  if (t == nullptr) return;
  const auto start = std::chrono::steady_clock::now();
  const BatchField& image = batch.fields[mix_fields.image];
  const bool chw = t->layout() == ImageLayout::kCHW;
  const BatchMixParams params = t->draw(options.seed, batch.epoch, plan.first_position(batch.index),
                                        image.shape[chw ? 2 : 1], image.shape[chw ? 3 : 2]);
  try {
    t->apply(params, image, batch.fields[mix_fields.label], batch.fields.back());
  } catch (const LabelOutOfRange& e) {
    uint64_t index = 0;
    draws.draw(plan, batch.index, {&index, 1}, {}, e.row());
    transform_ns += elapsed_ns(start);
    throw SampleError(index, source->path(index), std::current_exception());
  }
  transform_ns += elapsed_ns(start);
}

uint64_t Engine::State::read_sample(uint64_t epoch, uint64_t index,
                                    std::span<std::byte* const> slots, WorkerState* worker,
                                    std::span<const uint64_t> rows, uint64_t bucket) {
  try {
    source->read({options.seed, epoch, index}, slots, worker);
    return index;
  } catch (...) {
    if (options.on_error == OnError::kRaise)
      throw SampleError(index, source->path(index), std::current_exception());
    skipped.record(index, source->path(index), std::current_exception());
  }
  return read_replacement(options.seed, epoch, index, source->size(), source->path(index),
                          [&](uint64_t other) {
                            // A ragged batch is padded to its own samples: a replacement must fit
                            // in it.
                            for (uint32_t g = 0; g < rows.size(); ++g)
                              if (length_of(other, g) > rows[g])
                                throw Error("longer than the batch's padded length");
                            // A bucketed batch has its bucket's shape: a replacement must be of it.
                            if (bucket != UINT64_MAX && source->bucket(other) != bucket)
                              throw Error("not of the batch's bucket");
                            source->read({options.seed, epoch, other}, slots, worker);
                          });
}

void Engine::State::record_autotune(const AutotuneDecision& d) {
  AutotuneMemory::remember(autotune_key, {d.workers_to, d.prefetch_to});
  std::lock_guard lock(autotune_mu);
  autotune_active = d.workers_to;
  autotune_prefetch_now = d.prefetch_to;
  autotune_log.add(d);
}

Engine::Engine(std::shared_ptr<const Source> source, EngineOptions options) {
  if (!source) throw InvalidArgument("the loader needs a source");
  state_ = std::make_shared<State>(std::move(source), options);
}

Engine::~Engine() = default;

uint64_t Engine::num_batches() const {
  if (state_->options.budget)
    throw InvalidArgument(
        "a budget's batches per epoch differ from epoch to epoch: ask the "
        "epoch's BudgetEpoch (BudgetPlan::epoch)");
  return state_->plan.num_batches();
}
const BatchPlan& Engine::plan() const { return state_->plan; }
uint64_t Engine::samples_per_rank() const { return state_->plan.samples_per_rank(); }
const EngineOptions& Engine::options() const { return state_->options; }
const Source& Engine::source() const { return *state_->source; }
bool Engine::pinned() const { return state_->pool->kind() == MemoryKind::kPinned; }
bool Engine::pin_unavailable() const { return state_->pin_unavailable; }

std::vector<uint64_t> Engine::epoch_indices(uint64_t epoch) const {
  const State& s = *state_;
  std::vector<uint64_t> out;
  if (const EngineOptions& o = s.options; o.budget) {
    const auto e = o.budget->epoch(o.seed, epoch, o.shuffle, o.rank, o.world_size);
    for (uint64_t b = 0; b < e->num_batches(); ++b) {
      const std::span<const uint64_t> batch = e->batch(b);
      out.insert(out.end(), batch.begin(), batch.end());
    }
    return out;
  }
  const EpochDraws draws = s.epoch_draws(epoch);
  const BatchPlan& plan = draws.mixture() ? draws.mixture()->batches() : s.plan;
  for (uint64_t b = 0; b < plan.num_batches(); ++b) {
    const size_t at = out.size();
    out.resize(at + plan.batch_length(b));
    draws.draw(plan, b, std::span<uint64_t>(out).subspan(at));
  }
  return out;
}

namespace {

std::unique_ptr<EpochIterator> start_iteration(const std::shared_ptr<Engine::State>& state,
                                               const BatchPlan& plan, EpochDraws draws,
                                               uint64_t epoch, uint64_t start_batch) {
  check_start_batch(plan, start_batch);
  if (state->options.num_workers == 0)
    return make_inline_iterator(state, plan, std::move(draws), epoch, start_batch);
  return make_threaded_iterator(state, plan, std::move(draws), epoch, start_batch);
}

// Throws InvalidArgument for a plan the loader cannot iterate (Engine::iterate's REQUIRES).
void check_plan(const Engine::State& state, const BatchPlan& plan) {
  if (state.options.budget)
    throw InvalidArgument(
        "a budget's batches come from its BudgetEpoch (iterate(epoch, start)), "
        "not a BatchPlan");
  // Buffers hold batch_size samples of this source: a plan of other samples or batches would
  // overrun them.
  if (plan.num_samples() != state.plan.num_samples() ||
      plan.batch_size() != state.options.batch_size)
    throw InvalidArgument("the plan is for " + std::to_string(plan.num_samples()) +
                          " samples in batches of " + std::to_string(plan.batch_size()) +
                          ", the loader's epochs have " + std::to_string(state.plan.num_samples()) +
                          " samples (" + std::to_string(state.options.repeats) +
                          " times the source's) in batches of " +
                          std::to_string(state.options.batch_size));
  // A stratified order is laid out on the loader's own ranks and batches: its rows do not
  // survive a resume with another world size (an elastic start).
  if (state.stratified && plan.start() != 0)
    throw InvalidArgument(
        "a stratified or class-weighted order cannot resume with another world size: its batches "
        "are laid out for the ranks that saved the state");
  // A mixture's plan starts where its MixturePlan says (iterate(plan, start_batch)).
  if (state.options.mixture && plan.start() != 0)
    throw InvalidArgument(
        "a mixture resumes with another world size from a MixturePlan that starts where the "
        "saving job stopped (Engine::iterate(plan, start_batch))");
  if (state.options.mixture && plan.is_strided())
    throw InvalidArgument("a mixture's batches cannot be strided among producers");
}

}  // namespace

std::unique_ptr<EpochIterator> Engine::iterate(uint64_t epoch, uint64_t start_batch) const {
  const EngineOptions& o = state_->options;
  if (o.budget)
    return iterate(o.budget->epoch(o.seed, epoch, o.shuffle, o.rank, o.world_size), start_batch);
  return iterate(epoch, start_batch, state_->plan);
}

std::unique_ptr<EpochIterator> Engine::iterate(std::shared_ptr<const BudgetEpoch> epoch,
                                               uint64_t start_batch) const {
  if (!state_->options.budget)
    throw InvalidArgument("a BudgetEpoch is for a loader that batches by a budget");
  if (!epoch) throw InvalidArgument("iterate() needs a BudgetEpoch, got none");
  const BatchPlan plan = EpochDraws::budget_plan(*epoch);
  const uint64_t e = epoch->epoch();
  return start_iteration(state_, plan, EpochDraws(std::move(epoch)), e, start_batch);
}

std::unique_ptr<EpochIterator> Engine::iterate(uint64_t epoch, uint64_t start_batch,
                                               const BatchPlan& plan, uint64_t stripes) const {
  check_plan(*state_, plan);
  EpochDraws draws = state_->epoch_draws(epoch, nullptr, stripes);
  const BatchPlan batches = draws.mixture() ? draws.mixture()->batches() : plan;
  return start_iteration(state_, batches, std::move(draws), epoch, start_batch);
}

std::vector<uint64_t> Engine::block_schedule(uint64_t epoch, uint64_t start_batch) const {
  return block_schedule(epoch, start_batch, state_->plan);
}

std::vector<uint64_t> Engine::block_schedule(uint64_t epoch, uint64_t start_batch,
                                             const BatchPlan& plan, uint64_t stripes) const {
  check_plan(*state_, plan);
  check_start_batch(plan, start_batch);
  const State& s = *state_;
  if (!s.blocks) return {};
  const EpochDraws draws = s.epoch_draws(epoch, nullptr, stripes);
  std::vector<uint64_t> out;
  std::vector<bool> seen(draws.blocks()->num_blocks());
  for (uint64_t b = start_batch; b < plan.num_batches() && out.size() < seen.size(); ++b) {
    for (uint64_t k = b * plan.batch_size(); k < b * plan.batch_size() + plan.batch_length(b);
         ++k) {
      const uint64_t block = draws.block_at(plan.global_position(k));
      if (!seen[block]) {
        seen[block] = true;
        out.push_back(block);
      }
    }
  }
  return out;
}

std::unique_ptr<EpochIterator> Engine::iterate(std::shared_ptr<const MixturePlan> plan,
                                               uint64_t start_batch) const {
  const EngineOptions& o = state_->options;
  if (!o.mixture) throw InvalidArgument("a MixturePlan is for a loader with a mixture order");
  if (!plan) throw InvalidArgument("iterate() needs a MixturePlan, got none");
  if (plan->order().sizes != o.mixture->sizes || plan->seed() != o.seed ||
      plan->shuffle() != o.shuffle || plan->batches().batch_size() != o.batch_size)
    throw InvalidArgument(
        "the MixturePlan is for other sources, seed, shuffle or batch_size than the loader's");
  const uint64_t epoch = plan->epoch();
  const BatchPlan batches = plan->batches();
  return start_iteration(state_, batches, state_->epoch_draws(epoch, std::move(plan)), epoch,
                         start_batch);
}

EngineStats Engine::stats() const {
  const State& s = *state_;
  EngineStats out;
  out.batches = s.batches;
  out.samples = s.samples;
  s.skipped.read(&out.skipped, &out.skipped_samples);
  out.read_seconds = s.read_ns * 1e-9;
  out.buffer_wait_seconds = s.buffer_wait_ns * 1e-9;
  out.consumer_wait_seconds = s.consumer_wait_ns * 1e-9;
  out.buffer_bytes = s.pool->bytes_allocated();
  out.buffer_bytes_peak = s.pool->peak_bytes_allocated();
  out.pinned_bytes = s.pool->pinned_bytes();
  out.fenced_buffers = s.pool->fenced_buffers();
  out.memory_budget = s.options.memory_budget;
  out.batch_bytes = s.pool->buffer_bytes();
  out.worker_cpu_seconds = s.worker_cpu_ns * 1e-9;
  out.batch_transform_seconds = s.transform_ns * 1e-9;
  out.ragged_rows = s.ragged_rows;
  out.ragged_padded_rows = s.ragged_padded_rows;
  out.autotune = s.autotune_workers || s.autotune_prefetch;
  {
    std::lock_guard lock(s.autotune_mu);
    out.active_workers = s.autotune_workers ? s.autotune_active : s.options.num_workers;
    out.prefetch_factor = s.autotune_prefetch ? s.autotune_prefetch_now : s.options.prefetch_factor;
    out.autotune_decisions = s.autotune_log.list();
  }
  if (s.options.mixture)
    for (size_t c = 0; c < s.options.mixture->sizes.size(); ++c)
      out.mixture_samples.push_back(s.mixture_samples[c]);
  return out;
}

std::shared_ptr<Batch> EpochIterator::next() {
  std::shared_ptr<Batch> batch;
  while (next_for(std::chrono::hours(1), &batch) == Status::kTimeout) {
  }
  return batch;
}

}  // namespace stoker
