// The simple reference of TopoEP's per-microbatch solver: the header's three stages transcribed
// with dense matrices (U [E, G], hosted [E, G]) and per-expert quota lists that every refinement
// move updates at once. No scratch reuse, no deferred move replay, no routing tables: what
// TopoEpSolver::solve must reproduce bit for bit (tests/cpp/plan/topoep_solver_test.cpp compares
// them on random instances).
#include <algorithm>
#include <tuple>

#include "cobalt/core/error.hpp"
#include "cobalt/plan/topoep_solver.hpp"

namespace cobalt::plan {
namespace {

struct SourcedQuota {
  RankId src, dst;
  int64_t count;
};

}  // namespace

TopoEpPlan solve_topoep_reference(const TopoEpInput& in) {
  check_topoep_input(in);
  const Topology& topo = in.topology;
  const int G = topo.num_ranks(), E = in.num_experts, N = topo.num_nodes();
  for (RankId s = 0; s < G; ++s) {
    for (ExpertId e = 0; e < E; ++e) {
      if (in.demand[static_cast<size_t>(s) * E + e] < 0) fail_negative_demand(in, s);
    }
  }
  const int per_node = topo.ranks_per_node();
  auto at = [G](ExpertId e, RankId r) { return static_cast<size_t>(e) * G + r; };

  std::vector<uint8_t> hosted(static_cast<size_t>(E) * G, 0);
  std::vector<int64_t> load(static_cast<size_t>(E) * G, 0);  // U
  std::vector<int64_t> rank_loads(G, 0);                     // L
  std::vector<int> slots_used(G, 0);                         // mains + temporary replicas
  std::vector<RankId> main_rank(E);
  TopoEpStats stats;
  for (ExpertId e = 0; e < E; ++e) {
    main_rank[e] = topoep_main_rank(e, E, G);
    hosted[at(e, main_rank[e])] = 1;
    slots_used[main_rank[e]] += 1;
  }

  // (1) Inter-node placement.
  if (N > 1) {
    for (NodeId d = 0; d < N; ++d) {
      std::vector<std::pair<int64_t, ExpertId>> candidates;  // (-D, e): ascending = the order
      for (ExpertId e = 0; e < E; ++e) {
        if (topo.node_of(main_rank[e]) == d) continue;
        int64_t demand = 0;
        for (RankId s = topo.first_rank_of(d); s < topo.first_rank_of(d) + per_node; ++s) {
          demand += in.demand[static_cast<size_t>(s) * E + e];
        }
        if (2.0 * static_cast<double>(demand) * in.token_bytes - in.expert_param_bytes > 0) {
          candidates.emplace_back(-demand, e);
        }
      }
      std::sort(candidates.begin(), candidates.end());
      for (const auto& [negative_demand, e] : candidates) {
        RankId target = -1;
        for (RankId r = topo.first_rank_of(d); r < topo.first_rank_of(d) + per_node; ++r) {
          if (slots_used[r] < in.slots_per_rank &&
              (target < 0 || slots_used[r] < slots_used[target])) {
            target = r;
          }
        }
        if (target < 0) break;
        hosted[at(e, target)] = 1;
        slots_used[target] += 1;
        stats.num_inter_node_replicas += 1;
      }
    }
  }

  // (2) Routing: quotas per expert in creation order (ascending source, then ascending rank).
  std::vector<std::vector<SourcedQuota>> quotas(E);
  for (RankId s = 0; s < G; ++s) {
    const NodeId node = topo.node_of(s);
    for (ExpertId e = 0; e < E; ++e) {
      const int64_t w = in.demand[static_cast<size_t>(s) * E + e];
      if (w == 0) continue;
      std::vector<RankId> chosen;
      for (RankId r = 0; r < G; ++r) {
        if (hosted[at(e, r)] && topo.node_of(r) == node) chosen.push_back(r);
      }
      if (chosen.empty()) {
        for (RankId r = 0; r < G; ++r) {
          if (hosted[at(e, r)]) chosen.push_back(r);
        }
      }
      const int k = static_cast<int>(chosen.size());
      for (int i = 0; i < k; ++i) {
        const int64_t c = w / k + (((i - s) % k + k) % k < w % k ? 1 : 0);
        if (c == 0) continue;
        quotas[e].push_back(SourcedQuota{s, chosen[i], c});
        load[at(e, chosen[i])] += c;
        rank_loads[chosen[i]] += c;
      }
    }
  }

  // (3) Intra-node refinement, moving quotas as each move is decided.
  for (NodeId node = 0; node < N && per_node >= 2; ++node) {
    const RankId first = topo.first_rank_of(node), last = first + per_node;
    while (true) {
      RankId busiest = first;
      for (RankId r = first + 1; r < last; ++r) {
        if (rank_loads[r] > rank_loads[busiest]) busiest = r;
      }
      // (delta desc, target load asc, cost asc, expert asc, target asc) as a minimum of a tuple.
      std::tuple<int64_t, int64_t, int, ExpertId, RankId> best{0, 0, 0, -1, -1};
      for (ExpertId e = 0; e < E; ++e) {
        if (!hosted[at(e, busiest)] || load[at(e, busiest)] <= 0) continue;
        for (RankId t = first; t < last; ++t) {
          const int64_t gap = rank_loads[busiest] - rank_loads[t];
          if (t == busiest || gap < 2) continue;
          if (!hosted[at(e, t)] && slots_used[t] >= in.slots_per_rank) continue;
          const int cost = hosted[at(e, t)] ? 0 : (topo.node_of(main_rank[e]) == node ? 1 : 2);
          const std::tuple<int64_t, int64_t, int, ExpertId, RankId> c{
              -std::min(load[at(e, busiest)], gap / 2), rank_loads[t], cost, e, t};
          if (std::get<3>(best) < 0 || c < best) best = c;
        }
      }
      const auto [negative_delta, target_load, cost, e, to] = best;
      if (e < 0) break;
      const int64_t delta = -negative_delta;
      if (!hosted[at(e, to)]) {
        hosted[at(e, to)] = 1;
        slots_used[to] += 1;
        stats.num_intra_node_replicas += 1;
      }
      load[at(e, to)] += delta;
      load[at(e, busiest)] -= delta;
      rank_loads[to] += delta;
      rank_loads[busiest] -= delta;
      stats.num_refinement_moves += 1;
      // Which tasks move: from the target itself, then the others in creation order, then those
      // of the origin rank itself.
      std::vector<SourcedQuota>& list = quotas[e];
      const size_t num_before = list.size();
      int64_t remaining = delta;
      for (int pass = 0; pass < 3; ++pass) {
        for (size_t i = 0; i < num_before && remaining > 0; ++i) {
          const SourcedQuota q = list[i];
          const bool in_pass = pass == 0   ? q.src == to
                               : pass == 1 ? q.src != to && q.src != busiest
                                           : q.src == busiest;
          if (q.dst != busiest || !in_pass || q.count == 0) continue;
          const int64_t take = std::min(q.count, remaining);
          list[i].count -= take;
          remaining -= take;
          auto same = std::find_if(list.begin(), list.end(), [&](const SourcedQuota& o) {
            return o.src == q.src && o.dst == to;
          });
          if (same != list.end()) {
            same->count += take;
          } else {
            list.push_back(SourcedQuota{q.src, to, take});
          }
        }
      }
      COBALT_CHECK_INTERNAL(remaining == 0, "topoep reference: move of expert {} lost {} tasks", e,
                            remaining);
    }
  }

  // A temporary replica left without tasks is not materialised.
  for (ExpertId e = 0; e < E; ++e) {
    for (RankId r = 0; r < G; ++r) {
      if (hosted[at(e, r)] && r != main_rank[e] && load[at(e, r)] == 0) {
        hosted[at(e, r)] = 0;
        slots_used[r] -= 1;
        stats.num_dropped_replicas += 1;
      }
    }
  }

  TopoEpPlan plan;
  plan.num_ranks = G;
  plan.num_experts = E;
  plan.slots_per_rank = in.slots_per_rank;
  plan.slots.assign(static_cast<size_t>(G) * in.slots_per_rank, kEmptySlot);
  std::vector<int> fill(G, 0);
  for (ExpertId e = 0; e < E; ++e) {
    plan.slots[static_cast<size_t>(main_rank[e]) * in.slots_per_rank + fill[main_rank[e]]++] = e;
  }
  for (ExpertId e = 0; e < E; ++e) {
    for (RankId r = 0; r < G; ++r) {
      if (hosted[at(e, r)] && r != main_rank[e]) {
        plan.slots[static_cast<size_t>(r) * in.slots_per_rank + fill[r]++] = e;
      }
    }
  }
  std::vector<std::vector<TopoEpQuota>> by_source(G);
  for (ExpertId e = 0; e < E; ++e) {
    for (const SourcedQuota& q : quotas[e]) {
      if (q.count > 0) by_source[q.src].push_back(TopoEpQuota{e, q.dst, q.count});
    }
  }
  plan.source_offsets.assign(1, 0);
  for (RankId s = 0; s < G; ++s) {
    std::sort(by_source[s].begin(), by_source[s].end(), [](const auto& a, const auto& b) {
      return std::tie(a.expert, a.dst) < std::tie(b.expert, b.dst);
    });
    plan.quotas.insert(plan.quotas.end(), by_source[s].begin(), by_source[s].end());
    plan.source_offsets.push_back(static_cast<int64_t>(plan.quotas.size()));
  }
  plan.rank_loads = rank_loads;
  plan.stats = stats;
  return plan;
}

}  // namespace cobalt::plan
