#include "cobalt/plan/replica_routing.hpp"

#include <algorithm>

#include "cobalt/core/error.hpp"

namespace cobalt::plan {
namespace {

// The candidate ranks of (source rank, expert) under `scope`, ascending.
std::span<const RankId> candidates(const ExpertLayout& layout, ReplicaScope scope, RankId src,
                                   ExpertId e, RankId* self) {
  switch (scope) {
    case ReplicaScope::kAllReplicas:
      break;
    case ReplicaScope::kSameNodeFirst: {
      auto local = layout.ranks_of(e, layout.topology().node_of(src));
      if (!local.empty()) return local;
      break;
    }
    case ReplicaScope::kSourceRankFirst:
      if (layout.holds(src, e)) {
        *self = src;
        return std::span<const RankId>(self, 1);
      }
      break;
  }
  return layout.ranks_of(e);
}

void check_shapes(const ExpertLayout& layout, size_t demand_size, const char* what) {
  const size_t expected = static_cast<size_t>(layout.num_ranks()) * layout.num_experts();
  COBALT_CHECK_ARG(demand_size == expected, "{}: demand has {} entries, expected G x E = {} x {}",
                   what, demand_size, layout.num_ranks(), layout.num_experts());
}

}  // namespace

std::vector<int64_t> count_demand(const RoutingBatch& batch) {
  const int num_experts = batch.num_experts();
  std::vector<int64_t> counts(static_cast<size_t>(batch.num_ranks()) * num_experts, 0);
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    int64_t* row = counts.data() + static_cast<size_t>(batch.source_of(t)) * num_experts;
    for (ExpertId e : batch.experts_of(t)) ++row[e];
  }
  return counts;
}

void route_tokens(const RoutingBatch& batch, const ExpertLayout& layout, ReplicaScope scope,
                  std::span<RankId> exec_rank) {
  COBALT_CHECK_ARG(
      batch.num_experts() == layout.num_experts() && batch.num_ranks() == layout.num_ranks(),
      "route_tokens: batch has E={} G={}, layout E={} G={}", batch.num_experts(), batch.num_ranks(),
      layout.num_experts(), layout.num_ranks());
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "route_tokens: exec_rank has {} entries, batch has {} tasks", exec_rank.size(),
                   batch.num_tasks());
  const int num_experts = batch.num_experts(), num_ranks = batch.num_ranks();
  const TokenIdx num_tokens = batch.num_tokens();
  const int top_k = batch.top_k();
  // Per (s, e), set at its first task: its candidates and the one its next task takes, which
  // starts at s mod L and advances by one per task, wrapping: the c-th task takes (c + s) mod L
  // without a division per task.
  struct Route {
    const RankId* candidates = nullptr;
    int32_t num_candidates = 0;
    int32_t next = 0;
  };
  // Writes task (t, k)'s rank; `self` holds the candidate list of one under kSourceRankFirst.
  auto route_task = [&](Route& route, TokenIdx t, int k, RankId src, RankId* self) {
    const ExpertId e = batch.experts_of(t)[k];
    if (route.candidates == nullptr) {
      const auto cand = candidates(layout, scope, src, e, self);
      route.candidates = cand.data();
      route.num_candidates = static_cast<int32_t>(cand.size());
      route.next = src % route.num_candidates;
    }
    exec_rank[static_cast<size_t>(t) * top_k + k] = route.candidates[route.next];
    if (++route.next == route.num_candidates) route.next = 0;
  };
  const auto table_entries = static_cast<int64_t>(num_ranks) * num_experts;
  if (table_entries <= batch.num_tasks()) {
    // A [G, E] table costs no more than a pass over the tasks: index it by (s, e) directly.
    std::vector<Route> routes(static_cast<size_t>(table_entries));
    std::vector<RankId> rank_ids(num_ranks);  // s's own span under kSourceRankFirst
    for (RankId r = 0; r < num_ranks; ++r) rank_ids[r] = r;
    for (TokenIdx t = 0; t < num_tokens; ++t) {
      const RankId src = batch.source_of(t);
      Route* src_routes = routes.data() + static_cast<size_t>(src) * num_experts;
      auto row = batch.experts_of(t);
      for (int k = 0; k < top_k; ++k) route_task(src_routes[row[k]], t, k, src, &rank_ids[src]);
    }
    return;
  }
  // Few tasks for a [G, E] table (1 GB at E = G = 8192): tokens grouped by source rank, in token
  // order within each (a counting sort), so one source's routes live in an [E] table reset after
  // it: O(T K + G + E) time and memory.
  std::vector<int64_t> source_offsets(static_cast<size_t>(num_ranks) + 1, 0);
  for (TokenIdx t = 0; t < num_tokens; ++t) ++source_offsets[batch.source_of(t) + 1];
  for (RankId r = 0; r < num_ranks; ++r) source_offsets[r + 1] += source_offsets[r];
  std::vector<TokenIdx> tokens_by_source(static_cast<size_t>(num_tokens));
  {
    std::vector<int64_t> cursor(source_offsets.begin(), source_offsets.end() - 1);
    for (TokenIdx t = 0; t < num_tokens; ++t) tokens_by_source[cursor[batch.source_of(t)]++] = t;
  }
  std::vector<Route> routes(num_experts);
  std::vector<ExpertId> touched;  // experts whose route the current source set
  for (RankId src = 0; src < num_ranks; ++src) {
    RankId self = src;
    for (int64_t i = source_offsets[src]; i < source_offsets[src + 1]; ++i) {
      const TokenIdx t = tokens_by_source[i];
      auto row = batch.experts_of(t);
      for (int k = 0; k < top_k; ++k) {
        Route& route = routes[row[k]];
        if (route.candidates == nullptr) touched.push_back(row[k]);
        route_task(route, t, k, src, &self);
      }
    }
    for (ExpertId e : touched) routes[e] = Route{};
    touched.clear();
  }
}

void route_counts(std::span<const int64_t> counts, const ExpertLayout& layout, ReplicaScope scope,
                  std::span<int64_t> rank_loads) {
  check_shapes(layout, counts.size(), "route_counts");
  const int num_ranks = layout.num_ranks(), num_experts = layout.num_experts();
  COBALT_CHECK_ARG(static_cast<int>(rank_loads.size()) == num_ranks,
                   "route_counts: rank_loads has {} entries, expected G = {}", rank_loads.size(),
                   num_ranks);
  std::fill(rank_loads.begin(), rank_loads.end(), 0);
  for (RankId src = 0; src < num_ranks; ++src) {
    for (ExpertId e = 0; e < num_experts; ++e) {
      const int64_t n = counts[static_cast<size_t>(src) * num_experts + e];
      COBALT_CHECK_ARG(n >= 0, "route_counts: counts[{}][{}] = {} is negative", src, e, n);
      if (n == 0) continue;
      RankId self = src;
      auto cand = candidates(layout, scope, src, e, &self);
      const int64_t num_cand = static_cast<int64_t>(cand.size());
      const int64_t base = n / num_cand, extra = n % num_cand;
      for (int64_t j = 0; j < num_cand; ++j) {
        const int64_t shifted = ((j - src) % num_cand + num_cand) % num_cand;
        rank_loads[cand[j]] += base + (shifted < extra ? 1 : 0);
      }
    }
  }
}

std::vector<double> expected_flows(std::span<const double> demand, const ExpertLayout& layout,
                                   ReplicaScope scope) {
  check_shapes(layout, demand.size(), "expected_flows");
  const int num_ranks = layout.num_ranks(), num_experts = layout.num_experts();
  std::vector<double> flows(static_cast<size_t>(num_ranks) * num_ranks, 0.0);
  for (RankId src = 0; src < num_ranks; ++src) {
    double* out = flows.data() + static_cast<size_t>(src) * num_ranks;
    for (ExpertId e = 0; e < num_experts; ++e) {
      const double d = demand[static_cast<size_t>(src) * num_experts + e];
      if (d == 0) continue;
      RankId self = src;
      auto cand = candidates(layout, scope, src, e, &self);
      const double share = d / static_cast<double>(cand.size());
      for (RankId r : cand) out[r] += share;
    }
  }
  return flows;
}

std::vector<double> expected_rank_loads(std::span<const double> demand, const ExpertLayout& layout,
                                        ReplicaScope scope) {
  const int num_ranks = layout.num_ranks();
  const auto flows = expected_flows(demand, layout, scope);
  std::vector<double> loads(num_ranks, 0.0);
  for (RankId src = 0; src < num_ranks; ++src) {
    for (RankId dst = 0; dst < num_ranks; ++dst) {
      loads[dst] += flows[static_cast<size_t>(src) * num_ranks + dst];
    }
  }
  return loads;
}

std::vector<double> expert_loads_of(std::span<const double> demand, int num_experts) {
  COBALT_CHECK_ARG(num_experts >= 1 && demand.size() % num_experts == 0,
                   "expert_loads_of: demand size {} is not a multiple of E = {}", demand.size(),
                   num_experts);
  std::vector<double> loads(num_experts, 0.0);
  for (size_t i = 0; i < demand.size(); ++i) loads[i % num_experts] += demand[i];
  return loads;
}

}  // namespace cobalt::plan
