#include "tables/table_data.h"

#include <arrow/c/bridge.h>
#include <arrow/io/file.h>
#include <arrow/ipc/reader.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/schema.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <unordered_set>

#include "stoker/errors.h"

namespace stoker::tables {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kDefaultWindowBytes = 256 * kMiB;
constexpr uint64_t kMinCacheBytes = 64 * kMiB;

std::string basename(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void check(const arrow::Status& status, const std::string& context) {
  if (!status.ok()) throw InvalidArgument(context + ": " + status.message());
}

template <typename T>
T value(arrow::Result<T> result, const std::string& context) {
  check(result.status(), context);
  return std::move(result).ValueUnsafe();
}

// The file's first bytes tell its format.
enum class Format { kParquet, kIpcFile, kIpcStream };

Format sniff(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("cannot open " + path + ": " + std::strerror(errno));
  char head[8] = {};
  in.read(head, sizeof head);
  const auto got = in.gcount();
  if (got >= 4 && std::memcmp(head, "PAR1", 4) == 0) return Format::kParquet;
  if (got >= 6 && std::memcmp(head, "ARROW1", 6) == 0) return Format::kIpcFile;
  if (got >= 4 && std::memcmp(head, "\xff\xff\xff\xff", 4) == 0) return Format::kIpcStream;
  throw InvalidArgument(path + " is neither a Parquet file nor an Arrow IPC file (its first " +
                        "bytes are neither PAR1, ARROW1 nor an IPC stream's)" +
                        (got == 0 ? ": it is empty" : ""));
}

// The leaf columns (Parquet column indices) under a top-level field.
void leaves(const parquet::arrow::SchemaField& f, std::vector<int>& out) {
  if (f.column_index >= 0) out.push_back(f.column_index);
  for (const auto& child : f.children) leaves(child, out);
}

bool same_type(const arrow::DataType& a, const arrow::DataType& b);

class ParquetInput final : public Input {
 public:
  explicit ParquetInput(const std::string& path) : path_(path) {
    file_ = value(arrow::io::ReadableFile::Open(path), "cannot open " + path);
    try {
      auto reader = parquet::ParquetFileReader::Open(file_);
      metadata_ = reader->metadata();
      reader_props_.set_use_threads(false);  // the engine's threads decode, one block each
      auto arrow_reader = value(parquet::arrow::FileReader::Make(arrow::default_memory_pool(),
                                                                 std::move(reader), reader_props_),
                                path);
      check(arrow_reader->GetSchema(&schema_), path);
      for (const auto& field : arrow_reader->manifest().schema_fields) {
        leaves_.emplace_back();
        leaves(field, leaves_.back());
      }
    } catch (const parquet::ParquetException& e) {
      throw InvalidArgument(path + " is not a readable Parquet file (truncated or corrupt?): " +
                            e.what());
    }
  }

  const std::shared_ptr<arrow::Schema>& schema() const { return schema_; }

  // Each row group's rows and the decoded size of top-level fields `fields` in it, from the
  // footer (whose row-group entries are parsed here, on first use).
  void row_groups(const std::vector<int>& fields, std::vector<uint64_t>& rows,
                  std::vector<uint64_t>& bytes) const {
    try {
      for (int g = 0; g < metadata_->num_row_groups(); ++g) {
        auto group = metadata_->RowGroup(g);
        if (group->num_rows() < 0) throw InvalidArgument("a row group has a negative row count");
        rows.push_back(static_cast<uint64_t>(group->num_rows()));
        uint64_t size = 0;
        for (int f : fields)
          for (int leaf : leaves_[f]) {
            const int64_t n = group->ColumnChunk(leaf)->total_uncompressed_size();
            size += n > 0 ? static_cast<uint64_t>(n) : 0;
          }
        bytes.push_back(size);
      }
    } catch (const parquet::ParquetException& e) {
      throw InvalidArgument(path_ + " is not a readable Parquet file (truncated or corrupt?): " +
                            e.what());
    } catch (const InvalidArgument& e) {
      throw InvalidArgument(path_ + " is not a readable Parquet file: " + e.what());
    }
  }

  std::shared_ptr<arrow::RecordBatch> read(int index,
                                          const std::vector<int>& fields) const override {
    std::vector<int> columns;
    for (int f : fields) columns.insert(columns.end(), leaves_[f].begin(), leaves_[f].end());
    std::sort(columns.begin(), columns.end());
    const std::string context = path_ + ": row group " + std::to_string(index) +
                                " cannot be decoded";
    try {
      // A reader per read over the parsed footer: readers are not thread-safe, the file (pread)
      // and the footer are.
      auto reader = value(parquet::arrow::FileReader::Make(
                              arrow::default_memory_pool(),
                              parquet::ParquetFileReader::Open(file_, parquet::default_reader_properties(),
                                                               metadata_),
                              reader_props_),
                          context);
      auto table = value(reader->ReadRowGroup(index, columns), context);
      std::vector<std::shared_ptr<arrow::Array>> arrays;
      std::vector<std::shared_ptr<arrow::Field>> out_fields;
      for (int f : fields) {
        const auto& name = schema_->field(f)->name();
        auto chunked = table->GetColumnByName(name);
        if (!chunked) throw InvalidArgument(context + ": column '" + name + "' was not read");
        auto array = chunked->num_chunks() == 1
                         ? chunked->chunk(0)
                         : value(arrow::Concatenate(chunked->chunks()), context);
        // A footer's Arrow schema may disagree with the pages it describes: the samples are
        // read at the schema's types, so a column must decode as its schema says.
        if (!same_type(*array->type(), *schema_->field(f)->type()))
          throw InvalidArgument(context + ": column '" + name + "' decoded as " +
                                array->type()->ToString() + ", not as the schema's " +
                                schema_->field(f)->type()->ToString());
        arrays.push_back(std::move(array));
        out_fields.push_back(schema_->field(f));
      }
      auto batch = arrow::RecordBatch::Make(arrow::schema(out_fields), table->num_rows(),
                                            std::move(arrays));
      check(batch->ValidateFull(), context);  // offsets inside their buffers: reads stay in
      return batch;
    } catch (const parquet::ParquetException& e) {
      throw DecodeError(context + ": " + e.what());
    } catch (const InvalidArgument& e) {  // an Arrow status, with the context
      throw DecodeError(e.what());
    } catch (const std::bad_alloc&) {
      throw DecodeError(context + ": its sizes ask for more memory than there is");
    }
  }
  bool cached() const override { return true; }
  const char* block_kind() const override { return "row group"; }

 private:
  std::string path_;
  std::shared_ptr<arrow::io::ReadableFile> file_;
  std::shared_ptr<parquet::FileMetaData> metadata_;
  parquet::ArrowReaderProperties reader_props_;
  std::shared_ptr<arrow::Schema> schema_;
  std::vector<std::vector<int>> leaves_;  // per top-level field
};

// Record batches in memory: views of a mapped IPC file, or an imported stream's.
class MemoryInput final : public Input {
 public:
  MemoryInput(std::shared_ptr<arrow::Schema> schema,
              std::vector<std::shared_ptr<arrow::RecordBatch>> batches)
      : schema_(std::move(schema)), batches_(std::move(batches)) {}

  const std::shared_ptr<arrow::Schema>& schema() const { return schema_; }
  const std::vector<std::shared_ptr<arrow::RecordBatch>>& batches() const { return batches_; }

  std::shared_ptr<arrow::RecordBatch> read(int index,
                                          const std::vector<int>& fields) const override {
    return value(batches_[index]->SelectColumns(fields), "record batch " + std::to_string(index));
  }
  bool cached() const override { return false; }
  const char* block_kind() const override { return "record batch"; }

 private:
  std::shared_ptr<arrow::Schema> schema_;
  std::vector<std::shared_ptr<arrow::RecordBatch>> batches_;
};

// Every batch of a reader. `full`: validated in full (a file's bytes are not trusted: offsets
// must lie inside their buffers before a sample is read through them), else structurally.
std::unique_ptr<MemoryInput> read_all(arrow::RecordBatchReader& reader, const std::string& name,
                                      bool full) {
  std::vector<std::shared_ptr<arrow::RecordBatch>> batches;
  while (true) {
    std::shared_ptr<arrow::RecordBatch> batch;
    check(reader.ReadNext(&batch), name);
    if (!batch) break;
    check(full ? batch->ValidateFull() : batch->Validate(), name);
    batches.push_back(std::move(batch));
  }
  return std::make_unique<MemoryInput>(reader.schema(), std::move(batches));
}

std::unique_ptr<MemoryInput> open_ipc(const std::string& path, Format format) {
  auto file = value(arrow::io::MemoryMappedFile::Open(path, arrow::io::FileMode::READ),
                    "cannot map " + path);
  const std::string context = path + " is not a readable Arrow IPC file (truncated or corrupt?)";
  if (format == Format::kIpcFile) {
    auto reader = value(arrow::ipc::RecordBatchFileReader::Open(file), context);
    std::vector<std::shared_ptr<arrow::RecordBatch>> batches;
    for (int i = 0; i < reader->num_record_batches(); ++i) {
      batches.push_back(value(reader->ReadRecordBatch(i), context));
      check(batches.back()->ValidateFull(), context);
    }
    return std::make_unique<MemoryInput>(reader->schema(), std::move(batches));
  }
  auto reader = value(arrow::ipc::RecordBatchStreamReader::Open(file), context);
  return read_all(*reader, context, true);
}

// Equal types, whatever their list items are called ("item", "element": writers differ).
bool same_type(const arrow::DataType& a, const arrow::DataType& b) {
  if (a.id() != b.id()) return false;
  if (a.id() == arrow::Type::FIXED_SIZE_LIST &&
      static_cast<const arrow::FixedSizeListType&>(a).list_size() !=
          static_cast<const arrow::FixedSizeListType&>(b).list_size())
    return false;
  if (a.num_fields() != b.num_fields()) return false;
  if (a.num_fields() == 0) return a.Equals(b);
  for (int i = 0; i < a.num_fields(); ++i) {
    if (a.id() == arrow::Type::STRUCT && a.field(i)->name() != b.field(i)->name()) return false;
    if (!same_type(*a.field(i)->type(), *b.field(i)->type())) return false;
  }
  return true;
}

void collect_buffers(const arrow::ArrayData& data, std::unordered_set<const void*>& seen,
                     uint64_t& bytes) {
  for (const auto& buffer : data.buffers)
    if (buffer && seen.insert(buffer->data()).second) bytes += buffer->size();
  for (const auto& child : data.child_data) collect_buffers(*child, seen, bytes);
  if (data.dictionary) collect_buffers(*data.dictionary, seen, bytes);
}

}  // namespace

uint64_t batch_bytes(const arrow::RecordBatch& batch) {
  std::unordered_set<const void*> seen;
  uint64_t bytes = 0;
  for (const auto& column : batch.column_data()) collect_buffers(*column, seen, bytes);
  return bytes;
}

TableDataImpl::TableDataImpl(TableSpec spec) {
  if (spec.paths.empty() && spec.stream == nullptr)
    throw InvalidArgument("a table needs files or a stream");
  if (spec.paths.empty()) {
    display_ = spec.stream_name;
    paths_ = {spec.stream_name};
    auto reader = value(arrow::ImportRecordBatchReader(spec.stream), spec.stream_name);
    inputs_.push_back(read_all(*reader, spec.stream_name, false));
  } else {
    paths_ = spec.paths;
    display_ = paths_.size() == 1 ? paths_[0] : paths_[0] + " and " +
                                                    std::to_string(paths_.size() - 1) + " more";
    for (const auto& path : paths_) {
      const Format format = sniff(path);
      if (format == Format::kParquet)
        inputs_.push_back(std::make_unique<ParquetInput>(path));
      else
        inputs_.push_back(open_ipc(path, format));
    }
  }
  // The chosen columns, at the first input's types; every input must have them alike.
  for (uint32_t file = 0; file < inputs_.size(); ++file) {
    const Input& input = *inputs_[file];
    const auto* parquet = dynamic_cast<const ParquetInput*>(&input);
    const auto& schema = parquet ? parquet->schema()
                                 : static_cast<const MemoryInput&>(input).schema();
    if (file == 0) {
      names_ = spec.columns;
      if (names_.empty())
        for (const auto& f : schema->fields()) names_.push_back(f->name());
    }
    std::vector<int> positions;
    std::vector<std::shared_ptr<arrow::Field>> fields;
    for (const auto& name : names_) {
      const int at = schema->GetFieldIndex(name);
      if (at < 0) {
        std::string have;
        for (const auto& f : schema->fields()) have += (have.empty() ? "" : ", ") + f->name();
        throw InvalidArgument(paths_[file] + " has no column '" + name + "' (its columns: " +
                              have + ")");
      }
      positions.push_back(at);
      fields.push_back(schema->field(at));
      if (file > 0 && !same_type(*schema->field(at)->type(), *schema_->field(fields.size() - 1)->type()))
        throw InvalidArgument(paths_[file] + ": column '" + name + "' is " +
                              schema->field(at)->type()->ToString() + " but " + paths_[0] +
                              "'s is " + schema_->field(fields.size() - 1)->type()->ToString());
    }
    if (file == 0) schema_ = arrow::schema(fields);
    file_fields_.push_back(positions);
    // The file's blocks: row groups with their decoded size, or batches with their memory.
    std::vector<uint64_t> rows, bytes;
    if (parquet) {
      parquet->row_groups(positions, rows, bytes);
    } else {
      for (const auto& batch : static_cast<const MemoryInput&>(input).batches()) {
        rows.push_back(static_cast<uint64_t>(batch->num_rows()));
        bytes.push_back(batch_bytes(*value(batch->SelectColumns(positions), paths_[file])));
      }
    }
    add_blocks(file, rows, bytes);
  }
  // Views of the blocks that live in memory (the cache never holds them).
  views_.resize(blocks_.size());
  for (uint64_t b = 0; b < blocks_.size(); ++b)
    if (!inputs_[blocks_[b].file]->cached()) views_[b] = decode(b, file_fields_[blocks_[b].file]);
  size_window_and_cache(spec);
  selection_ = std::move(spec.rows);
  for (int64_t row : selection_)
    if (row < 0 || static_cast<uint64_t>(row) >= rows_)
      throw InvalidArgument("row " + std::to_string(row) + " of the selection is outside " +
                            display_ + "'s " + std::to_string(rows_) + " rows");
}

void TableDataImpl::add_blocks(uint32_t file, const std::vector<uint64_t>& rows,
                               const std::vector<uint64_t>& bytes) {
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i] == 0) continue;  // an empty row group or batch holds no sample
    blocks_.push_back({file, static_cast<int>(i), rows_, rows[i], bytes[i]});
    block_first_.push_back(rows_);
    rows_ += rows[i];
  }
}

void TableDataImpl::size_window_and_cache(const TableSpec& spec) {
  if (blocks_.empty()) return;
  uint64_t total = 0, largest = 0;
  for (const auto& b : blocks_) {
    total += b.bytes;
    largest = std::max(largest, b.bytes);
  }
  const uint64_t n = blocks_.size();
  const uint64_t block_bytes = std::max<uint64_t>(1, total / n);
  if (spec.window_rows > 0)
    window_ = (spec.window_rows * n + rows_ / 2) / rows_;
  else
    window_ = kDefaultWindowBytes / block_bytes;
  window_ = std::clamp<uint64_t>(window_, 1, n);
  // Two windows (the one read and the next, which workers ahead of the consumer open), a
  // margin for decoded data larger than Parquet's uncompressed pages, and a few blocks in flight.
  stats_.cache_bytes = spec.cache_bytes > 0
                           ? spec.cache_bytes
                           : std::max(kMinCacheBytes, 3 * window_ * block_bytes + 4 * largest);
}

Source::Blocks TableDataImpl::blocks() const {
  Source::Blocks out;
  if (!selection_.empty()) return out;
  out.window = window_;
  out.sizes.reserve(blocks_.size());
  for (const auto& b : blocks_) out.sizes.push_back(b.rows);
  return out;
}

std::string TableDataImpl::column_type(const std::string& name) const {
  return schema_->field(column(name))->type()->ToString();
}

int TableDataImpl::column(const std::string& name) const {
  const int at = schema_->GetFieldIndex(name);
  if (at < 0) {
    std::string have;
    for (const auto& n : names_) have += (have.empty() ? "" : ", ") + n;
    throw InvalidArgument(display_ + " has no column '" + name + "' among those read (" + have +
                          ")");
  }
  return at;
}

TableDataImpl::Location TableDataImpl::locate(uint64_t index) const {
  const uint64_t row = selection_.empty() ? index : static_cast<uint64_t>(selection_[index]);
  const auto it = std::upper_bound(block_first_.begin(), block_first_.end(), row);
  const auto b = static_cast<uint64_t>(it - block_first_.begin()) - 1;
  return {b, static_cast<int64_t>(row - block_first_[b])};
}

std::string TableDataImpl::describe_row(uint64_t row) const {
  const auto it = std::upper_bound(block_first_.begin(), block_first_.end(), row);
  const auto b = static_cast<uint64_t>(it - block_first_.begin()) - 1;
  const BlockInfo& info = blocks_[b];
  return basename(paths_[info.file]) + ": " + inputs_[info.file]->block_kind() + " " +
         std::to_string(info.index) + ", row " + std::to_string(row - block_first_[b]);
}

std::string TableDataImpl::describe(uint64_t index) const {
  if (index >= num_rows()) return display_;
  return describe_row(selection_.empty() ? index : static_cast<uint64_t>(selection_[index]));
}

std::shared_ptr<arrow::RecordBatch> TableDataImpl::decode(uint64_t b,
                                                          const std::vector<int>& fields) const {
  const BlockInfo& info = blocks_[b];
  auto batch = inputs_[info.file]->read(info.index, fields);
  // Rows are located by the footer's counts: a block must hold as many as it said.
  if (static_cast<uint64_t>(batch->num_rows()) != info.rows)
    throw DecodeError(paths_[info.file] + ": " + inputs_[info.file]->block_kind() + " " +
                      std::to_string(info.index) + " holds " +
                      std::to_string(batch->num_rows()) + " rows, but the file says " +
                      std::to_string(info.rows));
  return batch;
}

std::shared_ptr<const arrow::RecordBatch> TableDataImpl::block(uint64_t b) const {
  if (views_[b]) return views_[b];
  std::promise<std::shared_ptr<const arrow::RecordBatch>> promise;
  std::unique_lock lock(mu_);
  if (auto it = cache_.find(b); it != cache_.end()) {
    ++stats_.cache_hits;
    lru_.splice(lru_.begin(), lru_, it->second.lru);
    auto batch = it->second.batch;
    lock.unlock();
    return batch.get();  // waits for a decode in flight
  }
  lru_.push_front(b);
  cache_.emplace(b, Entry{promise.get_future().share(), 0, lru_.begin()});
  ++stats_.block_reads;
  lock.unlock();
  std::shared_ptr<const arrow::RecordBatch> batch;
  try {
    batch = decode(b, file_fields_[blocks_[b].file]);
  } catch (...) {
    promise.set_exception(std::current_exception());
    lock.lock();
    auto it = cache_.find(b);
    lru_.erase(it->second.lru);
    cache_.erase(it);  // the next read tries again
    throw;
  }
  promise.set_value(batch);
  const uint64_t bytes = batch_bytes(*batch);
  lock.lock();
  auto& entry = cache_.at(b);
  entry.bytes = bytes;
  stats_.cached_bytes += bytes;
  stats_.cached_bytes_peak = std::max(stats_.cached_bytes_peak, stats_.cached_bytes);
  // Least recently used out first; never the block just decoded, nor one still decoding.
  for (auto it = lru_.end(); stats_.cached_bytes > stats_.cache_bytes && it != lru_.begin();) {
    --it;
    const uint64_t victim = *it;
    Entry& e = cache_.at(victim);
    if (victim == b || e.bytes == 0) continue;
    stats_.cached_bytes -= e.bytes;
    it = lru_.erase(it);
    cache_.erase(victim);
  }
  return batch;
}

TableStats TableDataImpl::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

namespace {

template <typename ArrowType>
void append_integers(const arrow::Array& array, std::vector<int64_t>& out, const std::string& name,
                     const TableDataImpl& data, uint64_t first_row) {
  const auto& a = static_cast<const arrow::NumericArray<ArrowType>&>(array);
  for (int64_t i = 0; i < a.length(); ++i) {
    if (a.IsNull(i))
      throw InvalidArgument(data.describe_row(first_row + i) + ": column '" + name + "' is null");
    out.push_back(static_cast<int64_t>(a.Value(i)));
  }
}

}  // namespace

std::vector<int64_t> TableDataImpl::integer_column(const std::string& name) const {
  const int at = column(name);
  const auto& type = *schema_->field(at)->type();
  if (!arrow::is_integer(type.id()))
    throw InvalidArgument(display_ + ": column '" + name + "' is " + type.ToString() +
                          ", not an integer column");
  std::vector<int64_t> out;
  out.reserve(rows_);
  for (uint64_t b = 0; b < blocks_.size(); ++b) {
    auto batch = views_[b] ? views_[b] : decode(b, {file_fields_[blocks_[b].file][at]});
    const arrow::Array& array = *batch->column(views_[b] ? at : 0);
    const uint64_t first = blocks_[b].first_row;
    switch (type.id()) {
      case arrow::Type::INT8: append_integers<arrow::Int8Type>(array, out, name, *this, first); break;
      case arrow::Type::INT16: append_integers<arrow::Int16Type>(array, out, name, *this, first); break;
      case arrow::Type::INT32: append_integers<arrow::Int32Type>(array, out, name, *this, first); break;
      case arrow::Type::INT64: append_integers<arrow::Int64Type>(array, out, name, *this, first); break;
      case arrow::Type::UINT8: append_integers<arrow::UInt8Type>(array, out, name, *this, first); break;
      case arrow::Type::UINT16: append_integers<arrow::UInt16Type>(array, out, name, *this, first); break;
      case arrow::Type::UINT32: append_integers<arrow::UInt32Type>(array, out, name, *this, first); break;
      default: append_integers<arrow::UInt64Type>(array, out, name, *this, first); break;
    }
  }
  if (selection_.empty()) return out;
  std::vector<int64_t> selected;
  selected.reserve(selection_.size());
  for (int64_t row : selection_) selected.push_back(out[row]);
  return selected;
}

uint64_t TableDataImpl::max_list_length(const std::string& name) const {
  const int at = column(name);
  const auto id = schema_->field(at)->type()->id();
  if (id != arrow::Type::LIST && id != arrow::Type::LARGE_LIST)
    throw InvalidArgument(display_ + ": column '" + name + "' is not a list column");
  uint64_t longest = 0;
  for (uint64_t b = 0; b < blocks_.size(); ++b) {
    auto batch = views_[b] ? views_[b] : decode(b, {file_fields_[blocks_[b].file][at]});
    const arrow::Array& array = *batch->column(views_[b] ? at : 0);
    for (int64_t i = 0; i < array.length(); ++i) {
      const int64_t n = id == arrow::Type::LIST
                            ? static_cast<const arrow::ListArray&>(array).value_length(i)
                            : static_cast<const arrow::LargeListArray&>(array).value_length(i);
      longest = std::max(longest, static_cast<uint64_t>(n));
    }
  }
  return longest;
}

}  // namespace stoker::tables

namespace stoker {

std::shared_ptr<const TableData> TableData::open(TableSpec spec) {
  return std::make_shared<tables::TableDataImpl>(std::move(spec));
}

}  // namespace stoker
