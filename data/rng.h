#pragma once
// Random streams for data augmentation and shuffling: xoshiro256** seeded through SplitMix64, with
// one independent stream per (seed, epoch, batch index).

#include <cstdint>

namespace whittle::data {

/// SplitMix64's output function (Steele, Lea & Flood, 2014): a bijective 64-bit mixer.
inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// The key of the random stream for (seed, epoch, index): seed, epoch and index are folded in one
/// after another through the bijective SplitMix64 mixer, so for a fixed (seed, epoch) distinct
/// indices always give distinct keys. The loader uses index = batch index for augmentation and
/// index = kShuffleStream for the epoch's permutation.
inline uint64_t stream_key(uint64_t seed, uint64_t epoch, uint64_t index) {
  uint64_t h = splitmix64_mix(seed + 0x9e3779b97f4a7c15ULL);
  h = splitmix64_mix(h ^ epoch);
  return splitmix64_mix(h ^ index);
}

/// The stream index reserved for an epoch's shuffle permutation (never a batch index).
inline constexpr uint64_t kShuffleStream = ~uint64_t{0};

/// A small, fast, deterministic generator: xoshiro256** 1.0 (Blackman & Vigna, 2018), its state
/// filled from a 64-bit seed with SplitMix64. Not thread-safe; give each thread its own stream.
/// Every draw (next, uniform_int, uniform) consumes exactly one 64-bit output.
class Rng {
 public:
  /// A generator whose state is derived from `seed`.
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& s : s_) {
      x += 0x9e3779b97f4a7c15ULL;
      s = splitmix64_mix(x);
    }
  }
  /// The generator of stream (seed, epoch, index), see stream_key.
  static Rng stream(uint64_t seed, uint64_t epoch, uint64_t index) { return Rng(stream_key(seed, epoch, index)); }

  /// The next 64 random bits.
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  /// An integer in [0, n) (0 when n is 0), by the multiply-high method: floor(next()·n / 2^64).
  /// The bias is at most n / 2^64, far below anything an augmentation can show.
  uint64_t uniform_int(uint64_t n) { return static_cast<uint64_t>((static_cast<U128>(next()) * n) >> 64); }
  /// A double in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

 private:
  __extension__ typedef unsigned __int128 U128;
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace whittle::data
