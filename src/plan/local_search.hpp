// Internal to src/plan/: the global heuristic's spare-slot filling and local search.
#pragma once

#include <vector>

#include "cobalt/plan/node_plan.hpp"
#include "plan_state.hpp"

namespace cobalt::plan::detail {

// Facts about the co-activation the candidate bounds below need, computed once per plan call.
struct GainScale {
  std::vector<double> row_max;  // [E] max_{j != e} c_ej: what one presence change adds to a gain
  double slack = 0;             // rounding allowance of a bound test: 1e-9 x (1 + the largest gain)

  explicit GainScale(const GlobalPlanInput& in) : row_max(in.num_experts, 0.0) {
    const int num_experts = in.num_experts;
    double largest_gain = 0;
    // (The co-activation is symmetric, validated: row e's sum is also what G_e. can reach.)
    for (int e = 0; e < num_experts; ++e) {
      double row_sum = 0;
      for (int j = 0; j < num_experts; ++j) {
        if (j == e) continue;
        const double c = in.coactivation[static_cast<size_t>(e) * num_experts + j];
        row_max[e] = std::max(row_max[e], c);
        row_sum += c;
      }
      double source = 0;
      for (int n = 0; n < in.topology.num_nodes() && !in.source_demand.empty(); ++n) {
        source = std::max(
            source, in.source_weight * in.source_demand[static_cast<size_t>(n) * num_experts + e]);
      }
      largest_gain = std::max(largest_gain, row_sum + source);
    }
    slack = 1e-9 * (1.0 + largest_gain);
  }
};

// Fills spare slots: first with replicas that add co-activation (largest gain first), then with
// extra replicas of the experts with the largest per-replica load (they help stage 2 balance).
void fill_spare_slots(PlanState& s);

// One pass of local search; returns true when something improved. With `scale`, candidate scans
// that provably cannot beat the best move found so far are skipped (CandidateBounds in
// local_search.cpp): the moves made, and so the result, are those of the plain scan (scale ==
// nullptr).
bool local_search_pass(PlanState& s, const GainScale* scale);

}  // namespace cobalt::plan::detail
