#include "stoker/dtype.h"

#include "stoker/source.h"

namespace stoker {

std::string DType::name() const {
  switch (code) {
    case kInt:
      return "int" + std::to_string(bits);
    case kUInt:
      return "uint" + std::to_string(bits);
    case kFloat:
      return "float" + std::to_string(bits);
    case kBFloat:
      return "bfloat" + std::to_string(bits);
    case kComplex:
      return "complex" + std::to_string(bits);
    case kBool:
      return "bool";
  }
  return "unknown";
}

size_t FieldSpec::row_bytes() const {
  size_t n = dtype.bytes();
  for (size_t d = 1; d < shape.size(); ++d) n *= static_cast<size_t>(shape[d]);
  return n;
}

size_t FieldSpec::sample_bytes() const {
  size_t n = dtype.bytes();
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::vector<std::string> ragged_lengths_names(const std::vector<FieldSpec>& fields) {
  std::vector<std::string> out;  // by group: its first field's name, then the lengths' names
  for (const FieldSpec& f : fields) {
    if (!f.ragged) continue;
    if (f.ragged_group >= out.size()) out.resize(f.ragged_group + 1);
    if (out[f.ragged_group].empty()) out[f.ragged_group] = f.name + "_lengths";
  }
  if (!out.empty()) out[0] = "lengths";
  return out;
}

}  // namespace stoker
