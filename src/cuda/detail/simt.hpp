// Building blocks shared by the CUDA kernels and their host emulation
// (src/cuda/emulation_test.cpp).
//
// The kernel bodies are written once, as COBALT_HD templates over an execution policy:
//   * DeviceWarp / device atomics: the real thing (compiled by nvcc only);
//   * HostWarp / plain adds: a sequential emulation, so the same body runs on the CPU in tests.
// A warp-cooperative body is written in "uniform" style: every value outside a per-lane lambda is
// the same on all lanes; per-lane work is a lambda of the lane index fed to ballot()/reduce(); side
// effects on shared state happen under leader() followed by sync(). The host emulation evaluates
// the lambdas for all 32 lanes in order, so its results equal the device's whenever the lambdas are
// pure (they are: they only read).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cobalt/core/rng.hpp"  // COBALT_HD

#if !defined(__CUDA_ARCH__)
#include <bit>
#include <cstring>
#endif

// `#pragma unroll` for device code only (the host compiler warns about the unknown pragma).
#if defined(__CUDA_ARCH__)
#define COBALT_UNROLL _Pragma("unroll")
#else
#define COBALT_UNROLL
#endif

namespace cobalt::cuda::detail {

COBALT_HD inline int popc64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __popcll(x);
#else
  return std::popcount(x);
#endif
}

COBALT_HD inline int popc32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __popc(x);
#else
  return std::popcount(x);
#endif
}

// Index of the lowest set bit; x != 0.
COBALT_HD inline int ctz64(uint64_t x) {
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(x)) - 1;
#else
  return std::countr_zero(x);
#endif
}

COBALT_HD inline int ctz32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __ffs(static_cast<int>(x)) - 1;
#else
  return std::countr_zero(x);
#endif
}

// The i-th set bit of mask (0-based); i < popcount(mask). Same as node_cover.cpp's nth_set_bit.
COBALT_HD inline int nth_set_bit(uint64_t mask, uint32_t i) {
  for (; i > 0; --i) mask &= mask - 1;
  return ctz64(mask);
}

template <typename T>
COBALT_HD inline T hd_min(T a, T b) {
  return b < a ? b : a;
}
template <typename T>
COBALT_HD inline T hd_max(T a, T b) {
  return a < b ? b : a;
}

// IEEE double operations without contraction into FMA (nvcc contracts a * b - c by default, which
// would round differently from the CPU).
COBALT_HD inline double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
COBALT_HD inline double sub_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}

// A 32-bit store to 4-byte aligned byte storage.
COBALT_HD inline void store_u32(uint8_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint32_t*>(p) = v;
#else
  std::memcpy(p, &v, sizeof v);
#endif
}

// Integer atomics: the sums are exact whatever the order, so results stay deterministic.
COBALT_HD inline void atomic_add_i64(int64_t* p, int64_t v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
#else
  *p += v;
#endif
}
COBALT_HD inline int32_t atomic_add_i32(int32_t* p, int32_t v) {
#if defined(__CUDA_ARCH__)
  return atomicAdd(p, v);
#else
  const int32_t old = *p;
  *p += v;
  return old;
#endif
}

// Counter increments of the routing-statistics histograms (32-bit in shared memory, 64-bit in
// global memory); unsigned, so a sum wraps rather than overflows (the int64 totals are exact as
// long as a block sees fewer than 2^32 copies of one key).
COBALT_HD inline void atomic_add_counter(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  *p += v;
#endif
}
COBALT_HD inline void atomic_add_counter(unsigned long long* p, unsigned long long v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  *p += v;
#endif
}

// A read-only load through the non-coherent cache on the device.
COBALT_HD inline int32_t load_readonly(const int32_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

// Bytes a workspace sub-buffer of `count` T takes (rounded up to keep 256-byte alignment).
template <typename T>
constexpr size_t carve_size(size_t count) {
  return (count * sizeof(T) + 255) / 256 * 256;
}

// --- Warp policies ---------------------------------------------------------------------------

#if defined(__CUDACC__)
// All 32 lanes of a converged warp execute the same calls.
struct DeviceWarp {
  static constexpr int kLanes = 32;
  // A per-lane variable: this lane's value (the host emulation keeps all 32).
  template <typename T>
  struct Lanes {
    T value;
    __device__ T& operator[](int) { return value; }
    __device__ const T& operator[](int) const { return value; }
  };
  __device__ int lane() const { return static_cast<int>(threadIdx.x & 31u); }
  // Runs f(lane) on every lane (for per-lane side effects on Lanes<> or distinct addresses).
  template <typename F>
  __device__ void for_lanes(F&& f) const {
    f(lane());
  }
  __device__ bool leader() const { return lane() == 0; }
  __device__ void sync() const { __syncwarp(); }
  template <typename F>
  __device__ uint32_t ballot(F&& pred) const {
    return __ballot_sync(0xffffffffu, static_cast<bool>(pred(lane())));
  }
  // peers[l] = the lanes whose key(lane) equals lane l's (key: a 32- or 64-bit integer).
  template <typename F>
  __device__ void match_any(F&& key, Lanes<uint32_t>& peers) const {
    peers.value = __match_any_sync(0xffffffffu, key(lane()));
  }
  // Sum of make(lane) over the lanes.
  template <typename F>
  __device__ int64_t sum(F&& make) const {
    long long v = static_cast<long long>(make(lane()));
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return static_cast<int64_t>(v);
  }
  // out[lane] = sum of make(l) over lanes l < lane; total = the sum over all lanes.
  template <typename F>
  __device__ void exclusive_prefix(F&& make, Lanes<int64_t>& out, int64_t& total) const {
    const long long v = static_cast<long long>(make(lane()));
    long long inclusive = v;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const long long u = __shfl_up_sync(0xffffffffu, inclusive, offset);
      if (lane() >= offset) inclusive += u;
    }
    out.value = static_cast<int64_t>(inclusive - v);
    total = static_cast<int64_t>(__shfl_sync(0xffffffffu, inclusive, 31));
  }
  // The best of make(lane) under `better` (a strict total order on distinct values: the result
  // does not depend on the combination order). T: trivially copyable, size a multiple of 4.
  template <typename T, typename F, typename Better>
  __device__ T reduce(F&& make, Better&& better) const {
    T v = make(lane());
    for (int offset = 16; offset > 0; offset >>= 1) {
      T other = shfl_xor(v, offset);
      if (better(other, v)) v = other;
    }
    return v;
  }
  template <typename T>
  __device__ static T shfl_xor(const T& v, int offset) {
    static_assert(sizeof(T) % 4 == 0, "shuffled types are whole 32-bit words");
    constexpr int kWords = static_cast<int>(sizeof(T) / 4);
    uint32_t words[kWords];
    memcpy(words, &v, sizeof(T));
    COBALT_UNROLL
    for (int i = 0; i < kWords; ++i) words[i] = __shfl_xor_sync(0xffffffffu, words[i], offset);
    T out;
    memcpy(&out, words, sizeof(T));
    return out;
  }
};
#endif

// Sequential emulation of one warp (tests).
struct HostWarp {
  static constexpr int kLanes = 32;
  template <typename T>
  struct Lanes {
    T value[32];
    T& operator[](int l) { return value[l]; }
    const T& operator[](int l) const { return value[l]; }
  };
  int lane() const { return 0; }
  template <typename F>
  void for_lanes(F&& f) const {
    for (int l = 0; l < kLanes; ++l) f(l);
  }
  bool leader() const { return true; }
  void sync() const {}
  template <typename F>
  uint32_t ballot(F&& pred) const {
    uint32_t mask = 0;
    for (int l = 0; l < kLanes; ++l) {
      if (pred(l)) mask |= uint32_t{1} << l;
    }
    return mask;
  }
  template <typename F>
  void match_any(F&& key, Lanes<uint32_t>& peers) const {
    decltype(key(0)) keys[kLanes];
    for (int l = 0; l < kLanes; ++l) keys[l] = key(l);
    for (int l = 0; l < kLanes; ++l) {
      uint32_t m = 0;
      for (int o = 0; o < kLanes; ++o) {
        if (keys[o] == keys[l]) m |= uint32_t{1} << o;
      }
      peers[l] = m;
    }
  }
  template <typename F>
  void exclusive_prefix(F&& make, Lanes<int64_t>& out, int64_t& total) const {
    int64_t running = 0;
    for (int l = 0; l < kLanes; ++l) {
      out[l] = running;
      running += static_cast<int64_t>(make(l));
    }
    total = running;
  }
  template <typename F>
  int64_t sum(F&& make) const {
    int64_t v = 0;
    for (int l = 0; l < kLanes; ++l) v += static_cast<int64_t>(make(l));
    return v;
  }
  template <typename T, typename F, typename Better>
  T reduce(F&& make, Better&& better) const {
    T v = make(0);
    for (int l = 1; l < kLanes; ++l) {
      T other = make(l);
      if (better(other, v)) v = other;
    }
    return v;
  }
};

}  // namespace cobalt::cuda::detail
