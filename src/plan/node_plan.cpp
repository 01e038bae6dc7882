#include "cobalt/plan/node_plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cobalt/core/error.hpp"

namespace cobalt::plan {

void GlobalPlanInput::validate() const {
  COBALT_CHECK_ARG(num_experts >= 1 && num_experts <= kMaxExperts,
                   "global plan: number of experts {} out of range [1, {}]", num_experts,
                   kMaxExperts);
  COBALT_CHECK_ARG(expert_load.size() == static_cast<size_t>(num_experts),
                   "global plan: {} expert loads for {} experts", expert_load.size(), num_experts);
  COBALT_CHECK_ARG(coactivation.size() == static_cast<size_t>(num_experts) * num_experts,
                   "global plan: co-activation has {} entries, need E*E = {}", coactivation.size(),
                   static_cast<size_t>(num_experts) * num_experts);
  COBALT_CHECK_ARG(eps >= 0 && eps <= kMaxEps, "global plan: eps {} out of range [0, {}]", eps,
                   kMaxEps);
  // At most E: a rank never holds an expert twice (also keeps node capacities N_r S in range).
  COBALT_CHECK_ARG(slots_per_rank >= 1 && slots_per_rank <= num_experts,
                   "global plan: slots per rank {} out of range [1, {}] (a rank never holds an "
                   "expert twice)",
                   slots_per_rank, num_experts);
  COBALT_CHECK(static_cast<int64_t>(slots_per_rank) * topology.num_ranks() >= num_experts,
               kFailedPrecondition,
               "replica budget too small: {} slots x {} ranks cannot hold {} experts",
               slots_per_rank, topology.num_ranks(), num_experts);
  COBALT_CHECK_ARG(
      source_demand.empty() ||
          source_demand.size() == static_cast<size_t>(topology.num_nodes()) * num_experts,
      "global plan: source demand has {} entries, need N*E = {}", source_demand.size(),
      static_cast<size_t>(topology.num_nodes()) * num_experts);
  for (int e = 0; e < num_experts; ++e) {
    COBALT_CHECK_ARG(expert_load[e] >= 0 && std::isfinite(expert_load[e]),
                     "global plan: expert {} has load {} (must be finite and >= 0)", e,
                     expert_load[e]);
  }
  // Co-activation and source demand are token counts: the planners rely on them being >= 0.
  for (size_t i = 0; i < coactivation.size(); ++i) {
    COBALT_CHECK_ARG(coactivation[i] >= 0 && std::isfinite(coactivation[i]),
                     "global plan: co-activation of experts {} and {} is {} (must be finite and "
                     ">= 0)",
                     i / num_experts, i % num_experts, coactivation[i]);
  }
  // Symmetric, as counted (the planners read either triangle, and METIS needs every edge both
  // ways: an asymmetric graph corrupted its heap).
  for (int i = 0; i < num_experts; ++i) {
    for (int j = i + 1; j < num_experts; ++j) {
      const double upper = coactivation[static_cast<size_t>(i) * num_experts + j];
      const double lower = coactivation[static_cast<size_t>(j) * num_experts + i];
      COBALT_CHECK_ARG(upper == lower,
                       "global plan: co-activation must be symmetric: c[{}][{}] = {} but "
                       "c[{}][{}] = {}",
                       i, j, upper, j, i, lower);
    }
  }
  COBALT_CHECK_ARG(source_weight >= 0 && std::isfinite(source_weight),
                   "global plan: source weight {} must be finite and >= 0", source_weight);
  for (size_t i = 0; i < source_demand.size(); ++i) {
    COBALT_CHECK_ARG(source_demand[i] >= 0 && std::isfinite(source_demand[i]),
                     "global plan: source demand of node {} for expert {} is {} (must be finite "
                     "and >= 0)",
                     i / num_experts, i % num_experts, source_demand[i]);
  }
  // Finite entries can still sum to infinity (1e308 each): the rank cap or the objective would be
  // inf or nan, and every plan would pass the cap. Refused rather than planned on.
  COBALT_CHECK_ARG(std::isfinite(rank_load_cap()),
                   "global plan: the rank cap (1 + eps) x (sum of expert loads) / G = (1 + {}) x "
                   "{} / {} overflows; it must be finite (lower eps or scale the loads down)",
                   eps, total_load(), topology.num_ranks());
  // The objective counts c_ij once per node holding both, plus the weighted demand.
  double coactivation_sum = 0;
  for (int i = 0; i < num_experts; ++i) {
    for (int j = i + 1; j < num_experts; ++j)
      coactivation_sum += coactivation[static_cast<size_t>(i) * num_experts + j];
  }
  const double demand_sum =
      source_weight > 0 ? std::accumulate(source_demand.begin(), source_demand.end(), 0.0) : 0.0;
  const double objective_bound =
      topology.num_nodes() * coactivation_sum + source_weight * demand_sum;
  COBALT_CHECK_ARG(std::isfinite(objective_bound),
                   "global plan: the co-activation counts (sum {}) and the source demand (sum {}, "
                   "weight {}) could make the objective {}; it must be finite (scale them down)",
                   coactivation_sum, demand_sum, source_weight, objective_bound);
}

double GlobalPlanInput::total_load() const {
  return std::accumulate(expert_load.begin(), expert_load.end(), 0.0);
}

double GlobalPlanInput::rank_load_cap() const {
  return (1.0 + eps) * total_load() / topology.num_ranks();
}

namespace {

// Empty when the plan is E x N for the input, else what differs.
std::string plan_shape_mismatch(const GlobalPlanInput& input, const NodePlan& plan) {
  const int num_nodes = input.topology.num_nodes();
  const size_t cells = static_cast<size_t>(std::max(0, input.num_experts)) * num_nodes;
  if (plan.num_experts != input.num_experts || plan.num_nodes != num_nodes ||
      plan.replicas.size() != cells || plan.load_share.size() != cells) {
    return fmt::format(
        "plan shape {}x{} ({} replica counts, {} load shares) does not match E={} N={} ({} each)",
        plan.num_experts, plan.num_nodes, plan.replicas.size(), plan.load_share.size(),
        input.num_experts, num_nodes, cells);
  }
  return {};
}

}  // namespace

void require_plan_shape(const GlobalPlanInput& input, const NodePlan& plan,
                        std::string_view context) {
  const std::string mismatch = plan_shape_mismatch(input, plan);
  COBALT_CHECK_ARG(mismatch.empty(), "{}: {}", context, mismatch);
}

double coactivation_objective(const GlobalPlanInput& input, const NodePlan& plan) {
  require_plan_shape(input, plan, "coactivation objective");
  const int num_experts = input.num_experts;
  double total = 0;
  std::vector<int> present;
  for (int n = 0; n < plan.num_nodes; ++n) {
    present.clear();
    for (int e = 0; e < num_experts; ++e) {
      if (plan.x(e, n) > 0) present.push_back(e);
    }
    if (!input.source_demand.empty()) {
      for (int e : present)
        total +=
            input.source_weight * input.source_demand[static_cast<size_t>(n) * num_experts + e];
    }
    for (size_t a = 0; a < present.size(); ++a) {
      const double* row = input.coactivation.data() + static_cast<size_t>(present[a]) * num_experts;
      for (size_t b = a + 1; b < present.size(); ++b) total += row[present[b]];
    }
  }
  return total;
}

std::string check_node_plan(const GlobalPlanInput& input, const NodePlan& plan) {
  const int num_nodes = input.topology.num_nodes();
  const int per_node = input.topology.ranks_per_node();
  if (std::string mismatch = plan_shape_mismatch(input, plan); !mismatch.empty()) {
    return mismatch;
  }
  const double cap = input.rank_load_cap();
  const double tol = 1e-6 * std::max(1.0, cap);
  std::vector<double> node_load(num_nodes, 0.0);
  std::vector<int> node_replicas(num_nodes, 0);
  for (int e = 0; e < input.num_experts; ++e) {
    int total_replicas = 0;
    double share_sum = 0;
    for (int n = 0; n < num_nodes; ++n) {
      const int x = plan.x(e, n);
      const double u = plan.u(e, n);
      if (x < 0 || x > per_node) {
        return fmt::format("expert {} has {} replicas on node {} (valid range [0, {}])", e, x, n,
                           per_node);
      }
      if (u < -tol) return fmt::format("expert {} has negative load {} on node {}", e, u, n);
      if (x == 0 && u > tol)
        return fmt::format("expert {} has load {} on node {} without a replica", e, u, n);
      if (u > x * cap + tol) {
        return fmt::format("expert {} load {} on node {} exceeds {} replicas x rank cap {}", e, u,
                           n, x, cap);
      }
      total_replicas += x;
      share_sum += u;
      node_load[n] += u;
      node_replicas[n] += x;
    }
    if (total_replicas < 1) return fmt::format("expert {} has no replica", e);
    if (std::abs(share_sum - input.expert_load[e]) > tol) {
      return fmt::format("expert {} load shares sum to {} but its load is {}", e, share_sum,
                         input.expert_load[e]);
    }
  }
  for (int n = 0; n < num_nodes; ++n) {
    if (node_replicas[n] > per_node * input.slots_per_rank) {
      return fmt::format("node {} holds {} replicas but has {} slots", n, node_replicas[n],
                         per_node * input.slots_per_rank);
    }
    if (node_load[n] > per_node * cap + tol) {
      return fmt::format("node {} load {} exceeds {} ranks x cap {}", n, node_load[n], per_node,
                         cap);
    }
  }
  return {};
}

}  // namespace cobalt::plan
