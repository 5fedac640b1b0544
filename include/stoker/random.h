// Counter-based random numbers for per-sample randomness.
//
// A SampleRng is keyed by (seed, epoch, sample index): the numbers a sample draws depend on nothing
// else, so augmentation is bit-identical whatever the worker count or the order workers run in.
// Pure integer arithmetic: the same stream on every platform and compiler. The continuous
// distributions below (normal, gamma, beta) add libm's log, exp, sqrt and cos: bit-identical on
// one platform, within an ulp or so of each other across libms.
//
// Thread safety: a SampleRng is a small value; use one per sample on one thread.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>

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
// stand-in for MT's own seeding (which chains 624 dependent multiplies): the words are the
// little-endian halves of wyrand's 64-bit outputs (a counter-based generator, one 64x64->128
// multiply an output) started at `key`. Word 0's top bit is set, as init_by_array does, so the
// state is never all zero. About 0.2 us for 624 words. Seeds Python's `random`, NumPy's legacy
// generator and torch's CPU generator per sample.
inline void expand_mt19937_state(uint64_t key, uint32_t* state, int words = 624) {
  uint64_t s = key;
  const auto next = [&s] {
    s += 0xa0761d6478bd642fULL;
    const unsigned __int128 t = static_cast<unsigned __int128>(s) * (s ^ 0xe7037ed1a0b428dbULL);
    return static_cast<uint64_t>(t >> 64) ^ static_cast<uint64_t>(t);
  };
  int i = 0;
  for (; i + 1 < words; i += 2) {
    const uint64_t x = next();
    if constexpr (std::endian::native == std::endian::little) {
      std::memcpy(state + i, &x, sizeof x);  // one store: low half first
    } else {
      state[i] = static_cast<uint32_t>(x);
      state[i + 1] = static_cast<uint32_t>(x >> 32);
    }
  }
  if (i < words) state[i] = static_cast<uint32_t>(next());
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

// A standard normal draw (Box-Muller; always two uniforms, so a stream's later draws do not
// depend on where a rejection loop stopped).
inline double sample_normal(SampleRng& rng) {
  const double u1 = 1.0 - rng.uniform();  // (0, 1]: log(u1) is finite
  const double u2 = rng.uniform();
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// log of a Gamma(shape, 1) draw: Marsaglia and Tsang's method (2000) for shape >= 1; below 1,
// Gamma(shape + 1) * U^(1 / shape), kept in logs, since for small shapes the draw itself
// underflows to 0 (shape 0.05 gives values below 1e-300 a few times in a thousand).
// REQUIRES: shape > 0 and finite.
inline double sample_log_gamma(SampleRng& rng, double shape) {
  double boost = 0;  // log(U) / shape for shape < 1
  if (shape < 1) {
    boost = std::log(1.0 - rng.uniform()) / shape;
    shape += 1;
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    const double x = sample_normal(rng);
    double v = 1.0 + c * x;
    if (v <= 0) continue;
    v = v * v * v;
    const double u = 1.0 - rng.uniform();  // (0, 1]
    const double x2 = x * x;
    if (u < 1.0 - 0.0331 * x2 * x2 || std::log(u) < 0.5 * x2 + d * (1.0 - v + std::log(v)))
      return std::log(d * v) + boost;
  }
}

// A Beta(a, b) draw: X / (X + Y) for X ~ Gamma(a), Y ~ Gamma(b), drawn in that order; in [0, 1].
// REQUIRES: a > 0, b > 0, both finite.
inline double sample_beta(SampleRng& rng, double a, double b) {
  const double log_x = sample_log_gamma(rng, a);
  const double log_y = sample_log_gamma(rng, b);
  // X / (X + Y) = 1 / (1 + Y / X), from the logs: no underflow for small shapes.
  return 1.0 / (1.0 + std::exp(log_y - log_x));
}

}  // namespace stoker
