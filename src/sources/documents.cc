#include "stoker/sources/documents.h"

#include <algorithm>
#include <array>

namespace stoker {

void ignore_untrained_labels(const DocumentSet& docs, uint64_t d, uint64_t first, uint64_t count,
                             int64_t* labels, int64_t ignore) {
  if (!docs.has_untrained_tokens()) return;
  std::array<uint8_t, 512> trained;  // a piece's flags, a block at a time: no allocation
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min<uint64_t>(trained.size(), count - done);
    docs.read_trained(d, first + done, n, trained.data());
    for (uint64_t i = 0; i < n; ++i)
      if (trained[i] == 0) labels[done + i] = ignore;
    done += n;
  }
}

}  // namespace stoker
