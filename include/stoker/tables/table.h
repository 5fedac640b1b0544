// Tables: the rows of Parquet files, Arrow IPC files (HF datasets' cache files) or an in-memory
// Arrow table as samples, read with the Arrow C++ libraries (the ones pyarrow ships).
//
// TableData holds a table's blocks and a cache of decoded ones:
// - Parquet: a block is a row group. Worker threads decode the row groups they need (only the
//   chosen columns) on their own thread, into a cache of at most `cache_bytes` of decoded
//   Arrow data, least recently used out first. Files are read with pread; their footers are
//   parsed once, at open.
// - Arrow IPC (file or stream format): a block is a record batch; the file is memory-mapped and
//   its batches are zero-copy views of the mapping, so nothing is cached (the page cache is).
//   Compressed IPC bodies are decompressed at open.
// - An Arrow C stream (pyarrow.Table, polars, DuckDB, HF datasets' in-memory tables): a block is
//   a record batch, kept as imported (zero-copy).
// A shuffled loader visits the blocks in a BlockOrder (block_order.h) whose window is
// `window_rows` rows of whole blocks, so that each block is decoded once per epoch when the
// cache holds two windows (the default cache does). Random access without that order (a
// stratified order, row selections) re-decodes a block whenever it has left the cache; stats()
// counts the decodes.
//
// TableSource: columns as batch fields. A fixed-width number or bool column is a scalar field; a
// fixed-size list of numbers (nested to any depth) a field of that shape; a variable-length list
// of numbers (token ids) a field of max_length values, padded with pad_value (longer lists are
// cut), plus an int64 field "<name>_length" with the length kept.
// TableImageFiles: a column of encoded images (binary, large binary, or HF's Image struct with a
// "bytes" field) and an integer label column, for ImageSource's fused decode and transform.
//
// Contract:
// - Thread safety: TableData, TableSource and TableImageFiles are safe to use from any number of
//   threads; decoding a block that another thread is decoding waits for that thread's result.
// - Ownership: the data keeps its files open (and mapped) for its lifetime; an imported stream is
//   released at construction, its batches owned here.
// - Errors: construction throws IoError for a file that cannot be opened, InvalidArgument naming
//   the file for one that is not a readable Parquet/IPC file (truncated, corrupt footer), for a
//   missing column, a column of a type that cannot be batched, or files whose columns differ.
//   Reading a sample throws (the loader names the sample with path(): "file: row group g, row
//   r") DecodeError naming the file and row group for a row group that cannot be decoded, and
//   InvalidArgument naming the column for a null value.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stoker/source.h"
#include "stoker/sources/image_files.h"

struct ArrowArrayStream;  // Arrow's C stream interface (arrow/c/abi.h)

namespace stoker {

struct TableSpec {
  // Parquet (.parquet, .pq) or Arrow IPC (.arrow, .feather, .ipc, HF's cache files) files, all
  // with the chosen columns at the same types; or, with no paths, `stream`.
  std::vector<std::string> paths;
  ArrowArrayStream* stream = nullptr;  // consumed (released) at construction
  std::string stream_name = "table";   // names the stream in messages
  std::vector<std::string> columns;    // the columns read; empty = every column
  uint64_t cache_bytes = 0;            // decoded row groups kept; 0 = two windows and a margin
  uint64_t window_rows = 0;  // rows a shuffled epoch keeps together; 0 = ~256 MiB of data
  // The table's rows to use, in this order (an HF dataset's indices mapping); empty = all. With
  // a selection, samples are independent (no blocks): see above on random access.
  std::vector<int64_t> rows;
};

struct TableStats {
  uint64_t block_reads = 0;   // blocks decoded (Parquet row groups)
  uint64_t cache_hits = 0;    // block lookups served by the cache (or by a decode in flight)
  uint64_t cached_bytes = 0;  // decoded data in the cache now
  uint64_t cached_bytes_peak = 0;
  uint64_t cache_bytes = 0;   // the cache's limit
};

// The data of a table: its blocks, columns and cache. Opaque: see src/tables/table_data.h.
class TableData {
 public:
  static std::shared_ptr<const TableData> open(TableSpec spec);
  virtual ~TableData() = default;

  virtual uint64_t num_rows() const = 0;
  virtual const std::vector<std::string>& column_names() const = 0;
  // The Arrow type of a column, as Arrow prints it ("int64", "list<item: int32>").
  virtual std::string column_type(const std::string& name) const = 0;
  // "file: row group g, row r" (Parquet), "file: record batch b, row r" (IPC), "stream: ...".
  virtual std::string describe(uint64_t row) const = 0;
  virtual Source::Blocks blocks() const = 0;
  virtual TableStats stats() const = 0;
  // Every value of an integer column, in row order (decoding only that column).
  virtual std::vector<int64_t> integer_column(const std::string& name) const = 0;
  // The longest list of a list column (decoding only that column).
  virtual uint64_t max_list_length(const std::string& name) const = 0;
};

struct TableColumn {
  std::string name;
  uint64_t max_length = 0;  // variable-length lists: values kept per sample; 0 = the longest
  double pad_value = 0;     // variable-length lists: what fills the rest
  // Not a column of the table: an int64 field `name` holding each sample's index (a front that
  // returns text columns looks the batch's rows up in them).
  bool sample_index = false;
};

class TableSource final : public Source {
 public:
  // REQUIRES: data is not null; columns not empty, each a column of data (InvalidArgument
  // otherwise, naming the column and its type when it cannot be batched).
  TableSource(std::shared_ptr<const TableData> data, std::vector<TableColumn> columns);
  ~TableSource() override;

  uint64_t size() const override;
  const std::vector<FieldSpec>& fields() const override { return fields_; }
  void read(const SampleKey& key, std::span<std::byte* const> slots,
            WorkerState* state) const override;
  std::unique_ptr<WorkerState> make_worker_state() const override;
  std::string path(uint64_t index) const override;
  Blocks blocks() const override;
  const TableData& data() const { return *data_; }

 private:
  struct Column {  // how a column becomes fields
    int index = 0;  // among the data's columns
    std::string name;
    enum Kind { kScalar, kFixedList, kList, kLargeList, kSampleIndex } kind = kScalar;
    DType dtype;
    uint64_t values = 1;         // per sample: 1, the fixed lists' product, or max_length
    std::vector<std::byte> pad;  // one value, for kList/kLargeList
  };

  std::shared_ptr<const TableData> data_;
  std::vector<Column> columns_;
  std::vector<FieldSpec> fields_;
};

class TableImageFiles final : public ImageFiles {
 public:
  // REQUIRES: data not null; image_column a binary, large binary or struct-with-"bytes" column;
  // label_column empty (every label 0) or an integer column with no nulls (InvalidArgument
  // naming the column otherwise). The labels are read here, decoding only their column.
  TableImageFiles(std::shared_ptr<const TableData> data, std::string image_column,
                  std::string label_column);

  uint64_t size() const override;
  int64_t label(uint64_t i) const override { return labels_.empty() ? 0 : labels_[i]; }
  std::string path(uint64_t i) const override;
  void read(uint64_t i, std::vector<std::byte>& buffer) const override;
  Source::Blocks blocks() const override;
  const TableData& data() const { return *data_; }

 private:
  std::shared_ptr<const TableData> data_;
  std::string image_column_;
  std::vector<int64_t> labels_;
};

}  // namespace stoker
