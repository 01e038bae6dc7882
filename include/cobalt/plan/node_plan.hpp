// Node-level view of Cobalt's stage-1 problem (the paper's Eq. (3) objective in DESIGN.md §4's
// node-level form: a relaxation of the paper's per-rank load cap, docs/planner.md):
//
//   maximise   sum_n sum_{i<j} c_ij [i and j both have a replica on node n]
//   subject to every expert has >= 1 replica; at most M replicas of an expert per node (no rank
//   holds two);
//              node n holds at most M * S replicas (S slots on each of its M ranks);
//              the expected load w_e of each expert splits over the nodes holding it (u_en >= 0,
//              sum_n u_en = w_e, u_en = 0 where e is absent) with node load sum_e u_en <= M (1 +
//              eps) W / G and no replica carrying more than one rank's cap (u_en <= x_en (1 + eps)
//              W / G).
//
// Ranks are chosen afterwards by packing each node's replicas (stage 2 / rank packing).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cobalt/core/topology.hpp"

namespace cobalt::plan {

// Inputs of a stage-1 planning call. Views must outlive the call.
// The largest load tolerance eps: above G - 1 (< kMaxRanks) the rank cap (1 + eps) W / G binds
// nothing, and a huge eps made the cap overflow in the middle of a run.
inline constexpr double kMaxEps = 1e6;

struct GlobalPlanInput {
  Topology topology;
  int num_experts = 0;
  int slots_per_rank = 0;
  double eps = 0.15;  // load tolerance: rank cap (1 + eps) * W / G, eps in [0, kMaxEps]
  std::span<const double> expert_load;   // w_e [E] (EMA task counts)
  std::span<const double> coactivation;  // c_ij [E, E] symmetric (EMA tokens choosing both);
                                         // the diagonal is ignored
  // Optional source anchoring (cobalt+, not in the paper): d_ne [N, E] = tokens from node n's ranks
  // choosing e. Each node is treated as a pseudo-expert fixed on itself, co-activated with e d_ne
  // times, so the objective gains source_weight * d_ne for every (e, n) with e on n. Empty => Eq.
  // (3) exactly.
  std::span<const double> source_demand;
  double source_weight = 0.0;

  // Throws cobalt::Error when sizes disagree, E is outside [1, kMaxExperts], slots_per_rank
  // outside [1, E] or eps outside [0, kMaxEps], a load, co-activation, source demand or the source
  // weight is negative or not finite, the rank cap (1 + eps) W / G, the co-activation (above the
  // diagonal) or the weighted source demand overflow, the co-activation is not symmetric, or the
  // budget cannot hold E experts.
  void validate() const;
  double total_load() const;
  double rank_load_cap() const;  // (1 + eps) * W / G
};

// A node-level plan: replica counts and expected load per (expert, node).
struct NodePlan {
  int num_experts = 0;
  int num_nodes = 0;
  std::vector<int> replicas;       // x_en [E, N]
  std::vector<double> load_share;  // u_en [E, N]

  NodePlan() = default;
  NodePlan(int num_experts, int num_nodes)
      : num_experts(num_experts),
        num_nodes(num_nodes),
        replicas(static_cast<size_t>(num_experts) * num_nodes, 0),
        load_share(static_cast<size_t>(num_experts) * num_nodes, 0.0) {}
  int& x(int e, int n) { return replicas[static_cast<size_t>(e) * num_nodes + n]; }
  int x(int e, int n) const { return replicas[static_cast<size_t>(e) * num_nodes + n]; }
  double& u(int e, int n) { return load_share[static_cast<size_t>(e) * num_nodes + n]; }
  double u(int e, int n) const { return load_share[static_cast<size_t>(e) * num_nodes + n]; }
};

// Eq. (3) objective of a plan: sum over nodes of c_ij for pairs i < j both present on the node
// (plus source_weight * d_ne for each present (e, n) when source_demand is given).
// Throws kInvalidArgument naming `context` when the plan is not E x N for the input (its counts or
// the sizes of its vectors). coactivation_objective, pack_ranks and the heuristic's initial plan
// check this; check_node_plan reports it as its first violation.
void require_plan_shape(const GlobalPlanInput& input, const NodePlan& plan,
                        std::string_view context);

double coactivation_objective(const GlobalPlanInput& input, const NodePlan& plan);

// Empty string when `plan` satisfies every constraint above (loads within a relative tolerance of
// 1e-6); otherwise a one-line description of the first violation.
std::string check_node_plan(const GlobalPlanInput& input, const NodePlan& plan);

}  // namespace cobalt::plan
