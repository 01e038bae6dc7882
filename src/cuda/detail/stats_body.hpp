// Body of the GPU routing-statistics kernels (src/cuda/routing_stats.cu), shared with their host
// emulation (src/cuda/emulation_test.cpp). Same integers as cobalt::count_routing:
//   * counters: loads [E], then the upper triangle (diagonal included) of the pair counts,
//     row-major, E (E + 1) / 2 entries: num_counters(E) in all;
//   * count pass: a warp takes 32 consecutive tokens (lane l: token base + l); for every task a
//     load bump, for every pair (a < b) of the row a bump of key {min, max}; with aggregation the
//     lanes holding equal keys are merged first (match_any) and their leader adds the group size,
//     so a hot key costs one atomic per warp instead of 32 serialised ones;
//   * finalize: entry (y, c) of the [E + 1, E] output grid, y < E and c >= y: the pair count summed
//     over the block partials, written to (y, c) and (c, y); y == E: the load of expert c.
#pragma once

#include <cstdint>

#include "detail/simt.hpp"

namespace cobalt::cuda::detail {

COBALT_HD constexpr int64_t stats_num_pair_keys(int num_experts) {
  return static_cast<int64_t>(num_experts) * (num_experts + 1) / 2;
}
COBALT_HD constexpr int64_t stats_num_counters(int num_experts) {
  return num_experts + stats_num_pair_keys(num_experts);
}
// Key of the unordered pair {i, j}, i <= j, within the pair counters.
COBALT_HD inline int64_t stats_pair_key(int i, int j, int num_experts) {
  return static_cast<int64_t>(i) * num_experts - static_cast<int64_t>(i) * (i - 1) / 2 + (j - i);
}

// One bump per lane of counters[key(lane)]; lanes with key -1 have no task.
template <bool kAggregate, typename Warp, typename Counter, typename KeyFn>
COBALT_HD inline void stats_bump(const Warp& w, Counter* counters, KeyFn&& key) {
  if constexpr (kAggregate) {
    typename Warp::template Lanes<uint32_t> peers;
    w.match_any(key, peers);
    w.for_lanes([&](int l) {
      const int64_t k = key(l);
      if (k >= 0 && ctz32(peers[l]) == l) {
        atomic_add_counter(&counters[k], static_cast<Counter>(popc32(peers[l])));
      }
    });
  } else {
    w.for_lanes([&](int l) {
      const int64_t k = key(l);
      if (k >= 0) atomic_add_counter(&counters[k], Counter{1});
    });
  }
}

// Counts tokens [base, base + 32) of topk_ids [T, K] (those below num_tokens) into counters.
// kMaxK > 0: each lane's row is held in registers (K <= kMaxK); kMaxK == 0: any K, read from
// memory. base < num_tokens.
template <int kMaxK, bool kAggregate, typename Warp, typename Counter>
COBALT_HD inline void stats_count_warp(const Warp& w, const int32_t* topk_ids, int64_t base,
                                       int64_t num_tokens, int top_k, int num_experts,
                                       Counter* counters) {
  Counter* loads = counters;
  Counter* pairs = counters + num_experts;
  const auto valid = [&](int l) { return base + l < num_tokens; };
  // Row of lane l (lanes past the end read token base, which exists).
  const auto row_of = [&](int l) { return topk_ids + (valid(l) ? base + l : base) * top_k; };
  const auto pair = [&](int32_t x, int32_t y) -> int64_t {
    return x < y ? stats_pair_key(x, y, num_experts) : stats_pair_key(y, x, num_experts);
  };
  if constexpr (kMaxK > 0) {
    struct Row {
      int32_t id[kMaxK];
    };
    typename Warp::template Lanes<Row> rows;
    w.for_lanes([&](int l) {
      const int32_t* p = row_of(l);
      COBALT_UNROLL
      for (int k = 0; k < kMaxK; ++k) rows[l].id[k] = k < top_k ? load_readonly(p + k) : 0;
    });
    COBALT_UNROLL
    for (int a = 0; a < kMaxK; ++a) {
      if (a >= top_k) break;
      stats_bump<kAggregate>(w, loads,
                             [&](int l) -> int64_t { return valid(l) ? rows[l].id[a] : -1; });
      COBALT_UNROLL
      for (int b = a + 1; b < kMaxK; ++b) {
        if (b >= top_k) break;
        stats_bump<kAggregate>(w, pairs, [&](int l) -> int64_t {
          return valid(l) ? pair(rows[l].id[a], rows[l].id[b]) : -1;
        });
      }
    }
  } else {
    for (int a = 0; a < top_k; ++a) {
      stats_bump<kAggregate>(
          w, loads, [&](int l) -> int64_t { return valid(l) ? load_readonly(row_of(l) + a) : -1; });
      for (int b = a + 1; b < top_k; ++b) {
        stats_bump<kAggregate>(w, pairs, [&](int l) -> int64_t {
          return valid(l) ? pair(load_readonly(row_of(l) + a), load_readonly(row_of(l) + b)) : -1;
        });
      }
    }
  }
}

// Output entry (y, c) of the finalize grid (see the file comment). partials: num_partials blocks
// of num_counters(E) 32-bit counters (shared-memory variant), or nullptr with global_counters
// (global variant).
COBALT_HD inline void stats_finalize_entry(int y, int c, int num_experts, int num_partials,
                                           const uint32_t* partials,
                                           const unsigned long long* global_counters,
                                           int64_t* expert_counts, int64_t* coactivation) {
  if (c >= num_experts || (y < num_experts && c < y)) return;
  const int64_t key = y == num_experts ? c : num_experts + stats_pair_key(y, c, num_experts);
  int64_t sum = 0;
  if (partials != nullptr) {
    const int64_t entries = stats_num_counters(num_experts);
    for (int b = 0; b < num_partials; ++b) sum += partials[static_cast<int64_t>(b) * entries + key];
  } else {
    sum = static_cast<int64_t>(global_counters[key]);
  }
  if (y == num_experts) {
    expert_counts[c] = sum;
  } else {
    coactivation[static_cast<int64_t>(y) * num_experts + c] = sum;
    coactivation[static_cast<int64_t>(c) * num_experts + y] = sum;
  }
}

}  // namespace cobalt::cuda::detail
