// ArrowRows: a record batch received through the Arrow C data interface (a struct array whose
// children are the columns), read row by row: a column's value as a string (a text field) or as
// JSON text (a conversation's messages, a row's tools), without the Arrow libraries.
//
// Types read: null, bool, the integers, float32/64, utf8/large_utf8, binary/large_binary (as
// strings), list/large_list, fixed-size list, struct, and the JSON extension type ("arrow.json",
// strings of JSON text, which Hugging Face datasets writes for values of varying structure: read
// as the JSON they hold). Any other type (a map, a union) is refused when the value is read
// (InvalidArgument naming the column and the format), as is a dictionary-encoded column.
//
// Thread safety: immutable after construction; value reads are safe from many threads.
// Ownership: takes the ArrowArray and ArrowSchema (moved out: the caller's are left released) and
// calls their release callbacks when destroyed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

struct ArrowSchema {
  const char* format;
  const char* name;
  const char* metadata;
  int64_t flags;
  int64_t n_children;
  ArrowSchema** children;
  ArrowSchema* dictionary;
  void (*release)(ArrowSchema*);
  void* private_data;
};

struct ArrowArray {
  int64_t length;
  int64_t null_count;
  int64_t offset;
  int64_t n_buffers;
  int64_t n_children;
  const void** buffers;
  ArrowArray** children;
  ArrowArray* dictionary;
  void (*release)(ArrowArray*);
  void* private_data;
};

namespace stoker::text {

class ArrowRows {
 public:
  // REQUIRES: a struct array ("+s") and its schema. Throws InvalidArgument otherwise.
  ArrowRows(ArrowArray* array, ArrowSchema* schema);
  ~ArrowRows();
  ArrowRows(const ArrowRows&) = delete;
  ArrowRows& operator=(const ArrowRows&) = delete;

  uint64_t size() const { return static_cast<uint64_t>(array_.length); }
  // The column named `name`, or -1.
  int column(std::string_view name) const;
  std::string column_names() const;  // "a, b, c", for messages
  bool is_null(int column, uint64_t row) const;
  // A string (or binary) value; InvalidArgument naming the column for another type.
  std::string_view string(int column, uint64_t row) const;
  // The value as JSON text, appended to `out`.
  void json(int column, uint64_t row, std::string& out) const;

 private:
  ArrowArray array_;
  ArrowSchema schema_;
};

}  // namespace stoker::text
