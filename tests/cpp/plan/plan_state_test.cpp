// The global heuristic's incremental node-level state (src/plan/plan_state.hpp) against
// recomputation from scratch: after every change of a random sequence, its objective, gains, node
// loads, counts and member lists equal their definitions, and its O(1) / O(N) feasibility checks
// agree with applying the change to a copy and recomputing the loads.
#include "plan/plan_state.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cobalt/core/rng.hpp"
#include "cobalt/plan/node_plan.hpp"

namespace cobalt::plan::detail {
namespace {

struct RandomInput {
  std::vector<double> load, coactivation, source_demand;
  GlobalPlanInput input{Topology(1, 1)};
};

RandomInput random_input(SplitMix64& rng) {
  RandomInput r;
  const int num_nodes = 1 + static_cast<int>(rng.below(6));
  const int per_node = 1 + static_cast<int>(rng.below(4));
  const int num_ranks = num_nodes * per_node;
  const int num_experts = 2 + static_cast<int>(rng.below(39));
  const int min_slots = (num_experts + num_ranks - 1) / num_ranks;
  r.input.topology = Topology(num_nodes, num_ranks);
  r.input.num_experts = num_experts;
  r.input.slots_per_rank = std::min(num_experts, min_slots + static_cast<int>(rng.below(3)));
  r.input.eps = 0.3 * rng.unit();
  r.load.resize(num_experts);
  for (double& w : r.load) w = rng.below(5) == 0 ? 0.0 : 1000.0 * rng.unit();
  r.coactivation.assign(static_cast<size_t>(num_experts) * num_experts, 0.0);
  for (int i = 0; i < num_experts; ++i) {
    for (int j = i + 1; j < num_experts; ++j) {
      const double c = rng.below(3) == 0 ? 0.0 : 100.0 * rng.unit();
      r.coactivation[static_cast<size_t>(i) * num_experts + j] = c;
      r.coactivation[static_cast<size_t>(j) * num_experts + i] = c;
    }
  }
  if (rng.below(2) == 0) {  // cobalt+'s source anchoring
    r.source_demand.resize(static_cast<size_t>(num_nodes) * num_experts);
    for (double& d : r.source_demand) d = 50.0 * rng.unit();
    r.input.source_weight = 0.5 + rng.unit();
  }
  r.input.expert_load = r.load;
  r.input.coactivation = r.coactivation;
  r.input.source_demand = r.source_demand;
  r.input.validate();
  return r;
}

// Node loads of the state's counts, from scratch: x_en * w_e / total_e summed over experts.
std::vector<double> loads_of(const PlanState& state) {
  std::vector<double> loads(state.num_nodes(), 0.0);
  for (int e = 0; e < state.num_experts(); ++e) {
    if (state.total(e) == 0) continue;
    for (int n = 0; n < state.num_nodes(); ++n) {
      loads[n] += state.x(e, n) * state.w(e) / state.total(e);
    }
  }
  return loads;
}

void expect_near(double got, double want, double scale, const char* what, int op) {
  EXPECT_NEAR(got, want, 1e-9 * std::max(1.0, scale)) << what << " after change " << op;
}

void expect_matches_definitions(const PlanState& state, const RandomInput& r, int op) {
  const GlobalPlanInput& in = r.input;
  const int num_experts = state.num_experts(), num_nodes = state.num_nodes();
  double scale = 1;
  for (double c : r.coactivation) scale += c;
  for (double d : r.source_demand) scale += in.source_weight * d;
  expect_near(state.objective(), coactivation_objective(in, state.finish()), scale, "objective",
              op);
  const std::vector<double> loads = loads_of(state);
  for (int n = 0; n < num_nodes; ++n) {
    expect_near(state.node_load(n), loads[n], in.total_load(), "node load", op);
    int used = 0;
    std::vector<int> members;
    for (int e = 0; e < num_experts; ++e) {
      used += state.x(e, n);
      if (state.present(e, n)) members.push_back(e);
    }
    EXPECT_EQ(state.node_used(n), used) << "after change " << op;
    std::vector<int> listed = state.members(n);
    std::sort(listed.begin(), listed.end());
    EXPECT_EQ(listed, members) << "node " << n << " after change " << op;
    for (int e = 0; e < num_experts; ++e) {
      double gain =
          r.source_demand.empty()
              ? 0.0
              : in.source_weight * r.source_demand[static_cast<size_t>(n) * num_experts + e];
      for (int j : members) {
        if (j != e) gain += state.c(e, j);
      }
      expect_near(state.gain(e, n), gain, scale, "gain", op);
    }
  }
  for (int e = 0; e < num_experts; ++e) {
    int total = 0;
    for (int n = 0; n < num_nodes; ++n) total += state.x(e, n);
    EXPECT_EQ(state.total(e), total) << "after change " << op;
  }
}

// excess_after_change by its definition: apply the change to a copy and take the largest excess
// over the node cap among the nodes holding e before or after.
double excess_by_copy(const PlanState& state, int e, int n, int delta) {
  if (state.total(e) + delta <= 0) return 1e300;
  PlanState copy = state;
  if (delta > 0)
    copy.add(e, n);
  else
    copy.remove(e, n);
  const std::vector<double> loads = loads_of(copy);
  double worst = -1e300;
  for (int m = 0; m < state.num_nodes(); ++m) {
    if (state.x(e, m) == 0 && copy.x(e, m) == 0) continue;
    worst = std::max(worst, loads[m] - state.node_cap());
  }
  return worst;
}

TEST(PlanState, IncrementalStateEqualsRecomputationAfterRandomChanges) {
  int num_checked_replaces = 0, num_infeasible_replaces = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SplitMix64 rng(seed * 104729);
    const RandomInput r = random_input(rng);
    PlanState state(r.input);
    const int num_experts = state.num_experts(), num_nodes = state.num_nodes();
    for (int op = 0; op < 300; ++op) {
      const int e = static_cast<int>(rng.below(num_experts));
      const int n = static_cast<int>(rng.below(num_nodes));
      // Checks before the change, on the state it is about to change.
      const double tolerance = 1e-9 * std::max(1.0, r.input.total_load());
      for (const int delta : {+1, -1}) {
        if (delta < 0 && state.x(e, n) == 0) continue;
        const double fast = state.excess_after_change(e, n, delta);
        const double slow = excess_by_copy(state, e, n, delta);
        if (slow >= 1e299) {
          EXPECT_GE(fast, 1e299) << "seed " << seed << " change " << op;
        } else {
          EXPECT_NEAR(fast, slow, tolerance) << "seed " << seed << " change " << op;
        }
      }
      if (state.own_excess_after_add(e, n) > 0) {
        EXPECT_GT(state.excess_after_change(e, n, +1), 0) << "seed " << seed << " change " << op;
      }
      const int f = static_cast<int>(rng.below(num_experts));
      if (f != e && state.x(e, n) > 0) {
        // Feasible when e keeps a replica and no node whose load grows passes the cap.
        PlanState copy = state;
        copy.remove(e, n);
        copy.add(f, n);
        const std::vector<double> before = loads_of(state), after = loads_of(copy);
        bool feasible = state.total(e) > 1, borderline = false;
        for (int m = 0; m < num_nodes; ++m) {
          const double grows = after[m] - before[m];
          const double margin = after[m] - (state.node_cap() + kImprovement);
          if (grows > tolerance && margin > tolerance) feasible = false;
          // Too close to call in floating point: a load at the cap, or one that barely moves.
          if ((grows > -tolerance && std::abs(margin) <= tolerance) ||
              (std::abs(grows) <= tolerance && grows != 0 && margin > -tolerance)) {
            borderline = true;
          }
        }
        if (!borderline) {
          EXPECT_EQ(state.replace_feasible(e, n, f), feasible)
              << "seed " << seed << " change " << op;
          ++num_checked_replaces;
          num_infeasible_replaces += !feasible;
        }
      }
      // The change: remove where e is present half of the time, else add where a slot is free.
      if (state.x(e, n) > 0 && rng.below(2) == 0) {
        state.remove(e, n);
      } else if (state.node_used(n) < state.node_slots()) {
        state.add(e, n);
      } else {
        continue;
      }
      expect_matches_definitions(state, r, op);
    }
  }
  EXPECT_GT(num_checked_replaces, 1000);
  EXPECT_GT(num_infeasible_replaces, 100);  // both answers are checked
}

}  // namespace
}  // namespace cobalt::plan::detail
