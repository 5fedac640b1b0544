// Internal: TableData's implementation, for the table sources (table_source.cc).
#pragma once

#include <arrow/api.h>

#include <condition_variable>
#include <cstdint>
#include <future>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "stoker/tables/table.h"

namespace stoker::tables {

// Where a block's rows come from.
struct BlockInfo {
  uint32_t file = 0;       // index into the files (0 for a stream)
  int index = 0;           // row group (Parquet) or record batch (IPC, stream) in its file
  uint64_t first_row = 0;  // in the table
  uint64_t rows = 0;
  uint64_t bytes = 0;  // the chosen columns' size: decoded (Parquet metadata), or in memory
};

// One input: a Parquet file (decoded per row group), or batches in memory (IPC mapped, stream).
class Input {
 public:
  virtual ~Input() = default;
  // The chosen columns of block `index`, decoded. Safe from any thread.
  virtual std::shared_ptr<arrow::RecordBatch> read(int index,
                                                  const std::vector<int>& fields) const = 0;
  virtual bool cached() const = 0;  // blocks are decoded (true) or views of memory (false)
  virtual const char* block_kind() const = 0;  // "row group", "record batch"
};

class TableDataImpl final : public TableData {
 public:
  explicit TableDataImpl(TableSpec spec);

  uint64_t num_rows() const override { return selection_.empty() ? rows_ : selection_.size(); }
  const std::vector<std::string>& column_names() const override { return names_; }
  std::string column_type(const std::string& name) const override;
  std::string describe(uint64_t row) const override;
  Source::Blocks blocks() const override;
  TableStats stats() const override;
  std::vector<int64_t> integer_column(const std::string& name) const override;
  uint64_t max_list_length(const std::string& name) const override;

  // The block holding sample `index`'s row and the row's place in it.
  struct Location {
    uint64_t block;
    int64_t row;
  };
  Location locate(uint64_t row) const;
  // Block b's chosen columns (in column_names() order), from the cache or decoded now.
  std::shared_ptr<const arrow::RecordBatch> block(uint64_t b) const;
  // describe() for a row of the table (not of the selection).
  std::string describe_row(uint64_t row) const;
  // Column `name`'s position in column_names(); InvalidArgument naming the table if absent.
  int column(const std::string& name) const;
  const std::shared_ptr<arrow::Field>& field(int column) const { return schema_->field(column); }
  // "file.parquet" or the stream's name: what messages call the table.
  const std::string& name() const { return display_; }

 private:
  // Block b's columns `fields` (schema positions), decoded without the cache.
  std::shared_ptr<arrow::RecordBatch> decode(uint64_t b, const std::vector<int>& fields) const;
  void open_file(uint32_t file, const std::string& path);
  void add_blocks(uint32_t file, const std::vector<uint64_t>& rows,
                  const std::vector<uint64_t>& bytes);
  void size_window_and_cache(const TableSpec& spec);

  std::vector<std::string> paths_;  // or the stream's name
  std::string display_;
  std::vector<std::unique_ptr<Input>> inputs_;  // one per file (or the stream)
  std::vector<std::vector<int>> file_fields_;   // per file: its schema positions of the columns
  std::shared_ptr<arrow::Schema> schema_;       // the chosen columns
  std::vector<std::string> names_;
  std::vector<BlockInfo> blocks_;
  std::vector<uint64_t> block_first_;  // blocks_[b].first_row, for the binary search
  std::vector<std::shared_ptr<arrow::RecordBatch>> views_;  // blocks in memory; null: decoded
  uint64_t rows_ = 0;                // in the table
  std::vector<int64_t> selection_;  // sample -> row, when given
  uint64_t window_ = 1;  // blocks per shuffle window

  // The cache of decoded blocks (LRU), for inputs whose blocks are decoded.
  struct Entry {
    std::shared_future<std::shared_ptr<const arrow::RecordBatch>> batch;
    uint64_t bytes = 0;  // 0 while decoding
    std::list<uint64_t>::iterator lru;
  };
  mutable std::mutex mu_;
  mutable std::map<uint64_t, Entry> cache_;
  mutable std::list<uint64_t> lru_;  // most recent first
  mutable TableStats stats_;
};

// The decoded size of a record batch: its buffers' bytes (a slice counts what it spans).
uint64_t batch_bytes(const arrow::RecordBatch& batch);

}  // namespace stoker::tables
