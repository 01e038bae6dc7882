// node_plan_of and pack_ranks (cobalt/plan/global_planner.hpp): between node plans and layouts.
#include <algorithm>
#include <numeric>

#include "cobalt/core/error.hpp"
#include "cobalt/core/value_checks.hpp"
#include "cobalt/plan/global_planner.hpp"
#include "cobalt/plan/rank_matching.hpp"

namespace cobalt::plan {

NodePlan node_plan_of(const ExpertLayout& layout, std::span<const double> expert_load) {
  COBALT_CHECK_ARG(
      expert_load.empty() || expert_load.size() == static_cast<size_t>(layout.num_experts()),
      "node plan of a layout: {} expert loads for E = {} (give E, or none)", expert_load.size(),
      layout.num_experts());
  check_finite_non_negative(expert_load, "node plan of a layout: expert load");
  NodePlan plan(layout.num_experts(), layout.num_nodes());
  for (ExpertId e = 0; e < layout.num_experts(); ++e) {
    const double per_replica =
        expert_load.empty() ? 0.0 : expert_load[e] / layout.num_replicas_of(e);
    for (NodeId n = 0; n < layout.num_nodes(); ++n) {
      plan.x(e, n) = static_cast<int>(layout.ranks_of(e, n).size());
      plan.u(e, n) = plan.x(e, n) * per_replica;
    }
  }
  return plan;
}

ExpertLayout pack_ranks(const GlobalPlanInput& input, const NodePlan& plan,
                        const ExpertLayout* previous, std::vector<double>* slot_loads) {
  const Topology& topo = input.topology;
  const int per_node = topo.ranks_per_node(), slots = input.slots_per_rank;
  require_plan_shape(input, plan, "pack");
  COBALT_CHECK_ARG(previous == nullptr || (previous->topology() == topo &&
                                           previous->num_experts() == input.num_experts),
                   "pack: the previous layout is for {} and E={}, the plan for {} and E={}",
                   previous ? previous->topology().to_string() : "",
                   previous ? previous->num_experts() : 0, topo.to_string(), input.num_experts);
  std::vector<std::vector<ExpertId>> lists(topo.num_ranks());
  std::vector<std::vector<double>> list_loads(topo.num_ranks());
  struct Replica {
    ExpertId expert;
    double load;
  };
  for (NodeId n = 0; n < topo.num_nodes(); ++n) {
    std::vector<Replica> replicas;
    for (ExpertId e = 0; e < input.num_experts; ++e) {
      const int x = plan.x(e, n);
      COBALT_CHECK_ARG(
          x >= 0 && x <= per_node,
          "pack: the plan puts {} replicas of expert {} on node {}, which has {} ranks "
          "(range [0, {}]; was the plan made for another input?)",
          x, e, n, per_node, per_node);
      for (int i = 0; i < x; ++i) replicas.push_back({e, plan.u(e, n) / x});
    }
    COBALT_CHECK_ARG(static_cast<int>(replicas.size()) <= per_node * slots,
                     "pack: the plan puts {} replicas on node {}, which has {} slots ({} ranks x "
                     "{}; was the plan made for another input?)",
                     replicas.size(), n, per_node * slots, per_node, slots);
    std::stable_sort(replicas.begin(), replicas.end(),
                     [](const Replica& a, const Replica& b) { return a.load > b.load; });
    const RankId first = topo.first_rank_of(n);
    std::vector<double> load(per_node, 0.0);
    std::vector<std::vector<ExpertId>> node_lists(per_node);
    std::vector<std::vector<double>> node_loads(per_node);
    bool ok = true;
    for (const Replica& rep : replicas) {
      int best = -1;
      for (int i = 0; i < per_node; ++i) {
        auto& l = node_lists[i];
        if (static_cast<int>(l.size()) >= slots ||
            std::find(l.begin(), l.end(), rep.expert) != l.end()) {
          continue;
        }
        const bool stays = previous && previous->holds(first + i, rep.expert);
        const bool best_stays = best >= 0 && previous && previous->holds(first + best, rep.expert);
        if (best < 0 || load[i] < load[best] - 1e-9 ||
            (load[i] <= load[best] + 1e-9 && stays && !best_stays)) {
          best = i;
        }
      }
      if (best < 0) {
        ok = false;
        break;
      }
      node_lists[best].push_back(rep.expert);
      node_loads[best].push_back(rep.load);
      load[best] += rep.load;
    }
    if (!ok) {
      // Round-robin over replicas grouped by expert: copies of one expert (<= M) land on distinct
      // ranks and every rank receives at most ceil(total / M) <= S replicas.
      std::stable_sort(replicas.begin(), replicas.end(),
                       [](const Replica& a, const Replica& b) { return a.expert < b.expert; });
      for (auto& l : node_lists) l.clear();
      for (auto& l : node_loads) l.clear();
      for (size_t i = 0; i < replicas.size(); ++i) {
        node_lists[i % per_node].push_back(replicas[i].expert);
        node_loads[i % per_node].push_back(replicas[i].load);
      }
    }
    // The node's ranks are interchangeable: put each packed group on the rank that keeps the most
    // of its replicas where they are.
    std::vector<int> group2rank(per_node);
    std::iota(group2rank.begin(), group2rank.end(), 0);
    if (previous) group2rank = keep_replicas_in_place(*previous, n, node_lists);
    for (int g = 0; g < per_node; ++g) {
      lists[first + group2rank[g]] = std::move(node_lists[g]);
      list_loads[first + group2rank[g]] = std::move(node_loads[g]);
    }
  }
  ExpertLayout layout = ExpertLayout::from_rank_lists(topo, input.num_experts, slots, lists);
  if (slot_loads) {
    slot_loads->assign(static_cast<size_t>(topo.num_ranks()) * slots, 0.0);
    for (RankId r = 0; r < topo.num_ranks(); ++r) {
      for (size_t i = 0; i < list_loads[r].size(); ++i)
        (*slot_loads)[static_cast<size_t>(r) * slots + i] = list_loads[r][i];
    }
  }
  return layout;
}

}  // namespace cobalt::plan
