// Internal: the token-id check of the DocumentSets (TokenCorpus, ArrayDocuments), run on the ids
// read() has just widened to int64.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "stoker/errors.h"

namespace stoker {

// The position of the first id in ids[0 .. count) that is negative or not below `limit`, or
// count when there is none. One branch-free pass (vectorized); the position is looked for only
// on failure.
inline uint64_t first_bad_id(const int64_t* ids, uint64_t count, uint64_t limit) {
  unsigned bad = 0;
  for (uint64_t t = 0; t < count; ++t) bad |= static_cast<uint64_t>(ids[t]) >= limit;
  if (!bad) return count;
  return static_cast<uint64_t>(
      std::find_if(ids, ids + count,
                   [&](int64_t id) { return static_cast<uint64_t>(id) >= limit; }) -
      ids);
}

// Throws InvalidArgument "<where>negative token id ..." or "<where>token id ... is outside the
// vocabulary (vocab_size ...)".
[[noreturn]] inline void throw_bad_id(const std::string& where, int64_t id, uint64_t vocab_size) {
  if (id < 0) throw InvalidArgument(where + "negative token id " + std::to_string(id));
  throw InvalidArgument(where + "token id " + std::to_string(id) +
                        " is outside the vocabulary (vocab_size " + std::to_string(vocab_size) +
                        ")");
}

}  // namespace stoker
