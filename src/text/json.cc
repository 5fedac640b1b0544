#include "stoker/errors.h"
#include "text/components.h"

namespace stoker::text::json {

std::string type_of(simdjson::dom::element e, const std::string& origin, const char* what) {
  std::string_view type;
  if (!e.is_object() || e["type"].get(type) != simdjson::SUCCESS) {
    throw InvalidArgument(origin + ": a " + what + " without a \"type\"");
  }
  return std::string(type);
}

std::string string_or(simdjson::dom::element e, const char* key, const std::string& fallback) {
  std::string_view v;
  if (e[key].get(v) != simdjson::SUCCESS) return fallback;
  return std::string(v);
}

bool bool_or(simdjson::dom::element e, const char* key, bool fallback) {
  bool v = fallback;
  if (e[key].get(v) != simdjson::SUCCESS) return fallback;
  return v;
}

int64_t int_or(simdjson::dom::element e, const char* key, int64_t fallback) {
  int64_t v = 0;
  if (e[key].get(v) != simdjson::SUCCESS) {
    uint64_t u = 0;
    if (e[key].get(u) == simdjson::SUCCESS) return static_cast<int64_t>(u);
    return fallback;
  }
  return v;
}

bool has(simdjson::dom::element e, const char* key) {
  simdjson::dom::element v;
  return e[key].get(v) == simdjson::SUCCESS && !v.is_null();
}

}  // namespace stoker::text::json
