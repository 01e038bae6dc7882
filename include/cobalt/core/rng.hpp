// Counter-based randomness: every random choice is a pure function of (seed, step, layer, token,
// k), so any subset of tokens, on any thread or device, reproduces the same draws.
#pragma once

#include <cstdint>

// COBALT_HD marks the pure functions below usable from CUDA device code (src/cuda/ draws the same
// numbers as the CPU); it expands to nothing in plain C++.
#if defined(__CUDACC__)
#define COBALT_HD __host__ __device__
#else
#define COBALT_HD
#endif

namespace cobalt {

// SplitMix64 finaliser: a bijective 64-bit mixer with full avalanche.
constexpr COBALT_HD uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of the key (seed, step, layer, token, k): the counter-based RNG of DESIGN.md §2.
constexpr COBALT_HD uint64_t counter_hash(uint64_t seed, uint64_t step, uint64_t layer,
                                          uint64_t token, uint64_t k) {
  uint64_t h = mix64(seed);
  h = mix64(h ^ step);
  h = mix64(h ^ (layer * 0x632be59bd9b4e019ULL));
  h = mix64(h ^ token);
  return mix64(h ^ (k * 0x8cb92ba72f3d8dd7ULL));
}

// The same key, split so a batch computes the (seed, step, layer) part once and each token once:
//   task_hash(counter_prefix(seed, step, layer), token, k)
// Every per-task draw of the assignment uses this (CPU, reference and GPU alike).
constexpr COBALT_HD uint64_t counter_prefix(uint64_t seed, uint64_t step, uint64_t layer) {
  return mix64(mix64(mix64(seed) ^ step) ^ (layer * 0x632be59bd9b4e019ULL));
}
constexpr COBALT_HD uint64_t token_hash(uint64_t prefix, uint64_t token) {
  return mix64(prefix ^ token);
}
constexpr COBALT_HD uint64_t task_hash_from_token(uint64_t token_h, uint64_t k) {
  return mix64(token_h ^ (k * 0x8cb92ba72f3d8dd7ULL));
}
constexpr COBALT_HD uint64_t task_hash(uint64_t prefix, uint64_t token, uint64_t k) {
  return task_hash_from_token(token_hash(prefix, token), k);
}

// Algorithm 1's draw among a token's minimum remote covers when several tie (node_cover.hpp): the
// token's hash salted with an index no task uses (k < 2^32 for every task draw).
inline constexpr uint64_t kCoverDrawIndex = uint64_t{1} << 32;
constexpr COBALT_HD uint64_t cover_hash_from_token(uint64_t token_h) {
  return task_hash_from_token(token_h, kCoverDrawIndex);
}

// Uniform integer in [0, n) from a 64-bit hash (multiply-shift; bias < n / 2^64).
constexpr COBALT_HD uint32_t uniform_below(uint64_t hash, uint32_t n) {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(hash) * n) >> 64);
}

// Uniform double in [0, 1) from a 64-bit hash.
constexpr COBALT_HD double uniform_unit(uint64_t hash) {
  return static_cast<double>(hash >> 11) * 0x1.0p-53;
}

// A small sequential generator for planners and synthetic workloads (xoshiro-free, SplitMix64
// stream).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    uint64_t z = state_;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  double unit() { return uniform_unit(next()); }
  uint32_t below(uint32_t n) { return uniform_below(next(), n); }

 private:
  uint64_t state_;
};

}  // namespace cobalt
