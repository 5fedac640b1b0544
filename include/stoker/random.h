// Counter-based random numbers for per-sample randomness.
//
// A SampleRng is keyed by (seed, epoch, sample index): the numbers a sample draws depend on nothing
// else, so augmentation is bit-identical whatever the worker count or the order workers run in.
// Pure integer arithmetic: the same stream on every platform and compiler.
//
// Thread safety: a SampleRng is a small value; use one per sample on one thread.
#pragma once

#include <cmath>
#include <cstdint>

namespace stoker {

// SplitMix64 finalizer: a bijective 64-bit mixer with full avalanche.
constexpr uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Hashes three words into one key; distinct triples give independent-looking keys.
constexpr uint64_t hash_key(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t h = mix64(a + 0x9e3779b97f4a7c15ULL);
  h = mix64(h ^ (b + 0x632be59bd9b4e019ULL));
  h = mix64(h ^ (c + 0x85157af5d36f42a3ULL));
  return h;
}

// Fills a Mersenne Twister (MT19937) state of `words` 32-bit words from `key`, as a cheap
// stand-in for MT's own seeding (which chains 624 dependent multiplies): word i is half of
// mix64 of the key and i. Word 0's top bit is set, as init_by_array does, so the state is never
// all zero. Used to seed Python's `random` and NumPy's legacy generator per sample.
constexpr void expand_mt19937_state(uint64_t key, uint32_t* state, int words = 624) {
  for (int i = 0; i < words; i += 2) {
    const uint64_t x = mix64(key + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(i / 2 + 1));
    state[i] = static_cast<uint32_t>(x);
    if (i + 1 < words) state[i + 1] = static_cast<uint32_t>(x >> 32);
  }
  state[0] |= 0x80000000u;
}

class SampleRng {
 public:
  constexpr SampleRng(uint64_t seed, uint64_t epoch, uint64_t index)
      : key_(hash_key(seed, epoch, index)) {}

  // The next 64 random bits.
  constexpr uint64_t next_u64() { return mix64(key_ + 0x9e3779b97f4a7c15ULL * ++counter_); }

  // Uniform double in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

  // Uniform double in [lo, hi).
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }

  // Uniform integer in [lo, hi), unbiased (Lemire's method). REQUIRES: lo < hi.
  int64_t uniform_int(int64_t lo, int64_t hi) {
    const uint64_t range = static_cast<uint64_t>(hi - lo);
    unsigned __int128 m = static_cast<unsigned __int128>(next_u64()) * range;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < range) {
      const uint64_t threshold = -range % range;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(next_u64()) * range;
        low = static_cast<uint64_t>(m);
      }
    }
    return lo + static_cast<int64_t>(m >> 64);
  }

  // True with probability p.
  bool bernoulli(double p) { return uniform() < p; }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace stoker
