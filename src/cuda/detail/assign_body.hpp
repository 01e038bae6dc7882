// Per-token body of the GPU task assignment (Cobalt Algorithm 1), shared by the kernel
// (src/cuda/assign.cu) and its host emulation. It mirrors assign_node_cover's fast path in
// src/assign/node_cover.cpp step by step (same draws, same tie-breaks), so both variants are
// bitwise identical to the CPU:
//   * local experts: a rank of the source node, replica uniform_below(mix64(h_k), count) (no draw
//     when the node holds one replica), h_k = task_hash_from_token(token_hash(prefix, token), k);
//   * uncovered experts: the cover is a node holding all of them when there is one (drawn
//     uniformly among those nodes, below), else
//     - kMasks (the paper's enumeration): the feasible remote masks of the fewest nodes, in value
//       order, one drawn uniformly: for N <= 8 the set bits of the smallest popcount class of a
//       bitset AND over the uncovered experts, above that enumerated per popcount with Gosper's
//       hack over the N-1 remote nodes (bit-deposit around the source bit keeps numeric order), or
//     - kSubsetDp (the scalable exact variant): min_node_cover of set_cover.cpp (non-dominated
//       distinct node covers in ascending node order, lexicographic combinations when there are
//       <= 12, else the DP over subsets of the uncovered experts with the same tie-break), on the
//       node ids relabelled cyclically from a remote node drawn with the cover hash (as the CPU);
//     ties among minimum covers drawn as the CPU draws them: the r-th in value order,
//     r = uniform_below(cover_hash_from_token(token_h), count), no draw when count is 1;
//     then node uniform_below(h_k, |cover & mask_e|)-th set bit, rank uniform_below(mix64(h_k), .).
#pragma once

#include <cstdint>

#include "cobalt/core/rng.hpp"
#include "detail/simt.hpp"

namespace cobalt::cuda::detail {

inline constexpr int kAssignMaxTopK = 16;     // as node_cover.cpp (16-bit uncovered-expert sets)
inline constexpr int kAssignLocalDpBits = 8;  // the DP table of <= 8 uncovered experts is local
inline constexpr uint64_t kCoverDeferred = ~uint64_t{0};

struct AssignTables {
  const uint64_t* node_mask;     // [E]
  const int32_t* node_offsets;   // [E * N + 1]
  const int32_t* replica_ranks;  // grouped by (expert, node)
  int num_nodes;
  int ranks_per_node;
};

enum class CoverMode : int { kMasks = 0, kSubsetDp = 1 };

// Replica of expert e on node n: the first when the node holds one (no draw), else
// uniform_below(mix64(h), count) with h = task_hash_from_token(token_h, k).
COBALT_HD inline int32_t pick_replica(const AssignTables& tab, int32_t e, int n, uint64_t token_h,
                                      int k) {
  const int64_t idx = static_cast<int64_t>(e) * tab.num_nodes + n;
  const int32_t first = tab.node_offsets[idx];
  const uint32_t count = static_cast<uint32_t>(tab.node_offsets[idx + 1] - first);
  if (count == 1) return tab.replica_ranks[first];
  return tab.replica_ranks[first + uniform_below(mix64(task_hash_from_token(token_h, k)), count)];
}

// kMasks: the remote node masks (source bit clear, >= 2 nodes) that meet every uncovered expert's
// mask, with the fewest nodes, in value order; the r-th taken, r drawn from the token's cover hash
// (two walks of that popcount class when several tie). `uncovered` has bit k set for uncovered
// task k.
template <int kMaxK>
COBALT_HD inline bool meets_uncovered(uint64_t b, const uint64_t* mask, uint32_t uncovered,
                                      int top_k) {
  bool feasible = true;
  COBALT_UNROLL
  for (int k = 0; k < kMaxK; ++k) {
    if (k < top_k && ((uncovered >> k) & 1u) && (b & mask[k]) == 0) feasible = false;
  }
  return feasible;
}

template <int kMaxK>
COBALT_HD inline uint64_t drawn_feasible_mask(int num_nodes, int src_node, const uint64_t* mask,
                                              uint32_t uncovered, int top_k, uint64_t token_h) {
  const int remote = num_nodes - 1;
  const uint64_t low = (uint64_t{1} << src_node) - 1;
  const uint64_t limit = uint64_t{1} << remote;
  for (int p = 2; p <= remote; ++p) {
    // Walk 0 counts the feasible p-subsets of the remote nodes (ascending), walk 1 takes the
    // drawn one; no walk 1 when none or one is feasible.
    uint32_t count = 0, target = 0;
    uint64_t first = 0;
    for (int walk = 0; walk < 2; ++walk) {
      uint32_t seen = 0;
      uint64_t c = (uint64_t{1} << p) - 1;
      while (c < limit) {
        const uint64_t b = (c & low) | ((c & ~low) << 1);  // re-insert the source node's bit (0)
        if (meets_uncovered<kMaxK>(b, mask, uncovered, top_k)) {
          if (walk == 1 && seen == target) return b;
          if (seen == 0) first = b;
          ++seen;
        }
        const uint64_t t = c | (c - 1);  // Gosper's hack: next larger value with p bits
        c = (t + 1) | (((~t & (t + 1)) - 1) >> (ctz64(c) + 1));
      }
      if (walk == 0) {
        count = seen;
        if (count == 0) break;  // no cover of p nodes: the next size
        if (count == 1) return first;
        target = uniform_below(cover_hash_from_token(token_h), count);
      }
    }
  }
  return 0;  // unreachable: every expert has a replica, so all remote nodes cover U_t
}

// The same answer for N <= 8 without enumeration: node masks as bit positions of at most four
// 64-bit words (bit b of word w stands for mask 64 w + b), the feasible masks as an AND of
// per-expert words, then the set bits of the smallest popcount class >= 2, one drawn as above. The
// CPU does the same with precomputed words (src/assign/ordered_mask_table.hpp); here every word
// comes from the constants below, so no table is needed. Gosper's walk above visits up to 247 masks
// at N = 8, with lanes of a warp stopping at different ones.
inline constexpr int kBitsetMaxNodes = 8;

// Masks among 64 w .. 64 w + 63 that leave node n out.
COBALT_HD inline uint64_t masks_without_node(int n, int w) {
  switch (n) {
    case 0:
      return 0x5555555555555555ULL;
    case 1:
      return 0x3333333333333333ULL;
    case 2:
      return 0x0F0F0F0F0F0F0F0FULL;
    case 3:
      return 0x00FF00FF00FF00FFULL;
    case 4:
      return 0x0000FFFF0000FFFFULL;
    case 5:
      return 0x00000000FFFFFFFFULL;
    default:  // nodes 6 and 7 are bits 0 and 1 of the word index
      return ((w >> (n - 6)) & 1) ? 0 : ~uint64_t{0};
  }
}

// Bits b < 64 with popcount(b) == q (0 when q is outside [0, 6]).
COBALT_HD constexpr uint64_t popcount_class_word(int q) {
  switch (q) {
    case 0:
      return 0x1ULL;
    case 1:
      return 0x100010116ULL;
    case 2:
      return 0x1011601161668ULL;
    case 3:
      return 0x116166816686880ULL;
    case 4:
      return 0x1668688068808000ULL;
    case 5:
      return 0x6880800080000000ULL;
    case 6:
      return 0x8000000000000000ULL;
    default:
      return 0;
  }
}

#if !defined(__CUDA_ARCH__)
// The literals above are the popcount classes (checked by the host compiler).
constexpr bool popcount_class_words_hold() {
  for (int q = 0; q <= 6; ++q) {
    uint64_t word = 0;
    for (int b = 0; b < 64; ++b) {
      if (std::popcount(static_cast<unsigned>(b)) == q) word |= uint64_t{1} << b;
    }
    if (word != popcount_class_word(q)) return false;
  }
  return true;
}
static_assert(popcount_class_words_hold());
#endif

// Requires num_nodes <= kBitsetMaxNodes. The feasible masks of all words (up to four), then the
// smallest popcount class >= 2 holding one, then the r-th of that class in value order (words come
// in value order), r drawn from the token's cover hash (uniform_below(h, 1) == 0: no branch on a
// tie). The word loops are unrolled over the four possible words, so `feasible` is indexed by
// constants and can stay in registers.
template <int kMaxK>
COBALT_HD inline uint64_t drawn_feasible_mask_bitset(int num_nodes, int src_node,
                                                     const uint64_t* mask, uint32_t uncovered,
                                                     int top_k, uint64_t token_h) {
  constexpr int kMaxWords = 1 << (kBitsetMaxNodes - 6);
  const int num_words = num_nodes <= 6 ? 1 : 1 << (num_nodes - 6);
  const uint64_t valid =
      num_nodes >= 6 ? ~uint64_t{0} : (uint64_t{1} << (1 << num_nodes)) - 1;  // masks < 2^N
  uint64_t feasible[kMaxWords];
  int best_popcount = num_nodes + 1;
  COBALT_UNROLL
  for (int w = 0; w < kMaxWords; ++w) {
    uint64_t f = 0;
    if (w < num_words) {
      f = masks_without_node(src_node, w) & valid;
      COBALT_UNROLL
      for (int k = 0; k < kMaxK; ++k) {
        if (k < top_k && ((uncovered >> k) & 1u)) {
          uint64_t misses = ~uint64_t{0};  // masks that meet none of expert k's nodes
          for (uint64_t m = mask[k]; m; m &= m - 1) misses &= masks_without_node(ctz64(m), w);
          f &= ~misses;
        }
      }
      for (int p = 2; p < best_popcount; ++p) {
        if ((f & popcount_class_word(p - popc32(static_cast<uint32_t>(w)))) != 0) {
          best_popcount = p;
          break;
        }
      }
    }
    feasible[w] = f;
  }
  uint32_t count = 0;
  COBALT_UNROLL
  for (int w = 0; w < kMaxWords; ++w) {
    feasible[w] &= popcount_class_word(best_popcount - popc32(static_cast<uint32_t>(w)));
    count += static_cast<uint32_t>(popc64(feasible[w]));
  }
  uint32_t r = uniform_below(cover_hash_from_token(token_h), count);
  uint64_t cover = 0;
  bool found = false;
  COBALT_UNROLL
  for (int w = 0; w < kMaxWords; ++w) {
    const uint32_t in_word = static_cast<uint32_t>(popc64(feasible[w]));
    if (!found && r < in_word) {
      cover = static_cast<uint64_t>(w) * 64 + static_cast<uint64_t>(nth_set_bit(feasible[w], r));
      found = true;
    } else if (!found) {
      r -= in_word;
    }
  }
  return cover;  // never 0: every expert has a replica, so all remote nodes cover U_t
}

// Node i relabelled as (i - shift) mod num_nodes, 0 <= shift < num_nodes <= 64.
COBALT_HD inline uint64_t rotate_nodes(uint64_t mask, int shift, int num_nodes) {
  if (shift == 0) return mask;
  const uint64_t all = num_nodes == 64 ? ~uint64_t{0} : (uint64_t{1} << num_nodes) - 1;
  return ((mask >> shift) | (mask << (num_nodes - shift))) & all;
}

// kSubsetDp: set_cover.cpp's min_node_cover over the compacted uncovered masks. best_table holds
// 2^dp_bits bytes; returns kCoverDeferred when the DP is needed for more uncovered experts than
// that (the caller retries with a bigger table).
COBALT_HD inline uint64_t min_cover_subset_dp(const uint64_t* masks, int num_uncovered,
                                              uint8_t* best_table, int dp_bits) {
  const uint32_t full = (uint32_t{1} << num_uncovered) - 1;
  uint64_t candidates = 0;
  for (int i = 0; i < num_uncovered; ++i) candidates |= masks[i];
  // Distinct, non-dominated covers, keeping the lowest node for each (ascending node order).
  uint32_t sets[64];
  int set_node[64];
  int num_sets = 0;
  for (uint64_t m = candidates; m; m &= m - 1) {
    const int n = ctz64(m);
    uint32_t c = 0;
    for (int i = 0; i < num_uncovered; ++i) c |= static_cast<uint32_t>((masks[i] >> n) & 1u) << i;
    if (c == 0) continue;
    bool dominated = false;
    for (int i = 0; i < num_sets && !dominated; ++i) dominated = (c | sets[i]) == sets[i];
    if (dominated) continue;
    int kept = 0;
    for (int i = 0; i < num_sets; ++i) {
      if ((sets[i] | c) != c) {
        sets[kept] = sets[i];
        set_node[kept++] = set_node[i];
      }
    }
    num_sets = kept;
    sets[num_sets] = c;
    set_node[num_sets++] = n;
  }
  for (int i = 0; i < num_sets; ++i) {
    if (sets[i] == full) return uint64_t{1} << set_node[i];
  }
  if (num_sets <= 12) {
    int pick[12];
    for (int size = 2; size <= num_sets; ++size) {
      for (int i = 0; i < size; ++i) pick[i] = i;
      for (;;) {
        uint32_t covered = 0;
        for (int i = 0; i < size; ++i) covered |= sets[pick[i]];
        if (covered == full) {
          uint64_t nodes = 0;
          for (int i = 0; i < size; ++i) nodes |= uint64_t{1} << set_node[pick[i]];
          return nodes;
        }
        int pos = size - 1;
        while (pos >= 0 && pick[pos] == num_sets - size + pos) --pos;
        if (pos < 0) break;
        ++pick[pos];
        for (int i = pos + 1; i < size; ++i) pick[i] = pick[i - 1] + 1;
      }
    }
  }
  if (num_uncovered > dp_bits) return kCoverDeferred;
  // best[s] = fewest sets covering s; the CPU keeps, for each s, the first set index reaching the
  // minimum (strict improvement), so the reconstruction below re-derives that choice.
  const uint32_t num_states = uint32_t{1} << num_uncovered;
  best_table[0] = 0;
  for (uint32_t s = 1; s < num_states; ++s) {
    int b = 0xff;
    for (int i = 0; i < num_sets; ++i) {
      if ((sets[i] & s) == 0) continue;
      const int via = best_table[s & ~sets[i]] + 1;
      if (via < b) b = via;
    }
    best_table[s] = static_cast<uint8_t>(b);
  }
  uint64_t nodes = 0;
  for (uint32_t s = num_states - 1; s != 0;) {
    bool found = false;
    for (int i = 0; i < num_sets; ++i) {
      if ((sets[i] & s) != 0 && best_table[s & ~sets[i]] + 1 == best_table[s]) {
        nodes |= uint64_t{1} << set_node[i];
        s &= ~sets[i];
        found = true;
        break;
      }
    }
    if (!found) break;  // only for ids no node holds (invalid input): no hang
  }
  return nodes;
}

// One token: writes out[0 .. top_k) and returns true, or returns false (out partially written)
// when the subset DP needs a table larger than 2^dp_bits (kSubsetDp with > dp_bits uncovered
// experts and > 12 candidate covers only).
template <int kMaxK>
COBALT_HD inline bool assign_token(const AssignTables& tab, const int32_t* ids, int top_k,
                                   int32_t src_rank, uint64_t token_h, CoverMode mode,
                                   uint8_t* dp_table, int dp_bits, int32_t* out) {
  const int src_node = src_rank / tab.ranks_per_node;
  const uint64_t src_bit = uint64_t{1} << src_node;
  uint64_t mask[kMaxK];
  uint32_t uncovered = 0;
  uint64_t common = ~uint64_t{0};
  COBALT_UNROLL
  for (int k = 0; k < kMaxK; ++k) {
    if (k < top_k) {
      const int32_t e = ids[k];
      const uint64_t m = tab.node_mask[e];
      mask[k] = m;
      if (m & src_bit) {
        out[k] = pick_replica(tab, e, src_node, token_h, k);
      } else {
        uncovered |= uint32_t{1} << k;
        common &= m;
      }
    } else {
      mask[k] = 0;
    }
  }
  if (uncovered == 0) return true;
  uint64_t cover;
  if (common != 0) {
    // A node holding every uncovered expert, drawn uniformly among them (both modes).
    const uint32_t count = static_cast<uint32_t>(popc64(common));
    cover = count == 1 ? common
                       : uint64_t{1} << nth_set_bit(
                             common, uniform_below(cover_hash_from_token(token_h), count));
  } else if (mode == CoverMode::kMasks) {
    cover =
        tab.num_nodes <= kBitsetMaxNodes
            ? drawn_feasible_mask_bitset<kMaxK>(tab.num_nodes, src_node, mask, uncovered, top_k,
                                                token_h)
            : drawn_feasible_mask<kMaxK>(tab.num_nodes, src_node, mask, uncovered, top_k, token_h);
  } else {
    // The nodes relabelled cyclically from a remote node drawn uniformly, as the CPU's
    // rotated_subset_cover (src/assign/node_cover.cpp) does; mapped back after the search.
    const int n = tab.num_nodes;
    int start = src_node + 1 +
                static_cast<int>(
                    uniform_below(cover_hash_from_token(token_h), static_cast<uint32_t>(n - 1)));
    if (start >= n) start -= n;  // src + 1 + j <= 2 n - 2
    uint64_t compact[kMaxK];
    int num_uncovered = 0;
    for (int k = 0; k < top_k; ++k) {
      if ((uncovered >> k) & 1u) compact[num_uncovered++] = mask[k];
    }
    // A separate pass: rotating inside the compaction loop above made cicc (CUDA 13.0.88) crash
    // with a segmentation fault when compiling for compute_100.
    for (int i = 0; i < num_uncovered; ++i) compact[i] = rotate_nodes(compact[i], start, n);
    cover = min_cover_subset_dp(compact, num_uncovered, dp_table, dp_bits);
    if (cover == kCoverDeferred) return false;
    cover = rotate_nodes(cover, start == 0 ? 0 : n - start, n);
  }
  COBALT_UNROLL
  for (int k = 0; k < kMaxK; ++k) {
    if (k < top_k && ((uncovered >> k) & 1u)) {
      const uint64_t options = cover & mask[k];
      const int count = popc64(options);
      const int n = count == 1
                        ? ctz64(options)
                        : nth_set_bit(options, uniform_below(task_hash_from_token(token_h, k),
                                                             static_cast<uint32_t>(count)));
      out[k] = pick_replica(tab, ids[k], n, token_h, k);
    }
  }
  return true;
}

}  // namespace cobalt::cuda::detail
