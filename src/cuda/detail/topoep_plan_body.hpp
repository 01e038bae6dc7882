// GPU TopoEP solver, part 1 (src/cuda/topoep.cu and the host emulation): shapes and workspace, then
// kernels 1-3 — placement of inter-node replicas, routing, intra-node refinement. Each function
// mirrors a part of src/plan/topoep_solver.cpp; comments name the CPU code reproduced.
// Block-level phases take (tid, num_threads); warp-level phases a Warp policy (simt.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "detail/simt.hpp"

namespace cobalt::cuda::detail {

inline constexpr int32_t kTopoDroppedSlot = -2;  // a temporary replica removed at emit time

struct TopoShape {
  int num_ranks;    // G
  int num_experts;  // E
  int num_nodes;    // N
  int per_node;     // M = G / N
  int slots;        // S
  int max_moves;    // per node
  double token_bytes;
  double param_bytes;
};

struct TopoMove {
  int32_t expert, from, to, pad;
  int64_t count;
};

// Device (or, in the emulation, host) memory of one solve. Sizes in brackets.
struct TopoWork {
  const int64_t* demand;    // Omega [G, E]
  int64_t* node_demand;     // D [N, E]
  uint8_t* candidate;       // [N, E] stage (1) candidate flags
  int32_t* num_candidates;  // [N] (zeroed)
  int32_t* rep_rank;        // [N, E] rank of e's stage (1) replica on node n, -1
  int32_t* rep_slot;        // [N, E] its slot index on that rank
  int32_t* slot_expert;     // [G, S] -1 empty, kTopoDroppedSlot dropped
  int64_t* slot_load;       // [G, S] U[e, r] of the instance in that slot
  int32_t* slot_used;       // [G]
  int32_t* replicas_used;   // [G] temporary replicas (bookkeeping; capacity checks use slot_used)
  int64_t* rank_loads;      // L [G]
  int32_t* extra_count;     // [E] instances beyond the main (zeroed)
  TopoMove* moves;          // [N, max_moves]
  int32_t* num_moves;       // [N]
  int32_t* inst_rank;       // per expert e: 1 + extra_count[e] ranks, ascending; <= G * S in all
  int32_t* node_inst;       // [E, N] index into e's instances of its stage (1) instance on node n
  int32_t* stage1_inst;     // [E, N] indices of e's stage (1) instances, ascending
  int32_t* num_stage1;      // [E]
  int64_t* cell_count;      // per expert e: [G, 1 + extra_count[e]] task counts (src, instance)
  int32_t* cell_pos;        // same shape: index of the cell in the work list, -1
  int32_t* cell_list;       // same size: the work list (cell ids, CPU work order)
  int32_t* inst_expert;     // per instance g (experts ascending, then instances): its expert
  int64_t* inst_cell0;      // its cell for source 0 (cell of source s: + s * inst_stride[g])
  int32_t* inst_stride;     // 1 + extra_count of its expert
  int64_t* source_count;    // [G] non-zero quotas per source rank
  int64_t* stats;           // [4] (zeroed): inter, intra, moves, dropped
  int32_t* status;          // [1] (zeroed)
};

// The workspace layout (host code: sizes when assign is false, pointers into base when true).
// num_candidates and extra_count come last and adjacent, so one memset zeroes both.
struct TopoCarve {
  size_t bytes = 0;
  TopoWork work{};
};
inline TopoCarve topo_carve(const TopoShape& s, void* base, bool assign) {
  const size_t G = s.num_ranks, E = s.num_experts, N = s.num_nodes, S = s.slots;
  const size_t instances = G * S;  // every instance occupies a slot
  const size_t cells = G * instances;
  TopoCarve out;
  size_t at = 0;
  auto take = [&](auto*& p, size_t count) {
    using T = std::remove_pointer_t<std::remove_reference_t<decltype(p)>>;
    if (assign) p = reinterpret_cast<T*>(static_cast<char*>(base) + at);
    at += carve_size<T>(count);
  };
  TopoWork& w = out.work;
  take(w.node_demand, N * E);
  take(w.candidate, N * E);
  take(w.rep_rank, N * E);
  take(w.rep_slot, N * E);
  take(w.slot_expert, G * S);
  take(w.slot_load, G * S);
  take(w.slot_used, G);
  take(w.replicas_used, G);
  take(w.rank_loads, G);
  take(w.moves, N * static_cast<size_t>(s.max_moves));
  take(w.num_moves, N);
  take(w.inst_rank, instances);
  take(w.node_inst, E * N);
  take(w.stage1_inst, E * N);
  take(w.num_stage1, E);
  take(w.cell_count, cells);
  take(w.cell_pos, cells);
  take(w.cell_list, cells);
  take(w.inst_expert, instances);
  take(w.inst_cell0, instances);
  take(w.inst_stride, instances);
  take(w.source_count, G);
  take(w.num_candidates, N);
  take(w.extra_count, E);
  out.bytes = at;
  return out;
}
// Bytes from num_candidates to the end of extra_count (the block to zero before a solve).
inline size_t topo_zero_bytes(const TopoShape& s, const TopoWork& w) {
  return static_cast<size_t>(reinterpret_cast<const char*>(w.extra_count) -
                             reinterpret_cast<const char*>(w.num_candidates)) +
         sizeof(int32_t) * s.num_experts;
}

COBALT_HD inline int32_t topo_main_rank(int64_t e, const TopoShape& s) {
  return static_cast<int32_t>(e * s.num_ranks / s.num_experts);
}
// First expert whose main is rank r: ceil(r E / G).
COBALT_HD inline int32_t topo_first_main(int64_t r, const TopoShape& s) {
  return static_cast<int32_t>((r * s.num_experts + s.num_ranks - 1) / s.num_ranks);
}
COBALT_HD inline int topo_num_mains(int r, const TopoShape& s) {
  return topo_first_main(r + 1, s) - topo_first_main(r, s);
}

// A node's slots at stage (1). Its ranks hold `top` or `top` - 1 mains (main(e) = floor(e G / E)
// gives every rank floor or ceil(E / G)); the `num_light` ranks with `top` - 1 have one slot more
// for replicas; `capacity` = its free slots (S x M - its mains).
struct TopoNodeSlots {
  int top;
  int num_light;
  int64_t capacity;
};
COBALT_HD inline TopoNodeSlots topo_node_slots(const TopoShape& s, int d) {
  const int first = d * s.per_node;
  TopoNodeSlots out{0, 0, 0};
  for (int i = 0; i < s.per_node; ++i) out.top = hd_max(out.top, topo_num_mains(first + i, s));
  for (int i = 0; i < s.per_node; ++i) {
    const int mains = topo_num_mains(first + i, s);
    out.num_light += mains < out.top ? 1 : 0;
    out.capacity += s.slots - mains;
  }
  return out;
}

COBALT_HD inline void topo_flag(int32_t* status, int32_t code) {
#if defined(__CUDA_ARCH__)
  atomicOr(status, code);
#else
  *status |= code;
#endif
}

// --- Kernel 1: per node d (solve()'s set-up of mains and D, then place_inter_node) ------------

// Phase A: main instances of the node's ranks, D[d, :], candidates (main elsewhere, benefit > 0).
COBALT_HD inline void topo_place_phase_a(int tid, int num_threads, const TopoShape& s,
                                         const TopoWork& w, int d) {
  const int first = d * s.per_node;
  for (int i = tid; i < s.per_node; i += num_threads) {
    const int r = first + i;
    const int mains = topo_num_mains(r, s);
    const int32_t e0 = topo_first_main(r, s);
    for (int j = 0; j < s.slots; ++j) {
      w.slot_expert[static_cast<int64_t>(r) * s.slots + j] = j < mains ? e0 + j : -1;
      w.slot_load[static_cast<int64_t>(r) * s.slots + j] = 0;
    }
    w.replicas_used[r] = 0;
    w.slot_used[r] = mains;
    w.rank_loads[r] = 0;
  }
  const bool stage1 = s.num_nodes > 1 && topo_node_slots(s, d).capacity > 0;
  for (int e = tid; e < s.num_experts; e += num_threads) {
    int64_t sum = 0;
    bool negative = false;
    for (int i = 0; i < s.per_node; ++i) {
      const int64_t v = w.demand[static_cast<int64_t>(first + i) * s.num_experts + e];
      negative = negative || v < 0;
      sum += v;
    }
    if (negative) topo_flag(w.status, 1);
    const int64_t idx = static_cast<int64_t>(d) * s.num_experts + e;
    w.node_demand[idx] = sum;
    w.rep_rank[idx] = -1;
    w.rep_slot[idx] = -1;
    bool cand = false;
    if (stage1 && topo_main_rank(e, s) / s.per_node != d) {
      const double benefit =
          sub_rn(mul_rn(mul_rn(2.0, static_cast<double>(sum)), s.token_bytes), s.param_bytes);
      cand = benefit > 0;
    }
    w.candidate[idx] = cand ? 1 : 0;
    if (cand) atomic_add_i32(&w.num_candidates[d], 1);
  }
}

// Phase B: candidate i in (D desc, id asc) order, if i < the node's free slots, goes where the
// CPU's "least occupied rank (mains included), ties lower rank" puts it: the first num_light
// candidates to the light ranks (one mains fewer) in rank order, then candidate num_light + j to
// local rank j mod M, slot top + j div M (every rank is then at `top`: the greedy goes round in
// rank order). With equal mains on every rank (G divides E) that is rank i mod M, slot
// mains + i div M. Two ways to find the order: each candidate
// counts the candidates before it (topo_place_phase_b, O(E^2) over the block: E = 640 is 640
// dependent steps for the threads of the hottest candidates), or the node's candidates are sorted
// in shared memory (topo_sort_*, then topo_place_sorted: O(E log^2 E) over the block), when the
// padded key array fits (topo_place_sort_size).
COBALT_HD inline void topo_place_one(const TopoShape& s, const TopoNodeSlots& node,
                                     const TopoWork& w, int d, int e, int64_t rank) {
  const int first = d * s.per_node;
  const int64_t row = static_cast<int64_t>(d) * s.num_experts;
  int r = first, slot = 0;
  if (rank < node.num_light) {
    for (int seen = -1;; ++r) {  // the rank-th light rank
      seen += topo_num_mains(r, s) < node.top ? 1 : 0;
      if (seen == rank) break;
    }
    slot = node.top - 1;
  } else {
    const int64_t j = rank - node.num_light;
    r = first + static_cast<int>(j % s.per_node);
    slot = node.top + static_cast<int>(j / s.per_node);
  }
  w.slot_expert[static_cast<int64_t>(r) * s.slots + slot] = e;
  w.rep_rank[row + e] = r;
  w.rep_slot[row + e] = slot;
  atomic_add_i32(&w.extra_count[e], 1);
}

// The replica counts of the node's ranks and the stats, once its candidates are placed.
COBALT_HD inline void topo_place_counts(int tid, int num_threads, const TopoShape& s,
                                        const TopoWork& w, int d) {
  const int first = d * s.per_node;
  const TopoNodeSlots node = topo_node_slots(s, d);
  const int64_t placed = hd_min<int64_t>(w.num_candidates[d], node.capacity);
  const int64_t light_placed = hd_min<int64_t>(placed, node.num_light);
  const int64_t round = placed - light_placed;  // placed by the round over every rank
  int light_idx = 0;                            // light ranks before rank first + i
  for (int i = 0; i < s.per_node; ++i) {
    const int r = first + i;
    const int mains = topo_num_mains(r, s);
    const bool light = mains < node.top;
    int reps = static_cast<int>(round / s.per_node + (i < round % s.per_node ? 1 : 0));
    reps += light && light_idx < light_placed ? 1 : 0;
    light_idx += light ? 1 : 0;
    if (i % num_threads != tid) continue;
    w.replicas_used[r] = reps;
    w.slot_used[r] = mains + reps;
  }
  if (tid == 0 && placed > 0) atomic_add_i64(&w.stats[0], placed);
}

COBALT_HD inline void topo_place_phase_b(int tid, int num_threads, const TopoShape& s,
                                         const TopoWork& w, int d) {
  const TopoNodeSlots node = topo_node_slots(s, d);
  const int64_t capacity = node.capacity;
  const int64_t row = static_cast<int64_t>(d) * s.num_experts;
  for (int e = tid; e < s.num_experts; e += num_threads) {
    if (!w.candidate[row + e]) continue;
    const int64_t mine = w.node_demand[row + e];
    int64_t rank = 0;
    for (int j = 0; j < s.num_experts && rank < capacity; ++j) {
      if (!w.candidate[row + j]) continue;
      const int64_t other = w.node_demand[row + j];
      rank += (other > mine || (other == mine && j < e)) ? 1 : 0;
    }
    if (rank < capacity) topo_place_one(s, node, w, d, e, rank);
  }
  topo_place_counts(tid, num_threads, s, w, d);
}

// A sort key: a candidate's D and id; non-candidates and padding sort last (D = -1; a
// candidate's D is > 0: its benefit 2 D S_tok - |W_e| is > 0 with |W_e| >= 0).
struct TopoSortKey {
  int64_t demand;
  int32_t expert;
  int32_t pad;
};
// (D desc, id asc): a before b.
COBALT_HD inline bool topo_key_before(const TopoSortKey& a, const TopoSortKey& b) {
  return a.demand > b.demand || (a.demand == b.demand && a.expert < b.expert);
}
// The padded key count (a power of two >= E) when it is at most kTopoSortMaxKeys (E <= 2048: 32
// KB of shared memory); 0 when it is more (phase B counts ranks instead).
inline constexpr int kTopoSortMaxKeys = 2048;  // 32 KB of keys
COBALT_HD inline int topo_place_sort_size(const TopoShape& s) {
  int size = 1;
  while (size < s.num_experts && size <= kTopoSortMaxKeys) size <<= 1;
  return size <= kTopoSortMaxKeys ? size : 0;
}
COBALT_HD inline void topo_sort_keys(int tid, int num_threads, const TopoShape& s,
                                     const TopoWork& w, int d, TopoSortKey* keys, int size) {
  const int64_t row = static_cast<int64_t>(d) * s.num_experts;
  for (int i = tid; i < size; i += num_threads) {
    const bool cand = i < s.num_experts && w.candidate[row + i];
    keys[i] = TopoSortKey{cand ? w.node_demand[row + i] : -1, i, 0};
  }
}
// One stage (k, j) of a bitonic sort of keys [size] into topo_key_before order; the stages run
// for k = 2, 4, .., size and, within each, j = k / 2, .., 1, with a barrier after each.
COBALT_HD inline void topo_sort_stage(int tid, int num_threads, TopoSortKey* keys, int size, int k,
                                      int j) {
  for (int i = tid; i < size; i += num_threads) {
    const int l = i ^ j;
    if (l <= i) continue;
    const bool ascending = (i & k) == 0;
    if (ascending ? topo_key_before(keys[l], keys[i]) : topo_key_before(keys[i], keys[l])) {
      const TopoSortKey t = keys[i];
      keys[i] = keys[l];
      keys[l] = t;
    }
  }
}
// After the sort: the candidate at position i < the node's free slots is placed with rank i
// (topo_place_one).
COBALT_HD inline void topo_place_sorted(int tid, int num_threads, const TopoShape& s,
                                        const TopoWork& w, int d, const TopoSortKey* keys,
                                        int size) {
  const TopoNodeSlots node = topo_node_slots(s, d);
  for (int64_t i = tid; i < node.capacity && i < size; i += num_threads) {
    if (keys[i].demand >= 0) topo_place_one(s, node, w, d, keys[i].expert, i);
  }
  topo_place_counts(tid, num_threads, s, w, d);
}

// --- Kernel 2: per expert e (route) ----------------------------------------------------------

// Each (s, e) demand goes to e's instance on s's node if any (stage (1) leaves at most one per
// node), else to all instances: floor(w / k) each and one more for positions (i - s) mod k <
// w mod k (instances in ascending rank order, which is ascending node order here).
COBALT_HD inline void topo_route_expert(const TopoShape& s, const TopoWork& w, int e) {
  const int main = topo_main_rank(e, s);
  const int main_node = main / s.per_node;
  int64_t load[64];  // per node (N <= 64)
  int num_inst = 0;
  for (int n = 0; n < s.num_nodes; ++n) {
    load[n] = 0;
    const bool has = n == main_node || w.rep_rank[static_cast<int64_t>(n) * s.num_experts + e] >= 0;
    num_inst += has ? 1 : 0;
  }
  for (int src = 0; src < s.num_ranks; ++src) {
    const int64_t v = w.demand[static_cast<int64_t>(src) * s.num_experts + e];
    if (v <= 0) continue;
    const int n = src / s.per_node;
    if (n == main_node || w.rep_rank[static_cast<int64_t>(n) * s.num_experts + e] >= 0) {
      load[n] += v;
      continue;
    }
    const int k = num_inst;
    const int64_t base = v / k, leftover = v % k;
    int i = 0;
    for (int m = 0; m < s.num_nodes; ++m) {
      if (!(m == main_node || w.rep_rank[static_cast<int64_t>(m) * s.num_experts + e] >= 0)) {
        continue;
      }
      load[m] += base + (((i - src % k) + k) % k < leftover ? 1 : 0);
      ++i;
    }
  }
  for (int n = 0; n < s.num_nodes; ++n) {
    if (n == main_node) {
      const int slot = e - topo_first_main(main, s);
      w.slot_load[static_cast<int64_t>(main) * s.slots + slot] = load[n];
      if (load[n] != 0) atomic_add_i64(&w.rank_loads[main], load[n]);
      continue;
    }
    const int64_t idx = static_cast<int64_t>(n) * s.num_experts + e;
    const int r = w.rep_rank[idx];
    if (r < 0) continue;
    w.slot_load[static_cast<int64_t>(r) * s.slots + w.rep_slot[idx]] = load[n];
    if (load[n] != 0) atomic_add_i64(&w.rank_loads[r], load[n]);
  }
}

// --- Kernel 3: per node (refine_node) --------------------------------------------------------

// The node's state, indexed by local rank 0 .. M-1 (shared memory on the device when it fits).
struct TopoNodeState {
  int32_t* slot_expert;    // [M, S]
  int64_t* slot_load;      // [M, S]
  int32_t* slot_used;      // [M]
  int32_t* replicas_used;  // [M]
  int64_t* loads;          // [M]
};

struct TopoCandidate {
  int64_t delta;
  int64_t target_load;
  int32_t cost;
  int32_t expert;  // -1: none
  int32_t target;  // local rank
  int32_t from_slot;
  int32_t to_slot;  // -1: new replica
  int32_t pad;
};

// topoep_solver.cpp's Candidate::better_than: larger delta, smaller target load, smaller cost,
// lower expert, lower target; any candidate beats none.
COBALT_HD inline bool topo_better(const TopoCandidate& a, const TopoCandidate& b) {
  if (a.expert < 0) return false;
  if (b.expert < 0) return true;
  if (a.delta != b.delta) return a.delta > b.delta;
  if (a.target_load != b.target_load) return a.target_load < b.target_load;
  if (a.cost != b.cost) return a.cost < b.cost;
  if (a.expert != b.expert) return a.expert < b.expert;
  return a.target < b.target;
}

template <typename Warp>
COBALT_HD inline void topo_refine_node(const Warp& warp, const TopoShape& s, const TopoWork& w,
                                       const TopoNodeState& st, int node) {
  const int M = s.per_node, S = s.slots;
  if (M < 2) {  // refine_node: nothing to balance within a one-rank node
    if (warp.leader()) w.num_moves[node] = 0;
    warp.sync();
    return;
  }
  TopoMove* log = w.moves + static_cast<int64_t>(node) * s.max_moves;
  int num_moves = 0;
  int64_t created = 0;
  for (;;) {
    int busiest = 0;  // local rank; ties: lower
    for (int r = 1; r < M; ++r) {
      if (st.loads[r] > st.loads[busiest]) busiest = r;
    }
    const int64_t busy_load = st.loads[busiest];
    const int num_cand = S * M;
    const TopoCandidate best = warp.template reduce<TopoCandidate>(
        [&](int lane) {
          TopoCandidate mine{0, 0, 0, -1, 0, 0, 0, 0};
          for (int c = lane; c < num_cand; c += Warp::kLanes) {
            const int j = c / M, t = c - j * M;
            if (t == busiest || j >= st.slot_used[busiest]) continue;
            const int32_t e = st.slot_expert[busiest * S + j];
            if (e < 0) continue;
            const int64_t from_load = st.slot_load[busiest * S + j];
            if (from_load <= 0) continue;
            const int64_t gap = busy_load - st.loads[t];
            if (gap < 2) continue;
            int to_slot = -1;
            for (int q = 0; q < st.slot_used[t]; ++q) {
              if (st.slot_expert[t * S + q] == e) {
                to_slot = q;
                break;
              }
            }
            if (to_slot < 0 && st.slot_used[t] >= S) continue;
            const bool main_here = topo_main_rank(e, s) / M == node;
            TopoCandidate cand{hd_min(from_load, gap / 2),
                               st.loads[t],
                               to_slot >= 0 ? 0 : (main_here ? 1 : 2),
                               e,
                               t,
                               j,
                               to_slot,
                               0};
            if (topo_better(cand, mine)) mine = cand;
          }
          return mine;
        },
        [](const TopoCandidate& a, const TopoCandidate& b) { return topo_better(a, b); });
    if (best.expert < 0) break;
    if (num_moves >= s.max_moves) {
      topo_flag(w.status, 2);
      break;
    }
    const int t = best.target;
    // Every lane's reads of the node state (the busiest-rank scan and the candidates) end before
    // the leader writes it: shuffles order the values, but for racecheck only a barrier orders
    // the shared-memory accesses.
    warp.sync();
    if (warp.leader()) {
      int to_slot = best.to_slot;
      if (to_slot < 0) {
        to_slot = st.slot_used[t]++;
        st.slot_expert[t * S + to_slot] = best.expert;
        st.slot_load[t * S + to_slot] = 0;
        st.replicas_used[t] += 1;
        atomic_add_i32(&w.extra_count[best.expert], 1);
      }
      st.slot_load[t * S + to_slot] += best.delta;
      st.slot_load[busiest * S + best.from_slot] -= best.delta;
      st.loads[busiest] -= best.delta;
      st.loads[t] += best.delta;
      const int first = node * M;
      log[num_moves] = TopoMove{best.expert, first + busiest, first + t, 0, best.delta};
    }
    created += best.to_slot < 0 ? 1 : 0;
    ++num_moves;
    warp.sync();
  }
  if (warp.leader()) {
    w.num_moves[node] = num_moves;
    if (created) atomic_add_i64(&w.stats[1], created);
    if (num_moves) atomic_add_i64(&w.stats[2], num_moves);
  }
  warp.sync();
}

}  // namespace cobalt::cuda::detail
