// GPU TopoEP solver, part 2: kernels 4-7 — per-(source, expert, destination) quotas (emit and
// apply_moves of src/plan/topoep_solver.cpp) and the slot table.
#pragma once

#include <cstddef>
#include <cstdint>

#include "detail/topoep_plan_body.hpp"

namespace cobalt::cuda::detail {

// --- Kernels 4-6: the quotas (emit and apply_moves) ------------------------------------------

// Instances before e (prefix of 1 + extra_count) and e's count.
template <typename Warp>
COBALT_HD inline int64_t topo_instances_before(const Warp& warp, const TopoWork& w, int e) {
  return warp.sum([&](int lane) {
    int64_t sum = 0;
    for (int i = lane; i < e; i += Warp::kLanes) sum += 1 + w.extra_count[i];
    return sum;
  });
}

COBALT_HD inline int topo_index_of(const int32_t* ranks, int count, int32_t r) {
  for (int i = 0; i < count; ++i) {
    if (ranks[i] == r) return i;
  }
  return -1;
}

// Calls f(move) for every move of expert e in the CPU's order (node ascending, then log order):
// emit() stable-sorts the move log by expert.
template <typename Warp, typename F>
COBALT_HD inline void topo_for_moves_of(const Warp& warp, const TopoShape& s, const TopoWork& w,
                                        int e, F&& f) {
  for (int n = 0; n < s.num_nodes; ++n) {
    const int count = w.num_moves[n];
    const TopoMove* log = w.moves + static_cast<int64_t>(n) * s.max_moves;
    for (int i0 = 0; i0 < count; i0 += Warp::kLanes) {
      uint32_t hits = warp.ballot([&](int lane) {
        const int i = i0 + lane;
        return i < count && log[i].expert == e;
      });
      while (hits) {
        const int i = i0 + ctz32(hits);
        hits &= hits - 1;
        f(log[i]);
      }
    }
  }
}

// Kernel 4: builds e's (src, instance) quota matrix: route()'s quotas for e in work order (sources
// ascending, instances ascending), then every move of e replayed with apply_moves()'s three passes
// over the work list; drops temporary replicas left without tasks (moved experts only).
template <typename Warp>
COBALT_HD inline void topo_emit_expert(const Warp& warp, const TopoShape& s, const TopoWork& w,
                                       int e) {
  const int G = s.num_ranks, N = s.num_nodes, M = s.per_node;
  const int64_t before = topo_instances_before(warp, w, e);
  const int I = 1 + w.extra_count[e];
  int32_t* inst = w.inst_rank + before;
  int64_t* cnt = w.cell_count + before * G;
  int32_t* pos = w.cell_pos + before * G;
  int32_t* list = w.cell_list + before * G;
  int32_t* node_inst = w.node_inst + static_cast<int64_t>(e) * N;
  int32_t* stage1 = w.stage1_inst + static_cast<int64_t>(e) * N;
  const int main = topo_main_rank(e, s);
  const int main_node = main / M;

  // 1. Instances in ascending rank: main, stage (1) replicas, replicas created by moves. All lanes
  // track `count`; the leader writes.
  int count = 0;
  auto insert = [&](int32_t r) {
    if (topo_index_of(inst, count, r) >= 0) return;
    if (count >= I) {  // more instances than extra_count says: a bug
      if (warp.leader()) topo_flag(w.status, 8);
      return;
    }
    warp.sync();
    if (warp.leader()) {
      int i = count;
      while (i > 0 && inst[i - 1] > r) {
        inst[i] = inst[i - 1];
        --i;
      }
      inst[i] = r;
    }
    ++count;
    warp.sync();
  };
  insert(main);
  for (int n = 0; n < N; ++n) {
    const int r = w.rep_rank[static_cast<int64_t>(n) * s.num_experts + e];
    if (r >= 0) insert(r);
  }
  topo_for_moves_of(warp, s, w, e, [&](const TopoMove& m) { insert(m.to); });
  if (warp.leader()) {
    if (count != I) topo_flag(w.status, 8);
    int k = 0;
    for (int n = 0; n < N; ++n) {
      const int r = n == main_node ? main : w.rep_rank[static_cast<int64_t>(n) * s.num_experts + e];
      node_inst[n] = r >= 0 ? topo_index_of(inst, count, r) : -1;
      if (r >= 0) stage1[k++] = node_inst[n];
    }
    w.num_stage1[e] = k;
  }
  warp.sync();
  const int k_all = w.num_stage1[e];

  // 2. Clear the (src, instance) matrix.
  warp.for_lanes([&](int lane) {
    for (int64_t c = lane; c < static_cast<int64_t>(G) * I; c += Warp::kLanes) {
      cnt[c] = 0;
      pos[c] = -1;
    }
  });
  warp.sync();

  // 3. route()'s quotas of e: sources ascending; per source its instances ascending, zero counts
  // skipped. 32 sources at a time, list positions by a warp prefix sum.
  int length = 0;
  for (int s0 = 0; s0 < G; s0 += Warp::kLanes) {
    auto quotas_of = [&](int lane) -> int {
      const int src = s0 + lane;
      if (src >= G) return 0;
      const int64_t v = w.demand[static_cast<int64_t>(src) * s.num_experts + e];
      if (v <= 0) return 0;
      if (node_inst[src / M] >= 0) return 1;
      return v >= k_all ? k_all : static_cast<int>(v);  // positions with a non-zero share
    };
    typename Warp::template Lanes<int64_t> offset;
    int64_t total = 0;
    warp.exclusive_prefix(quotas_of, offset, total);
    warp.for_lanes([&](int lane) {
      const int src = s0 + lane;
      if (src >= G) return;
      const int64_t v = w.demand[static_cast<int64_t>(src) * s.num_experts + e];
      if (v <= 0) return;
      int at = length + static_cast<int>(offset[lane]);
      const int local = node_inst[src / M];
      if (local >= 0) {
        const int cell = src * I + local;
        cnt[cell] = v;
        pos[cell] = at;
        list[at] = cell;
        return;
      }
      const int64_t base = v / k_all, leftover = v % k_all;
      for (int i = 0; i < k_all; ++i) {
        const int64_t c = base + (((i - src % k_all) + k_all) % k_all < leftover ? 1 : 0);
        if (c == 0) continue;
        const int cell = src * I + stage1[i];
        cnt[cell] = c;
        pos[cell] = at;
        list[at++] = cell;
      }
    });
    length += static_cast<int>(total);
    warp.sync();
  }

  // 4. Replay the moves (emit(): the target's own tasks first, then other sources in work order,
  // the origin rank's own tasks last; merged into an existing (src, to) quota or appended).
  bool moved = false;
  topo_for_moves_of(warp, s, w, e, [&](const TopoMove& m) {
    moved = true;
    const int jf = topo_index_of(inst, I, m.from);
    const int jt = topo_index_of(inst, I, m.to);
    int64_t remaining = m.count;
    const int n = length;
    for (int pass = 0; pass < 3 && remaining > 0; ++pass) {
      for (int i0 = 0; i0 < n && remaining > 0; i0 += Warp::kLanes) {
        uint32_t hits = warp.ballot([&](int lane) {
          const int i = i0 + lane;
          if (i >= n) return false;
          const int cell = list[i];
          const int src = cell / I, j = cell - src * I;
          if (j != jf) return false;
          if (pass == 0) return src == m.to;
          if (pass == 1) return src != m.to && src != m.from;
          return src == m.from;
        });
        while (hits && remaining > 0) {
          const int i = i0 + ctz32(hits);
          hits &= hits - 1;
          const int cell = list[i];
          const int64_t take = hd_min(cnt[cell], remaining);
          if (take == 0) continue;
          const int target = (cell / I) * I + jt;
          const int32_t existing = pos[target];
          warp.sync();
          if (warp.leader()) {
            cnt[cell] -= take;
            if (existing >= 0) {
              cnt[target] += take;
            } else {
              pos[target] = length;
              list[length] = target;
              cnt[target] = take;
            }
          }
          remaining -= take;
          if (existing < 0) ++length;
          warp.sync();
        }
      }
    }
    if (remaining != 0 && warp.leader()) topo_flag(w.status, 8);
  });

  // 5. Where the per-source passes find e's cells; replicas of a moved expert left without tasks
  // are dropped (only moved experts: emit() applies the drop in apply_moves).
  warp.for_lanes([&](int lane) {
    for (int j = lane; j < I; j += Warp::kLanes) {
      w.inst_expert[before + j] = e;
      w.inst_cell0[before + j] = before * G + j;
      w.inst_stride[before + j] = I;
    }
  });
  if (moved) {
    warp.for_lanes([&](int lane) {
      for (int j = lane; j < I; j += Warp::kLanes) {
        if (inst[j] == main) continue;
        int64_t load = 0;
        for (int src = 0; src < G; ++src) load += cnt[src * I + j];
        if (load != 0) continue;
        const int r = inst[j];
        for (int q = 0; q < s.slots; ++q) {
          if (w.slot_expert[static_cast<int64_t>(r) * s.slots + q] == e) {
            w.slot_expert[static_cast<int64_t>(r) * s.slots + q] = kTopoDroppedSlot;
            break;
          }
        }
        atomic_add_i64(&w.stats[3], 1);
      }
    });
  }
  warp.sync();
}

// All instances of all experts (sum of 1 + extra_count).
template <typename Warp>
COBALT_HD inline int64_t topo_total_instances(const Warp& warp, const TopoShape& s,
                                              const TopoWork& w) {
  return warp.sum([&](int lane) {
    int64_t sum = 0;
    for (int i = lane; i < s.num_experts; i += Warp::kLanes) sum += 1 + w.extra_count[i];
    return sum;
  });
}

// Kernel 5: non-zero quotas of source rank `src` (over every expert's matrix row `src`).
template <typename Warp>
COBALT_HD inline void topo_count_source(const Warp& warp, const TopoShape& s, const TopoWork& w,
                                        int src) {
  const int64_t total = topo_total_instances(warp, s, w);
  const int64_t nonzero = warp.sum([&](int lane) {
    int64_t c = 0;
    for (int64_t g = lane; g < total; g += Warp::kLanes) {
      c += w.cell_count[w.inst_cell0[g] + static_cast<int64_t>(src) * w.inst_stride[g]] != 0;
    }
    return c;
  });
  if (warp.leader()) w.source_count[src] = nonzero;
  warp.sync();
}

// Kernel 6: source `src`'s quotas at source_offsets[src]: instances in (expert, rank) order, so
// the quotas come sorted by (expert, dst) as emit() merges them.
template <typename Warp, typename Quota>
COBALT_HD inline void topo_write_source(const Warp& warp, const TopoShape& s, const TopoWork& w,
                                        int src, int64_t* source_offsets, Quota* quotas,
                                        int64_t capacity) {
  const int64_t total = topo_total_instances(warp, s, w);
  const int64_t offset = warp.sum([&](int lane) {
    int64_t sum = 0;
    for (int i = lane; i < src; i += Warp::kLanes) sum += w.source_count[i];
    return sum;
  });
  const int64_t mine = w.source_count[src];
  if (warp.leader()) {
    source_offsets[src] = offset;
    if (src == s.num_ranks - 1) source_offsets[s.num_ranks] = offset + mine;
  }
  if (offset + mine > capacity) {
    if (warp.leader()) topo_flag(w.status, 4);
    return;
  }
  int64_t at = offset;
  for (int64_t g0 = 0; g0 < total; g0 += Warp::kLanes) {
    auto cell_of = [&](int64_t g) {
      return w.inst_cell0[g] + static_cast<int64_t>(src) * w.inst_stride[g];
    };
    const uint32_t nonzero = warp.ballot([&](int lane) {
      const int64_t g = g0 + lane;
      return g < total && w.cell_count[cell_of(g)] != 0;
    });
    warp.for_lanes([&](int lane) {
      if (!((nonzero >> lane) & 1u)) return;
      const int64_t g = g0 + lane;
      Quota q;
      q.expert = w.inst_expert[g];
      q.dst = w.inst_rank[g];
      q.count = w.cell_count[cell_of(g)];
      quotas[at + popc32(nonzero & ((uint32_t{1} << lane) - 1))] = q;
    });
    at += popc32(nonzero);
  }
}

// --- Kernel 7: per rank r (the slot table of emit()) ------------------------------------------

COBALT_HD inline void topo_slots_rank(const TopoShape& s, const TopoWork& w, int r, int32_t* slots,
                                      int64_t* rank_loads) {
  int32_t* row = slots + static_cast<int64_t>(r) * s.slots;
  const int mains = topo_num_mains(r, s);
  const int32_t e0 = topo_first_main(r, s);
  int fill = 0;
  for (int j = 0; j < mains; ++j) row[fill++] = e0 + j;
  const int used = w.slot_used[r];
  for (int j = mains; j < used; ++j) {
    const int32_t e = w.slot_expert[static_cast<int64_t>(r) * s.slots + j];
    if (e < 0) continue;
    int i = fill++;
    while (i > mains && row[i - 1] > e) {
      row[i] = row[i - 1];
      --i;
    }
    row[i] = e;
  }
  for (int j = fill; j < s.slots; ++j) row[j] = -1;
  rank_loads[r] = w.rank_loads[r];
}

}  // namespace cobalt::cuda::detail
