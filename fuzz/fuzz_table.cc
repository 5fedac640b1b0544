// Tables (TableData: Parquet footers and row groups, Arrow IPC files and streams). The input is
// the file. Arrow's allocations go through malloc (ARROW_DEFAULT_MEMORY_POOL=system), so that
// AddressSanitizer sees every read of Stoker's outside Arrow's buffers; Arrow itself is not
// instrumented (pyarrow's build: it is fuzzed upstream, by OSS-Fuzz).
//
// Checked: opening throws nothing but stoker::Error; for every column, a TableSource (lists cut
// at 64 values) and a TableImageFiles either refuse it with stoker::Error or read each of its
// first rows without a crash, throwing nothing but stoker::Error.
#include <cstdlib>
#include <vector>

#include "fuzz_file.h"
#include "stoker/errors.h"
#include "stoker/tables/table.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  setenv("ARROW_DEFAULT_MEMORY_POOL", "system", 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static stoker::fuzz::FuzzFile file;
  stoker::TableSpec spec;
  spec.paths = {file.write(data, size)};
  std::shared_ptr<const stoker::TableData> table;
  try {
    table = stoker::TableData::open(spec);
  } catch (const stoker::Error&) {
    return 0;
  }
  const uint64_t rows = std::min<uint64_t>(table->num_rows(), 256);
  for (const auto& name : table->column_names()) {
    try {
      stoker::TableSource source(table, {{name, 64, 0, false}});
      std::vector<std::vector<std::byte>> fields;
      std::vector<std::byte*> slots;
      for (const auto& f : source.fields()) fields.emplace_back(f.sample_bytes());
      for (auto& f : fields) slots.push_back(f.data());
      auto state = source.make_worker_state();
      for (uint64_t r = 0; r < rows; ++r) {
        try {
          source.read({0, 0, r}, slots, state.get());
        } catch (const stoker::Error&) {
        }
      }
    } catch (const stoker::Error&) {
    }
    try {
      stoker::TableImageFiles images(table, name, "");
      std::vector<std::byte> buffer;
      for (uint64_t r = 0; r < rows; ++r) {
        try {
          images.read(r, buffer);
        } catch (const stoker::Error&) {
        }
      }
    } catch (const stoker::Error&) {
    }
  }
  return 0;
}
