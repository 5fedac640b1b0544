#include "stoker/tables/table.h"

#include <arrow/api.h>
#include <arrow/c/bridge.h>
#include <arrow/io/file.h>
#include <arrow/ipc/writer.h>
#include <gtest/gtest.h>
#include <parquet/arrow/writer.h>
#include <parquet/file_reader.h>
#include <parquet/metadata.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "stoker/block_order.h"
#include "engine/test_temp_dir.h"
#include "image/test_images.h"
#include "stoker/errors.h"
#include "stoker/engine.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

template <typename T>
T ok(arrow::Result<T> r) {
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return std::move(r).ValueOrDie();
}

// Rows i = 0..n-1: id = i (int64), x = i / 2 (float64), v = [i, i+1, i+2] (fixed float32 x3),
// tokens = [i, i+1, ...] of length i % 7 (list<int32>), flag = i % 3 == 0 (bool).
std::shared_ptr<arrow::Table> numbers(int n) {
  arrow::Int64Builder id;
  arrow::DoubleBuilder x;
  auto v_values = std::make_shared<arrow::FloatBuilder>();
  arrow::FixedSizeListBuilder v(arrow::default_memory_pool(), v_values, 3);
  auto t_values = std::make_shared<arrow::Int32Builder>();
  arrow::ListBuilder tokens(arrow::default_memory_pool(), t_values);
  arrow::BooleanBuilder flag;
  for (int i = 0; i < n; ++i) {
    EXPECT_TRUE(id.Append(i).ok());
    EXPECT_TRUE(x.Append(i / 2.0).ok());
    EXPECT_TRUE(v.Append().ok());
    for (int k = 0; k < 3; ++k) EXPECT_TRUE(v_values->Append(static_cast<float>(i + k)).ok());
    EXPECT_TRUE(tokens.Append().ok());
    for (int k = 0; k < i % 7; ++k) EXPECT_TRUE(t_values->Append(i + k).ok());
    EXPECT_TRUE(flag.Append(i % 3 == 0).ok());
  }
  auto schema =
      arrow::schema({arrow::field("id", arrow::int64()), arrow::field("x", arrow::float64()),
                     arrow::field("v", arrow::fixed_size_list(arrow::float32(), 3)),
                     arrow::field("tokens", arrow::list(arrow::int32())),
                     arrow::field("flag", arrow::boolean())});
  return arrow::Table::Make(schema, {ok(id.Finish()), ok(x.Finish()), ok(v.Finish()),
                                     ok(tokens.Finish()), ok(flag.Finish())});
}

void write_parquet(const arrow::Table& table, const std::string& path, int64_t row_group) {
  auto out = ok(arrow::io::FileOutputStream::Open(path));
  // As pyarrow writes: with the Arrow schema, so that fixed-size lists read back as such.
  auto arrow_props = parquet::ArrowWriterProperties::Builder().store_schema()->build();
  ASSERT_TRUE(parquet::arrow::WriteTable(table, arrow::default_memory_pool(), out, row_group,
                                         parquet::default_writer_properties(), arrow_props)
                  .ok());
  ASSERT_TRUE(out->Close().ok());
}

void write_ipc(const arrow::Table& table, const std::string& path, int64_t batch_rows,
               bool stream) {
  auto out = ok(arrow::io::FileOutputStream::Open(path));
  auto writer = stream ? ok(arrow::ipc::MakeStreamWriter(out, table.schema()))
                       : ok(arrow::ipc::MakeFileWriter(out, table.schema()));
  ASSERT_TRUE(writer->WriteTable(table, batch_rows).ok());
  ASSERT_TRUE(writer->Close().ok());
  ASSERT_TRUE(out->Close().ok());
}

std::shared_ptr<const TableData> open_files(std::vector<std::string> paths,
                                            std::vector<std::string> columns = {}) {
  TableSpec spec;
  spec.paths = std::move(paths);
  spec.columns = std::move(columns);
  return TableData::open(std::move(spec));
}

struct Sample {
  std::vector<std::vector<std::byte>> fields;
  template <typename T>
  T at(size_t f, size_t k = 0) const {
    T v;
    std::memcpy(&v, fields[f].data() + k * sizeof(T), sizeof(T));
    return v;
  }
};

Sample read(const Source& src, uint64_t i) {
  Sample s;
  std::vector<std::byte*> slots;
  for (const auto& f : src.fields()) s.fields.emplace_back(f.sample_bytes());
  for (auto& f : s.fields) slots.push_back(f.data());
  auto state = src.make_worker_state();
  src.read({0, 0, i}, slots, state.get());
  return s;
}

std::vector<TableColumn> all_columns(uint64_t max_length = 0) {
  return {{"id"}, {"x"}, {"v"}, {"tokens", max_length, -1}, {"flag"}};
}

void expect_row(const Source& src, uint64_t i, uint64_t max_length) {
  const Sample s = read(src, i);
  EXPECT_EQ(s.at<int64_t>(0), static_cast<int64_t>(i));
  EXPECT_EQ(s.at<double>(1), i / 2.0);
  for (int k = 0; k < 3; ++k) EXPECT_EQ(s.at<float>(2, k), static_cast<float>(i + k));
  const uint64_t len = std::min<uint64_t>(i % 7, max_length);
  for (uint64_t k = 0; k < max_length; ++k)
    EXPECT_EQ(s.at<int32_t>(3, k), k < len ? static_cast<int32_t>(i + k) : -1) << i << " " << k;
  EXPECT_EQ(s.at<int64_t>(4), static_cast<int64_t>(len));
  EXPECT_EQ(s.at<uint8_t>(5), i % 3 == 0 ? 1 : 0);
}

class Tables : public ::testing::Test {
 protected:
  testing::TempDir dir_;
  std::string path(const std::string& name) { return dir_.path(name); }
};

TEST_F(Tables, ParquetColumnsBecomeFields) {
  write_parquet(*numbers(250), path("a.parquet"), 64);
  auto data = open_files({path("a.parquet")});
  EXPECT_EQ(data->num_rows(), 250u);
  TableSource src(data, all_columns());
  ASSERT_EQ(src.fields().size(), 6u);
  EXPECT_EQ(src.fields()[2].shape, std::vector<int64_t>{3});
  EXPECT_EQ(src.fields()[3].shape, std::vector<int64_t>{6});  // the longest list
  EXPECT_EQ(src.fields()[4].name, "tokens_length");
  EXPECT_EQ(src.fields()[5].dtype, (DType{DType::kBool, 8}));
  for (uint64_t i = 0; i < 250; ++i) expect_row(src, i, 6);
  EXPECT_EQ(src.blocks().sizes, (std::vector<uint64_t>{64, 64, 64, 58}));
  EXPECT_EQ(src.path(130), "a.parquet: row group 2, row 2");
  // Cut lists: max_length 2 keeps two tokens, and the length says so.
  TableSource cut(data, all_columns(2));
  for (uint64_t i = 0; i < 250; ++i) expect_row(cut, i, 2);
}

TEST_F(Tables, IpcFilesAndStreamsReadAlike) {
  const auto table = numbers(300);
  write_ipc(*table, path("f.arrow"), 100, false);
  write_ipc(*table, path("s.arrow"), 70, true);
  for (const char* name : {"f.arrow", "s.arrow"}) {
    auto data = open_files({path(name)}, {"id", "x", "v", "tokens", "flag"});
    TableSource src(data, all_columns());
    for (uint64_t i = 0; i < 300; ++i) expect_row(src, i, 6);
    EXPECT_EQ(data->stats().block_reads, 0u) << "mapped batches are views, never decoded";
  }
  EXPECT_EQ(open_files({path("s.arrow")})->blocks().sizes.size(), 5u);
  EXPECT_EQ(open_files({path("s.arrow")})->describe(75), "s.arrow: record batch 1, row 5");
}

TEST_F(Tables, AnImportedStreamIsRead) {
  auto reader = ok(arrow::TableBatchReader(numbers(90)).ToRecordBatches());
  auto rbr = ok(arrow::RecordBatchReader::Make(reader, numbers(1)->schema()));
  ArrowArrayStream stream;
  ASSERT_TRUE(arrow::ExportRecordBatchReader(rbr, &stream).ok());
  TableSpec spec;
  spec.stream = &stream;
  auto data = TableData::open(spec);
  EXPECT_EQ(stream.release, nullptr) << "the stream is consumed";
  TableSource src(data, all_columns());
  for (uint64_t i = 0; i < 90; ++i) expect_row(src, i, 6);
}

TEST_F(Tables, ASelectionPicksRowsAndDropsTheBlocks) {
  write_parquet(*numbers(100), path("a.parquet"), 30);
  TableSpec spec;
  spec.paths = {path("a.parquet")};
  spec.rows = {99, 3, 3, 40};
  auto data = TableData::open(spec);
  TableSource src(data, all_columns(6));
  ASSERT_EQ(src.size(), 4u);
  EXPECT_EQ(read(src, 0).at<int64_t>(0), 99);
  EXPECT_EQ(read(src, 2).at<int64_t>(0), 3);
  EXPECT_EQ(src.path(3), "a.parquet: row group 1, row 10");
  EXPECT_TRUE(src.blocks().sizes.empty());
  spec.rows = {100};
  EXPECT_THROW(TableData::open(spec), InvalidArgument);
}

TEST_F(Tables, ManyFilesAreOneTable) {
  const auto table = numbers(200);
  write_parquet(*table->Slice(0, 120), path("p0.parquet"), 50);
  write_ipc(*table->Slice(120), path("p1.arrow"), 40, false);
  auto data = open_files({path("p0.parquet"), path("p1.arrow")});
  TableSource src(data, all_columns(6));
  for (uint64_t i = 0; i < 200; ++i) expect_row(src, i, 6);
  EXPECT_EQ(src.blocks().sizes, (std::vector<uint64_t>{50, 50, 20, 40, 40}));
  EXPECT_EQ(src.path(130), "p1.arrow: record batch 0, row 10");
}

// A shuffled epoch through the loader: every row once, in the block order, and with the default
// cache each row group is decoded once.
TEST_F(Tables, ShuffledEpochDecodesEachRowGroupOnce) {
  write_parquet(*numbers(1000), path("a.parquet"), 50);
  TableSpec spec;
  spec.paths = {path("a.parquet")};
  spec.window_rows = 200;  // four row groups a window
  auto data = TableData::open(spec);
  EXPECT_EQ(data->blocks().window, 4u);
  auto src = std::make_shared<TableSource>(data, std::vector<TableColumn>{{"id"}});
  EngineOptions o;
  o.batch_size = 32;
  o.shuffle = true;
  o.num_workers = 2;
  Engine loader(src, o);
  std::vector<int64_t> seen;
  auto it = loader.iterate(0);
  while (auto b = it->next()) {
    const auto* v = reinterpret_cast<const int64_t*>(b->fields[0].data);
    seen.insert(seen.end(), v, v + b->length);
  }
  const BlockOrder order(data->blocks().sizes, 4, 0, 0);
  ASSERT_EQ(seen.size(), 1000u);
  for (uint64_t p = 0; p < 1000; ++p) ASSERT_EQ(static_cast<uint64_t>(seen[p]), order[p]);
  EXPECT_EQ(data->stats().block_reads, 20u);
}

TEST_F(Tables, TheCacheStaysWithinItsBytes) {
  write_parquet(*numbers(2000), path("a.parquet"), 100);
  TableSpec spec;
  spec.paths = {path("a.parquet")};
  spec.cache_bytes = 8 << 10;  // about three row groups of "id"
  spec.columns = {"id"};
  auto data = TableData::open(spec);
  TableSource src(data, {{"id"}});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (uint64_t i = t; i < 2000; i += 7)
        EXPECT_EQ(read(src, (i * 37) % 2000).at<int64_t>(0), static_cast<int64_t>((i * 37) % 2000));
    });
  for (auto& t : threads) t.join();
  const TableStats s = data->stats();
  EXPECT_GT(s.block_reads, 20u);  // random access re-decodes what left the cache
  EXPECT_LE(s.cached_bytes, s.cache_bytes + 1000 * sizeof(int64_t));
  EXPECT_LE(s.cached_bytes_peak, s.cache_bytes + 1000 * sizeof(int64_t));
}

TEST_F(Tables, ImageColumnsAndLabels) {
  // An image column of JPEG and PNG bytes, HF's {bytes, path} struct, and a label column.
  std::vector<std::vector<std::byte>> images;
  for (int i = 0; i < 6; ++i) {
    const auto rgb = image::testing::pattern_rgb(16 + i, 12, i);
    images.push_back(i % 2 ? image::testing::encode_png(rgb.data(), (16 + i) * 3, 16 + i, 12, 2, 8)
                           : image::testing::encode_jpeg(rgb.data(), 16 + i, 12, 3));
  }
  const std::string on_disk = path("disk.jpg");
  std::ofstream(on_disk, std::ios::binary)
      .write(reinterpret_cast<const char*>(images[0].data()), images[0].size());
  arrow::BinaryBuilder raw;
  auto bytes = std::make_shared<arrow::BinaryBuilder>();
  auto paths = std::make_shared<arrow::StringBuilder>();
  auto hf_type =
      arrow::struct_({arrow::field("bytes", arrow::binary()), arrow::field("path", arrow::utf8())});
  arrow::StructBuilder hf(hf_type, arrow::default_memory_pool(), {bytes, paths});
  arrow::Int64Builder label;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(raw.Append(reinterpret_cast<const uint8_t*>(images[i].data()),
                           static_cast<int32_t>(images[i].size()))
                    .ok());
    ASSERT_TRUE(hf.Append().ok());
    if (i == 5) {  // bytes null: the image is the file at path
      ASSERT_TRUE(bytes->AppendNull().ok());
      ASSERT_TRUE(paths->Append(on_disk).ok());
    } else {
      ASSERT_TRUE(bytes
                      ->Append(reinterpret_cast<const uint8_t*>(images[i].data()),
                               static_cast<int32_t>(images[i].size()))
                      .ok());
      ASSERT_TRUE(paths->Append("x.jpg").ok());
    }
    ASSERT_TRUE(label.Append(10 + i).ok());
  }
  auto table = arrow::Table::Make(
      arrow::schema({arrow::field("raw", arrow::binary()), arrow::field("image", hf_type),
                     arrow::field("label", arrow::int64())}),
      {ok(raw.Finish()), ok(hf.Finish()), ok(label.Finish())});
  write_parquet(*table, path("img.parquet"), 4);
  auto data = open_files({path("img.parquet")});
  for (const char* column : {"raw", "image"}) {
    TableImageFiles files(data, column, "label");
    ASSERT_EQ(files.size(), 6u);
    std::vector<std::byte> buf;
    for (int i = 0; i < 6; ++i) {
      files.read(i, buf);
      EXPECT_EQ(buf, images[std::string(column) == "image" && i == 5 ? 0 : i]) << column << i;
      EXPECT_EQ(files.label(i), 10 + i);
    }
    EXPECT_EQ(files.path(5), "img.parquet: row group 1, row 1");
  }
  EXPECT_EQ(TableImageFiles(data, "raw", "").label(3), 0);
  try {
    TableImageFiles(data, "label", "");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("column 'label' is int64"), std::string::npos) << e.what();
  }
  try {
    TableImageFiles(data, "raw", "raw");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'raw' is binary, not an integer"), std::string::npos)
        << e.what();
  }
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "no error";
}

TEST_F(Tables, BadFilesAndColumnsSayWhatAndWhere) {
  write_parquet(*numbers(100), path("a.parquet"), 30);
  // A missing column names the file and the columns it has.
  EXPECT_NE(message_of([&] {
              open_files({path("a.parquet")}, {"nope"});
            }).find("a.parquet has no column 'nope' (its columns: id, x, v, tokens, flag)"),
            std::string::npos);
  // A truncated file names the file.
  const auto size = fs::file_size(path("a.parquet"));
  fs::copy_file(path("a.parquet"), path("cut.parquet"));
  fs::resize_file(path("cut.parquet"), size / 2);
  const auto cut = message_of([&] { open_files({path("cut.parquet")}); });
  EXPECT_NE(cut.find("cut.parquet is not a readable Parquet file"), std::string::npos) << cut;
  std::ofstream(path("junk.parquet")) << "hello";
  EXPECT_NE(message_of([&] {
              open_files({path("junk.parquet")});
            }).find("junk.parquet is neither a Parquet file nor an Arrow IPC file"),
            std::string::npos);
  EXPECT_THROW(open_files({path("missing.parquet")}), IoError);
  // Files whose columns differ in type.
  auto other = arrow::Table::Make(arrow::schema({arrow::field("id", arrow::utf8())}),
                                  {ok(arrow::StringBuilder().Finish())});
  write_parquet(*other, path("b.parquet"), 10);
  const auto differ =
      message_of([&] { open_files({path("a.parquet"), path("b.parquet")}, {"id"}); });
  EXPECT_NE(differ.find("b.parquet: column 'id' is string but"), std::string::npos) << differ;
  // A text column is not a batch field.
  auto text = arrow::Table::Make(arrow::schema({arrow::field("s", arrow::utf8())}),
                                 {ok(arrow::StringBuilder().Finish())});
  write_parquet(*text, path("t.parquet"), 10);
  EXPECT_NE(message_of([&] {
              TableSource(open_files({path("t.parquet")}), {{"s"}});
            }).find("column 's' is string, which is text"),
            std::string::npos);
}

TEST_F(Tables, NullsAndCorruptRowGroupsFailTheirSamplesOnly) {
  arrow::Int64Builder b;
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(i == 33 ? b.AppendNull().ok() : b.Append(i).ok());
  auto table =
      arrow::Table::Make(arrow::schema({arrow::field("id", arrow::int64())}), {ok(b.Finish())});
  write_parquet(*table, path("n.parquet"), 20);
  TableSource src(open_files({path("n.parquet")}), {{"id"}});
  EXPECT_EQ(read(src, 32).at<int64_t>(0), 32);
  EXPECT_NE(message_of([&] { read(src, 33); }).find("column 'id' is null"), std::string::npos);
  // Row group 1's pages overwritten with junk: its rows fail, row group 0's still read.
  std::fstream f(path("n.parquet"), std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  // Row group 1's column chunk, from the footer: overwrite it.
  auto meta = parquet::ParquetFileReader::OpenFile(path("n.parquet"))->metadata();
  auto chunk = meta->RowGroup(1)->ColumnChunk(0);
  const auto first = static_cast<size_t>(
      chunk->has_dictionary_page() ? chunk->dictionary_page_offset() : chunk->data_page_offset());
  for (size_t k = first; k < first + static_cast<size_t>(chunk->total_compressed_size()); ++k)
    bytes[k] = 'Z';
  f.seekp(0);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  TableSource broken(open_files({path("n.parquet")}), {{"id"}});
  int failed = 0;
  for (uint64_t i = 0; i < 40; ++i) {
    const std::string m = message_of([&] { read(broken, i); });
    if (m != "no error") {
      ++failed;
      EXPECT_NE(m.find("n.parquet: row group 1 cannot be decoded"), std::string::npos) << m;
      EXPECT_GE(i, 20u);
    }
  }
  EXPECT_EQ(failed, 20);
}

}  // namespace
}  // namespace stoker
