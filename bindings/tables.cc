// The extension module stoker._arrow: the tables wing (src/tables/), apart from stoker._native
// because it links the Arrow C++ libraries of pyarrow (libarrow, libparquet), which a user
// without tables need not install. Its classes derive from stoker._native's (Source,
// ImageFiles), whose module it imports first; nanobind shares their types and the exception
// translation (errors.cc) between the two modules.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "stoker/tables/table.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace stoker::python {
namespace {

using Data = std::shared_ptr<TableData>;  // nanobind holds no shared_ptr<const T>

Data mutable_data(std::shared_ptr<const TableData> data) {
  return std::const_pointer_cast<TableData>(std::move(data));
}

Data open_files(std::vector<std::string> paths, std::vector<std::string> columns,
                uint64_t cache_bytes, uint64_t window_rows, std::vector<int64_t> rows) {
  TableSpec spec;
  spec.rows = std::move(rows);
  spec.paths = std::move(paths);
  spec.columns = std::move(columns);
  spec.cache_bytes = cache_bytes;
  spec.window_rows = window_rows;
  nb::gil_scoped_release release;
  return mutable_data(TableData::open(std::move(spec)));
}

// An object's Arrow C stream (the __arrow_c_stream__ protocol's capsule), consumed.
Data open_stream(nb::object capsule, std::string name, std::vector<std::string> columns,
                 uint64_t cache_bytes, uint64_t window_rows, std::vector<int64_t> rows) {
  auto* stream = static_cast<ArrowArrayStream*>(
      PyCapsule_GetPointer(capsule.ptr(), "arrow_array_stream"));
  if (stream == nullptr) throw nb::python_error();
  TableSpec spec;
  spec.stream = stream;
  spec.rows = std::move(rows);
  spec.stream_name = std::move(name);
  spec.columns = std::move(columns);
  spec.cache_bytes = cache_bytes;
  spec.window_rows = window_rows;
  nb::gil_scoped_release release;  // the producer takes the GIL itself if it needs it
  return mutable_data(TableData::open(std::move(spec)));
}

nb::object int64_array(std::vector<int64_t> values) {
  auto* v = new std::vector<int64_t>(std::move(values));
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  return nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>(v->data(), {v->size()}, owner).cast();
}

}  // namespace
}  // namespace stoker::python

NB_MODULE(_arrow, m) {
  using namespace stoker;
  using namespace stoker::python;
  m.doc() = "Stoker's tables: Parquet, Arrow IPC and Arrow streams, read with Arrow C++";
  nb::module_::import_("stoker._native");  // Source, ImageFiles, the exception translator

  nb::class_<TableData>(m, "TableData")
      .def_static("open", &open_files, "paths"_a, "columns"_a, "cache_bytes"_a = 0,
                  "window_rows"_a = 0, "rows"_a = std::vector<int64_t>{},
                  "Parquet / Arrow IPC files as one table (rows: a selection, in order).")
      .def_static("from_stream", &open_stream, "capsule"_a, "name"_a, "columns"_a,
                  "cache_bytes"_a = 0, "window_rows"_a = 0, "rows"_a = std::vector<int64_t>{},
                  "An Arrow C stream (an __arrow_c_stream__ capsule), consumed.")
      .def("__len__", &TableData::num_rows)
      .def_prop_ro("column_names", &TableData::column_names)
      .def("column_type", &TableData::column_type, "name"_a)
      .def("describe", &TableData::describe, "row"_a)
      .def_prop_ro("blocks",
                   [](const TableData& d) {
                     auto b = d.blocks();
                     return nb::make_tuple(b.sizes, b.window);
                   },
                   "(rows of each block, blocks per shuffle window)")
      .def("integer_column",
           [](const TableData& d, const std::string& name) {
             std::vector<int64_t> v;
             {
               nb::gil_scoped_release release;
               v = d.integer_column(name);
             }
             return int64_array(std::move(v));
           },
           "name"_a)
      .def("stats", [](const TableData& d) {
        const TableStats s = d.stats();
        nb::dict out;
        out["block_reads"] = s.block_reads;
        out["cache_hits"] = s.cache_hits;
        out["cached_bytes"] = s.cached_bytes;
        out["cached_bytes_peak"] = s.cached_bytes_peak;
        out["cache_bytes"] = s.cache_bytes;
        return out;
      });

  nb::class_<TableSource, Source>(m, "TableSource")
      .def(nb::new_([](Data data,
                       const std::vector<std::tuple<std::string, uint64_t, double, bool>>& cols) {
             std::vector<TableColumn> columns;
             for (const auto& [name, max_length, pad, index] : cols)
               columns.push_back({name, max_length, pad, index});
             nb::gil_scoped_release release;  // may scan a list column for its longest list
             return std::make_shared<TableSource>(std::move(data), std::move(columns));
           }),
           "data"_a, "columns"_a,
           "columns: (name, max_length or 0, pad value, sample index field) each");

  nb::class_<TableImageFiles, ImageFiles>(m, "TableImageFiles")
      .def(nb::new_([](Data data, std::string image, std::string label) {
             nb::gil_scoped_release release;  // reads the label column
             return std::make_shared<TableImageFiles>(std::move(data), std::move(image),
                                                      std::move(label));
           }),
           "data"_a, "image"_a, "label"_a);
}
