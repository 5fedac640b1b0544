#include "text/arrow_rows.h"

#include <charconv>
#include <cstring>

#include "stoker/errors.h"

namespace stoker::text {
namespace {

bool valid(const ArrowArray& a, int64_t i) {
  const auto* bits = static_cast<const uint8_t*>(a.buffers[0]);
  if (bits == nullptr || a.null_count == 0) return true;
  const int64_t k = a.offset + i;
  return (bits[k >> 3] >> (k & 7)) & 1;
}

std::string_view format(const ArrowSchema& s) { return s.format; }

// The value of `key` in a schema's metadata (the C data interface's encoding: int32 pair count,
// then per pair an int32 length and the key's bytes, an int32 length and the value's), or empty.
std::string_view metadata_value(const ArrowSchema& s, std::string_view key) {
  if (s.metadata == nullptr) return {};
  const char* p = s.metadata;
  const auto next_int = [&p] {
    int32_t v;
    std::memcpy(&v, p, sizeof v);
    p += sizeof v;
    return v;
  };
  const int32_t pairs = next_int();
  for (int32_t i = 0; i < pairs; ++i) {
    const int32_t klen = next_int();
    const std::string_view k(p, static_cast<size_t>(klen));
    p += klen;
    const int32_t vlen = next_int();
    const std::string_view v(p, static_cast<size_t>(vlen));
    p += vlen;
    if (k == key) return v;
  }
  return {};
}

// A JSON extension column (Arrow's canonical "arrow.json", which Hugging Face datasets writes for
// values of varying structure): strings that hold JSON text, to be written as that JSON.
bool holds_json(const ArrowSchema& s) {
  return metadata_value(s, "ARROW:extension:name") == "arrow.json";
}

[[noreturn]] void unsupported(const ArrowSchema& s) {
  throw InvalidArgument(std::string("column ") + (s.name != nullptr ? s.name : "?") +
                        ": Arrow type '" + s.format +
                        "' is not read for text (strings, numbers, bools, lists and structs are)");
}

template <typename Offset>
std::string_view string_at(const ArrowArray& a, int64_t i) {
  const auto* offsets = static_cast<const Offset*>(a.buffers[1]);
  const auto* data = static_cast<const char*>(a.buffers[2]);
  const int64_t k = a.offset + i;
  return {data + offsets[k], static_cast<size_t>(offsets[k + 1] - offsets[k])};
}

void json_string(std::string_view s, std::string& out) {
  out.push_back('"');
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (u < 0x20) {
      static const char* hex = "0123456789abcdef";
      out += "\\u00";
      out.push_back(hex[u >> 4]);
      out.push_back(hex[u & 15]);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

// A string value: quoted, or as it is where the column's strings are JSON text.
void json_text(std::string_view value, bool is_json, std::string& out) {
  if (is_json) {
    out += value.empty() ? std::string_view("null") : value;
  } else {
    json_string(value, out);
  }
}

template <typename T>
void json_number(T v, std::string& out) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  out.append(buf, r.ptr);
}

template <typename T>
T at(const ArrowArray& a, int64_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(a.buffers[1]) + (a.offset + i) * sizeof(T), sizeof v);
  return v;
}

void json_value(const ArrowArray& a, const ArrowSchema& s, int64_t i, std::string& out) {
  if (s.dictionary != nullptr) unsupported(s);
  const std::string_view f = format(s);
  if (f == "n" || !valid(a, i)) {
    out += "null";
    return;
  }
  if (f.size() == 1) {
    switch (f[0]) {
      case 'b': {
        const int64_t k = a.offset + i;
        out += ((static_cast<const uint8_t*>(a.buffers[1])[k >> 3] >> (k & 7)) & 1) ? "true"
                                                                                   : "false";
        return;
      }
      case 'c': return json_number<int64_t>(at<int8_t>(a, i), out);
      case 'C': return json_number<uint64_t>(at<uint8_t>(a, i), out);
      case 's': return json_number<int64_t>(at<int16_t>(a, i), out);
      case 'S': return json_number<uint64_t>(at<uint16_t>(a, i), out);
      case 'i': return json_number<int64_t>(at<int32_t>(a, i), out);
      case 'I': return json_number<uint64_t>(at<uint32_t>(a, i), out);
      case 'l': return json_number<int64_t>(at<int64_t>(a, i), out);
      case 'L': return json_number<uint64_t>(at<uint64_t>(a, i), out);
      case 'f': return json_number<double>(at<float>(a, i), out);
      case 'g': return json_number<double>(at<double>(a, i), out);
      case 'u':
      case 'z': return json_text(string_at<int32_t>(a, i), holds_json(s), out);
      case 'U':
      case 'Z': return json_text(string_at<int64_t>(a, i), holds_json(s), out);
      default: unsupported(s);
    }
  }
  const auto list = [&](int64_t begin, int64_t end) {
    out.push_back('[');
    for (int64_t j = begin; j < end; ++j) {
      if (j > begin) out.push_back(',');
      json_value(*a.children[0], *s.children[0], j, out);
    }
    out.push_back(']');
  };
  if (f == "+l") {
    const auto* o = static_cast<const int32_t*>(a.buffers[1]) + a.offset + i;
    return list(o[0], o[1]);
  }
  if (f == "+L") {
    const auto* o = static_cast<const int64_t*>(a.buffers[1]) + a.offset + i;
    return list(o[0], o[1]);
  }
  if (f.starts_with("+w:")) {
    int64_t n = 0;
    std::from_chars(f.data() + 3, f.data() + f.size(), n);
    return list((a.offset + i) * n, (a.offset + i + 1) * n);
  }
  if (f == "+s") {
    out.push_back('{');
    for (int64_t c = 0; c < s.n_children; ++c) {
      if (c > 0) out.push_back(',');
      json_string(s.children[c]->name != nullptr ? s.children[c]->name : "", out);
      out.push_back(':');
      json_value(*a.children[c], *s.children[c], a.offset + i, out);
    }
    out.push_back('}');
    return;
  }
  unsupported(s);
}

}  // namespace

ArrowRows::ArrowRows(ArrowArray* array, ArrowSchema* schema) : array_(*array), schema_(*schema) {
  array->release = nullptr;  // moved: the caller's copies are released
  schema->release = nullptr;
  if (format(schema_) != "+s") {
    const std::string type = schema_.format;
    array_.release(&array_);
    schema_.release(&schema_);
    throw InvalidArgument(std::string("a record batch must come as a struct array, got Arrow type '") + type + "'");
  }
}

ArrowRows::~ArrowRows() {
  if (array_.release != nullptr) array_.release(&array_);
  if (schema_.release != nullptr) schema_.release(&schema_);
  array_.release = nullptr;
  schema_.release = nullptr;
}

int ArrowRows::column(std::string_view name) const {
  for (int64_t c = 0; c < schema_.n_children; ++c)
    if (schema_.children[c]->name != nullptr && name == schema_.children[c]->name)
      return static_cast<int>(c);
  return -1;
}

std::string ArrowRows::column_names() const {
  std::string s;
  for (int64_t c = 0; c < schema_.n_children; ++c) {
    if (c > 0) s += ", ";
    s += schema_.children[c]->name != nullptr ? schema_.children[c]->name : "?";
  }
  return s;
}

bool ArrowRows::is_null(int column, uint64_t row) const {
  const int64_t i = array_.offset + static_cast<int64_t>(row);
  return !valid(array_, static_cast<int64_t>(row)) ||
         format(*schema_.children[column]) == "n" ||
         !valid(*array_.children[column], i);
}

std::string_view ArrowRows::string(int column, uint64_t row) const {
  const ArrowArray& a = *array_.children[column];
  const ArrowSchema& s = *schema_.children[column];
  const int64_t i = array_.offset + static_cast<int64_t>(row);
  const std::string_view f = format(s);
  if (s.dictionary == nullptr && (f == "u" || f == "z")) return string_at<int32_t>(a, i);
  if (s.dictionary == nullptr && (f == "U" || f == "Z")) return string_at<int64_t>(a, i);
  throw InvalidArgument(std::string("column ") + (s.name != nullptr ? s.name : "?") +
                        " holds Arrow type '" + s.format + "', not strings");
}

void ArrowRows::json(int column, uint64_t row, std::string& out) const {
  json_value(*array_.children[column], *schema_.children[column],
             array_.offset + static_cast<int64_t>(row), out);
}

}  // namespace stoker::text
