// Phases of the GPU dispatch layout (src/cuda/dispatch_layout.cu), shared with the host emulation.
// A block owns a chunk of kDispatchChunk tokens, warp w of it tokens chunk * 256 + 32 w + lane.
// Per-warp phases take a Warp policy (simt.hpp); per-block loops take (tid, num_threads).
#pragma once

#include <cstdint>

#include "detail/simt.hpp"

namespace cobalt::cuda::detail {

inline constexpr int kDispatchWarps = 8;
inline constexpr int kDispatchChunk = 32 * kDispatchWarps;  // tokens per block
inline constexpr int kDispatchMaxRanks = 2048;
inline constexpr int kDispatchMaxTopK = 64;

struct DispatchShape {
  const int32_t* exec;  // [T, K]
  const int32_t* src;   // [T] or nullptr
  int64_t num_tokens;
  int top_k;
  int num_ranks;
  int num_nodes;
  int ranks_per_node;
};

// ballots[d] (this warp's row of the block's [warps, G] table): bit l set when rank d is among the
// execution ranks of token base + l.
template <typename Warp>
COBALT_HD inline void dispatch_warp_ballots(const Warp& w, const DispatchShape& s, int64_t base,
                                            uint32_t* ballots) {
  const int words = (s.num_ranks + 63) / 64;
  for (int wd = 0; wd < words; ++wd) {
    typename Warp::template Lanes<uint64_t> word;
    w.for_lanes([&](int l) {
      uint64_t m = 0;
      const int64_t t = base + l;
      if (t < s.num_tokens) {
        const int32_t* row = s.exec + t * s.top_k;
        for (int k = 0; k < s.top_k; ++k) {
          const int32_t r = row[k];
          if ((r >> 6) == wd) m |= uint64_t{1} << (r & 63);
        }
      }
      word[l] = m;
    });
    const int bits = hd_min(64, s.num_ranks - wd * 64);
    for (int b = 0; b < bits; ++b) {
      const uint32_t bal = w.ballot([&](int l) { return ((word[l] >> b) & 1u) != 0; });
      if (w.leader()) ballots[wd * 64 + b] = bal;
    }
  }
  w.sync();
}

// Tokens per node of this warp, added to node_hist [N] (block-shared; atomics across warps).
template <typename Warp>
COBALT_HD inline void dispatch_warp_nodes(const Warp& w, const DispatchShape& s, int64_t base,
                                          int64_t* node_hist) {
  typename Warp::template Lanes<uint64_t> nodes;
  w.for_lanes([&](int l) {
    uint64_t m = 0;
    const int64_t t = base + l;
    if (t < s.num_tokens) {
      const int32_t* row = s.exec + t * s.top_k;
      for (int k = 0; k < s.top_k; ++k) m |= uint64_t{1} << (row[k] / s.ranks_per_node);
    }
    nodes[l] = m;
  });
  for (int n = 0; n < s.num_nodes; ++n) {
    const uint32_t bal = w.ballot([&](int l) { return ((nodes[l] >> n) & 1u) != 0; });
    if (bal != 0 && w.leader()) atomic_add_i64(&node_hist[n], popc32(bal));
  }
  w.sync();
}

// Chunk counts per rank: counts[d * num_chunks + chunk] = tokens of the chunk sent to d.
COBALT_HD inline void dispatch_chunk_counts(int tid, int num_threads, int num_ranks,
                                            const uint32_t* ballots /* [warps, G] */, int64_t chunk,
                                            int64_t num_chunks, int32_t* counts) {
  for (int d = tid; d < num_ranks; d += num_threads) {
    int32_t c = 0;
    for (int wi = 0; wi < kDispatchWarps; ++wi) c += popc32(ballots[wi * num_ranks + d]);
    counts[d * num_chunks + chunk] = c;
  }
}

// pair_counts rows of this warp's tokens when the block's tokens come from several sources: one
// atomic per (destination, group of lanes sharing a source).
template <typename Warp>
COBALT_HD inline void dispatch_warp_pairs(const Warp& w, const DispatchShape& s, int64_t base,
                                          const uint32_t* ballots, int64_t* pair_counts) {
  typename Warp::template Lanes<uint32_t> peers;
  w.match_any(
      [&](int l) {
        const int64_t t = base + l;
        return t < s.num_tokens ? s.src[t] : -1;
      },
      peers);
  for (int d = 0; d < s.num_ranks; ++d) {
    const uint32_t bal = ballots[d];
    if (bal == 0) continue;
    w.for_lanes([&](int l) {
      if ((bal >> l) & 1u) {
        const uint32_t group = bal & peers[l];
        if (ctz32(group) == l) {
          atomic_add_i64(&pair_counts[static_cast<int64_t>(s.src[base + l]) * s.num_ranks + d],
                         popc32(group));
        }
      }
    });
  }
  w.sync();
}

// prefix[w * G + d] = tokens of warps 0 .. w-1 of the chunk sent to d.
COBALT_HD inline void dispatch_warp_prefix(int tid, int num_threads, int num_ranks,
                                           const uint32_t* ballots, uint32_t* prefix) {
  for (int d = tid; d < num_ranks; d += num_threads) {
    uint32_t running = 0;
    for (int wi = 0; wi < kDispatchWarps; ++wi) {
      prefix[wi * num_ranks + d] = running;
      running += static_cast<uint32_t>(popc32(ballots[wi * num_ranks + d]));
    }
  }
}

// slot[t, k] = rank_offsets[d] + chunk_base[d, chunk] + prefix[d] + (earlier lanes of the warp
// sent to d), d = exec[t, k].
template <typename Warp>
COBALT_HD inline void dispatch_warp_slots(const Warp& w, const DispatchShape& s, int64_t base,
                                          int64_t chunk, int64_t num_chunks,
                                          const uint32_t* ballots, const uint32_t* prefix,
                                          const int32_t* chunk_base, const int64_t* rank_offsets,
                                          int32_t* slot) {
  w.for_lanes([&](int l) {
    const int64_t t = base + l;
    if (t >= s.num_tokens) return;
    const uint32_t earlier = (uint32_t{1} << l) - 1;
    const int32_t* row = s.exec + t * s.top_k;
    int32_t* out = slot + t * s.top_k;
    for (int k = 0; k < s.top_k; ++k) {
      const int32_t d = row[k];
      out[k] = static_cast<int32_t>(rank_offsets[d] + chunk_base[d * num_chunks + chunk] +
                                    prefix[d] + popc32(ballots[d] & earlier));
    }
  });
}

// token_in_rank rows [base, base + 32) from the warp's ballots (coalesced: consecutive lanes write
// consecutive bytes).
template <typename Warp>
COBALT_HD inline void dispatch_warp_flags(const Warp& w, const DispatchShape& s, int64_t base,
                                          const uint32_t* ballots, uint8_t* token_in_rank) {
  const int64_t rows = hd_min<int64_t>(32, s.num_tokens - base);
  if (rows <= 0) return;
  const int64_t bytes = rows * s.num_ranks;
  uint8_t* out = token_in_rank + base * s.num_ranks;
  if (s.num_ranks % 4 == 0 && reinterpret_cast<uintptr_t>(token_in_rank) % 4 == 0) {
    // Four flags of one row per 32-bit store (little-endian byte order).
    w.for_lanes([&](int l) {
      for (int64_t i = 4 * l; i < bytes; i += 4 * Warp::kLanes) {
        const int r = static_cast<int>(i / s.num_ranks);
        const int d = static_cast<int>(i - static_cast<int64_t>(r) * s.num_ranks);
        uint32_t v = 0;
        for (int j = 0; j < 4; ++j) v |= ((ballots[d + j] >> r) & 1u) << (8 * j);
        store_u32(out + i, v);
      }
    });
    return;
  }
  w.for_lanes([&](int l) {
    for (int64_t i = l; i < bytes; i += Warp::kLanes) {
      const int r = static_cast<int>(i / s.num_ranks);
      const int d = static_cast<int>(i - static_cast<int64_t>(r) * s.num_ranks);
      out[i] = static_cast<uint8_t>((ballots[d] >> r) & 1u);
    }
  });
}

}  // namespace cobalt::cuda::detail
