#include "cobalt/plan/smartmoe_planner.hpp"

#include <algorithm>
#include <numeric>
#include <optional>

#include "cobalt/core/error.hpp"
#include "cobalt/plan/replica_routing.hpp"

namespace cobalt::plan {
namespace {

double max_of(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

}  // namespace

int smartmoe_max_full_replicas(int num_experts, int num_ranks, int slots_per_rank) {
  if (num_ranks <= 1) return 0;
  for (int f = std::min(slots_per_rank, num_experts - 1); f > 0; --f) {
    if (num_experts - f <= static_cast<int64_t>(num_ranks) * (slots_per_rank - f)) return f;
  }
  return 0;
}

SmartMoePlacement smartmoe_greedy_placement(const ExpertLayout& current,
                                            std::span<const double> demand, int num_full) {
  const int num_experts = current.num_experts(), num_ranks = current.num_ranks();
  const int slots = current.slots_per_rank();
  COBALT_CHECK_ARG(
      static_cast<int64_t>(demand.size()) == static_cast<int64_t>(num_ranks) * num_experts,
      "smartmoe: demand has {} entries, expected G x E = {} x {}", demand.size(), num_ranks,
      num_experts);
  const int max_full = smartmoe_max_full_replicas(num_experts, num_ranks, slots);
  COBALT_CHECK_ARG(num_full >= 0 && num_full <= max_full,
                   "smartmoe: {} fully replicated experts out of range [0, {}]", num_full,
                   max_full);
  const auto load = expert_loads_of(demand, num_experts);
  std::vector<ExpertId> order(num_experts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](ExpertId a, ExpertId b) { return load[a] > load[b]; });

  std::vector<std::vector<ExpertId>> lists(num_ranks);
  std::vector<double> rank_load(num_ranks, 0.0);
  for (int i = 0; i < num_full; ++i) {
    const ExpertId e = order[i];
    for (RankId r = 0; r < num_ranks; ++r) {
      lists[r].push_back(e);
      rank_load[r] += demand[static_cast<size_t>(r) * num_experts + e];
    }
  }
  // Single replicas per rank: as even as SmartMoE keeps them (mapping.py places an expert on a
  // worker only while it holds fewer than num_expert, i.e. E / G each), not up to the slots left.
  const int cap = (num_experts - num_full + num_ranks - 1) / num_ranks;
  std::vector<int> num_singles(num_ranks, 0);
  for (int i = num_full; i < num_experts; ++i) {
    const ExpertId e = order[i];
    RankId best = -1;
    for (RankId r = 0; r < num_ranks; ++r) {
      if (num_singles[r] < cap && (best < 0 || rank_load[r] < rank_load[best])) best = r;
    }
    COBALT_CHECK_INTERNAL(best >= 0, "smartmoe: no free slot for expert {}", e);
    for (RankId r : current.ranks_of(e)) {
      if (num_singles[r] < cap && rank_load[r] == rank_load[best]) {
        best = r;  // stay where it is
        break;
      }
    }
    lists[best].push_back(e);
    ++num_singles[best];
    rank_load[best] += load[e];
  }
  SmartMoePlacement out{
      ExpertLayout::from_rank_lists(current.topology(), num_experts, slots, lists), num_full, 0};
  out.max_rank_load =
      max_of(expected_rank_loads(demand, out.layout, ReplicaScope::kSourceRankFirst));
  return out;
}

SmartMoePlan plan_smartmoe(const ExpertLayout& current, std::span<const double> demand) {
  const int max_full = smartmoe_max_full_replicas(current.num_experts(), current.num_ranks(),
                                                  current.slots_per_rank());
  std::optional<SmartMoePlacement> best;
  for (int f = 0; f <= max_full; ++f) {
    auto candidate = smartmoe_greedy_placement(current, demand, f);
    if (!best || candidate.max_rank_load < best->max_rank_load) best = std::move(candidate);
  }
  const double current_max =
      max_of(expected_rank_loads(demand, current, ReplicaScope::kSourceRankFirst));
  if (current_max > best->max_rank_load) {
    return SmartMoePlan{std::move(*best), true, current_max};
  }
  // Keep the current layout; report its own numbers.
  int full = 0;
  for (ExpertId e = 0; e < current.num_experts(); ++e) {
    if (current.num_replicas_of(e) == current.num_ranks() && current.num_ranks() > 1) ++full;
  }
  return SmartMoePlan{SmartMoePlacement{current, full, current_max}, false, current_max};
}

}  // namespace cobalt::plan
