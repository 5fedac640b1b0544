// TableSource (columns as fields) and TableImageFiles (a column of encoded images).
#include <algorithm>
#include <cstring>
#include <fstream>
#include <limits>

#include "stoker/errors.h"
#include "stoker/tables/table.h"
#include "tables/table_data.h"

namespace stoker {

using tables::TableDataImpl;

namespace {

const TableDataImpl& impl(const std::shared_ptr<const TableData>& data, const char* who) {
  if (!data) throw InvalidArgument(std::string(who) + " needs table data");
  return static_cast<const TableDataImpl&>(*data);
}

// Stoker's element type for an Arrow number or bool type; false when it has none.
bool element_dtype(const arrow::DataType& type, DType* out) {
  switch (type.id()) {
    case arrow::Type::BOOL: *out = {DType::kBool, 8}; return true;
    case arrow::Type::INT8: *out = {DType::kInt, 8}; return true;
    case arrow::Type::INT16: *out = {DType::kInt, 16}; return true;
    case arrow::Type::INT32: *out = {DType::kInt, 32}; return true;
    case arrow::Type::INT64: *out = {DType::kInt, 64}; return true;
    case arrow::Type::UINT8: *out = {DType::kUInt, 8}; return true;
    case arrow::Type::UINT16: *out = {DType::kUInt, 16}; return true;
    case arrow::Type::UINT32: *out = {DType::kUInt, 32}; return true;
    case arrow::Type::UINT64: *out = {DType::kUInt, 64}; return true;
    case arrow::Type::HALF_FLOAT: *out = {DType::kFloat, 16}; return true;
    case arrow::Type::FLOAT: *out = {DType::kFloat, 32}; return true;
    case arrow::Type::DOUBLE: *out = {DType::kFloat, 64}; return true;
    default: return false;
  }
}

// `value` in `dtype`, for padding.
void encode(double value, DType dtype, std::byte* out) {
  auto put = [&](auto v) { std::memcpy(out, &v, sizeof v); };
  switch (dtype.code) {
    case DType::kBool: put(static_cast<uint8_t>(value != 0)); return;
    case DType::kInt:
      if (dtype.bits == 8) return put(static_cast<int8_t>(value));
      if (dtype.bits == 16) return put(static_cast<int16_t>(value));
      if (dtype.bits == 32) return put(static_cast<int32_t>(value));
      return put(static_cast<int64_t>(value));
    case DType::kUInt:
      if (dtype.bits == 8) return put(static_cast<uint8_t>(value));
      if (dtype.bits == 16) return put(static_cast<uint16_t>(value));
      if (dtype.bits == 32) return put(static_cast<uint32_t>(value));
      return put(static_cast<uint64_t>(value));
    default:
      if (dtype.bits == 32) return put(static_cast<float>(value));
      if (dtype.bits == 64) return put(value);
      if (value != 0)
        throw InvalidArgument("a float16 column pads with 0 only");  // no half type in C++20
      return put(uint16_t{0});
  }
}

// Copies `count` values from index `first` of a number or bool array (the array's offset
// applied here), checking that none is null.
void copy_values(const arrow::Array& values, int64_t first, int64_t count, DType dtype,
                 std::byte* out, const std::string& column) {
  if (values.null_count() > 0)
    for (int64_t i = first; i < first + count; ++i)
      if (values.IsNull(i)) throw InvalidArgument("column '" + column + "' holds a null value");
  if (dtype.code == DType::kBool) {
    const auto& bools = static_cast<const arrow::BooleanArray&>(values);
    for (int64_t i = 0; i < count; ++i) out[i] = std::byte{bools.Value(first + i)};
    return;
  }
  const auto* base = values.data()->buffers[1]->data();
  std::memcpy(out, base + (values.offset() + first) * dtype.bytes(), count * dtype.bytes());
}

struct TableWorkerState final : WorkerState {
  uint64_t block = std::numeric_limits<uint64_t>::max();
  std::shared_ptr<const arrow::RecordBatch> batch;
};

}  // namespace


TableSource::TableSource(std::shared_ptr<const TableData> data, std::vector<TableColumn> columns)
    : data_(std::move(data)) {
  const TableDataImpl& table = impl(data_, "TableSource");
  if (columns.empty()) throw InvalidArgument("TableSource needs at least one column");
  for (const auto& spec : columns) {
    Column c;
    c.name = spec.name;
    if (spec.sample_index) {
      c.kind = Column::kSampleIndex;
      c.dtype = kInt64;
      fields_.push_back({c.name, kInt64, {}});
      columns_.push_back(std::move(c));
      continue;
    }
    c.index = table.column(spec.name);
    const auto& type = table.field(c.index)->type();
    std::vector<int64_t> shape;
    const arrow::DataType* t = type.get();
    auto cannot = [&](const std::string& why) {
      return InvalidArgument(table.name() + ": column '" + spec.name + "' is " + type->ToString() +
                             ", which " + why);
    };
    if (t->id() == arrow::Type::LIST || t->id() == arrow::Type::LARGE_LIST) {
      c.kind = t->id() == arrow::Type::LIST ? Column::kList : Column::kLargeList;
      t = static_cast<const arrow::BaseListType*>(t)->value_type().get();
      if (!element_dtype(*t, &c.dtype) || c.dtype.code == DType::kBool)
        throw cannot("is not a list of numbers");
      c.values = spec.max_length > 0 ? spec.max_length : table.max_list_length(spec.name);
      if (c.values == 0) throw cannot("holds only empty lists: give max_length");
      c.pad.resize(c.dtype.bytes());
      encode(spec.pad_value, c.dtype, c.pad.data());
      shape.push_back(static_cast<int64_t>(c.values));
    } else {
      while (t->id() == arrow::Type::FIXED_SIZE_LIST) {
        const auto* list = static_cast<const arrow::FixedSizeListType*>(t);
        c.kind = Column::kFixedList;
        shape.push_back(list->list_size());
        c.values *= static_cast<uint64_t>(list->list_size());
        t = list->value_type().get();
      }
      if (!element_dtype(*t, &c.dtype))
        throw cannot(t->id() == arrow::Type::STRING || t->id() == arrow::Type::LARGE_STRING
                         ? "is text: it is not a batch field"
                         : "is not a number, a bool, or a (fixed-size) list of them");
    }
    fields_.push_back({c.name, c.dtype, shape});
    if (c.kind == Column::kList || c.kind == Column::kLargeList)
      fields_.push_back({c.name + "_length", kInt64, {}});
    columns_.push_back(std::move(c));
  }
}

TableSource::~TableSource() = default;

uint64_t TableSource::size() const { return data_->num_rows(); }
std::string TableSource::path(uint64_t index) const { return data_->describe(index); }
Source::Blocks TableSource::blocks() const { return data_->blocks(); }

std::unique_ptr<WorkerState> TableSource::make_worker_state() const {
  return std::make_unique<TableWorkerState>();
}

void TableSource::read(const SampleKey& key, std::span<std::byte* const> slots,
                       WorkerState* state) const {
  const auto& table = static_cast<const TableDataImpl&>(*data_);
  const auto at = table.locate(key.index);
  TableWorkerState local;
  auto* ws = state ? static_cast<TableWorkerState*>(state) : &local;
  if (ws->block != at.block) {  // a thread keeps its last block: no lock while it reads on in it
    ws->batch = nullptr;  // let the cache free it first
    ws->batch = table.block(at.block);
    ws->block = at.block;
  }
  const arrow::RecordBatch& batch = *ws->batch;
  size_t slot = 0;
  for (const Column& c : columns_) {
    if (c.kind == Column::kSampleIndex) {
      const auto index = static_cast<int64_t>(key.index);
      std::memcpy(slots[slot++], &index, sizeof index);
      continue;
    }
    const arrow::Array& array = *batch.column(c.index);
    if (array.IsNull(at.row)) throw InvalidArgument("column '" + c.name + "' is null");
    std::byte* out = slots[slot++];
    switch (c.kind) {
      case Column::kScalar:
        copy_values(array, at.row, 1, c.dtype, out, c.name);
        break;
      case Column::kFixedList: {
        const arrow::Array* a = &array;
        int64_t first = at.row;
        while (a->type_id() == arrow::Type::FIXED_SIZE_LIST) {
          const auto& list = static_cast<const arrow::FixedSizeListArray&>(*a);
          first = list.value_offset(first);
          a = list.values().get();
        }
        copy_values(*a, first, static_cast<int64_t>(c.values), c.dtype, out, c.name);
        break;
      }
      case Column::kSampleIndex:
        break;  // written above
      case Column::kList:
      case Column::kLargeList: {
        int64_t first, length;
        const arrow::Array* values;
        if (c.kind == Column::kList) {
          const auto& list = static_cast<const arrow::ListArray&>(array);
          first = list.value_offset(at.row);
          length = list.value_length(at.row);
          values = list.values().get();
        } else {
          const auto& list = static_cast<const arrow::LargeListArray&>(array);
          first = list.value_offset(at.row);
          length = list.value_length(at.row);
          values = list.values().get();
        }
        const auto kept = std::min<int64_t>(length, static_cast<int64_t>(c.values));
        copy_values(*values, first, kept, c.dtype, out, c.name);
        for (uint64_t i = static_cast<uint64_t>(kept); i < c.values; ++i)
          std::memcpy(out + i * c.dtype.bytes(), c.pad.data(), c.dtype.bytes());
        std::memcpy(slots[slot++], &kept, sizeof kept);
        break;
      }
    }
  }
}

TableImageFiles::TableImageFiles(std::shared_ptr<const TableData> data, std::string image_column,
                                 std::string label_column)
    : data_(std::move(data)), image_column_(std::move(image_column)) {
  const TableDataImpl& table = impl(data_, "TableImageFiles");
  const auto& type = *table.field(table.column(image_column_))->type();
  bool ok = type.id() == arrow::Type::BINARY || type.id() == arrow::Type::LARGE_BINARY;
  if (type.id() == arrow::Type::STRUCT) {
    const auto& st = static_cast<const arrow::StructType&>(type);
    const auto bytes = st.GetFieldByName("bytes");
    ok = bytes && (bytes->type()->id() == arrow::Type::BINARY ||
                   bytes->type()->id() == arrow::Type::LARGE_BINARY);
  }
  if (!ok)
    throw InvalidArgument(table.name() + ": column '" + image_column_ + "' is " +
                          type.ToString() +
                          "; an image column holds encoded images: binary, or a struct with a "
                          "binary \"bytes\" field (Hugging Face's Image)");
  if (!label_column.empty()) labels_ = table.integer_column(label_column);
}

uint64_t TableImageFiles::size() const { return data_->num_rows(); }
std::string TableImageFiles::path(uint64_t i) const { return data_->describe(i); }
Source::Blocks TableImageFiles::blocks() const { return data_->blocks(); }

namespace {

// The bytes of element `row` of a binary or large binary array; false when it is null.
bool binary_view(const arrow::Array& array, int64_t row, std::string_view* out) {
  if (array.IsNull(row)) return false;
  if (array.type_id() == arrow::Type::BINARY)
    *out = static_cast<const arrow::BinaryArray&>(array).GetView(row);
  else
    *out = static_cast<const arrow::LargeBinaryArray&>(array).GetView(row);
  return true;
}

}  // namespace

void TableImageFiles::read(uint64_t i, std::vector<std::byte>& buffer) const {
  const auto& table = static_cast<const TableDataImpl&>(*data_);
  const auto at = table.locate(i);
  const auto batch = table.block(at.block);
  const arrow::Array& column = *batch->column(table.column(image_column_));
  std::string_view bytes;
  if (column.type_id() == arrow::Type::STRUCT) {
    // Hugging Face's Image: {"bytes": binary, "path": string}; bytes null means "read path".
    const auto& st = static_cast<const arrow::StructArray&>(column);
    if (st.IsNull(at.row)) throw InvalidArgument("column '" + image_column_ + "' is null");
    if (!binary_view(*st.GetFieldByName("bytes"), at.row, &bytes)) {
      const auto path = st.GetFieldByName("path");
      if (!path || path->IsNull(at.row))
        throw InvalidArgument("column '" + image_column_ + "' has neither bytes nor a path");
      const std::string file(static_cast<const arrow::StringArray&>(*path).GetView(at.row));
      std::ifstream in(file, std::ios::binary | std::ios::ate);
      if (!in) throw IoError("cannot open " + file + " (the path in column '" + image_column_ +
                             "'): " + std::strerror(errno));
      buffer.resize(static_cast<size_t>(in.tellg()));
      in.seekg(0);
      in.read(reinterpret_cast<char*>(buffer.data()), static_cast<std::streamsize>(buffer.size()));
      if (!in) throw IoError("cannot read " + file);
      return;
    }
  } else if (!binary_view(column, at.row, &bytes)) {
    throw InvalidArgument("column '" + image_column_ + "' is null");
  }
  buffer.resize(bytes.size());
  std::memcpy(buffer.data(), bytes.data(), bytes.size());
}

}  // namespace stoker
