#include "cobalt/plan/global_planner.hpp"

#include <metis.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <optional>

#include "cobalt/core/error.hpp"
#include "cobalt/core/parallel.hpp"
#include "cobalt/core/rng.hpp"
#include "local_search.hpp"
#include "plan_state.hpp"

namespace cobalt::plan {
namespace {

using detail::fill_spare_slots;
using detail::GainScale;
using detail::kImprovement;
using detail::local_search_pass;
using detail::PlanState;

// Best node for one more replica of e: lowest load excess after it, then largest co-activation
// gain (0 if already present), then least loaded, then lowest id (within kImprovement).
// `noise` perturbs gains for restarts.
int best_node_for(const PlanState& s, int e, const std::vector<double>& noise) {
  int best = -1;
  double best_gain = 0, best_excess = 0, best_load = 0;
  for (int n = 0; n < s.num_nodes(); ++n) {
    if (s.node_used(n) >= s.node_slots() || s.x(e, n) >= s.per_node()) continue;
    const double g = (s.present(e, n) ? 0.0 : s.gain(e, n)) * (1.0 + noise[n]);
    const double excess = std::max(0.0, s.excess_after_change(e, n, +1));
    const double load = s.node_load(n);
    const bool better = best < 0 || excess < best_excess - kImprovement ||
                        (excess <= best_excess + kImprovement &&
                         (g > best_gain + kImprovement ||
                          (g >= best_gain - kImprovement && load < best_load - kImprovement)));
    if (better) {
      best = n;
      best_gain = g;
      best_excess = excess;
      best_load = load;
    }
  }
  return best;
}

std::vector<int> metis_partition(const GlobalPlanInput& in) {
  const int num_experts = in.num_experts;
  const int num_nodes = in.topology.num_nodes();
  std::vector<int> part(num_experts, 0);
  // METIS's recursive bisection of a graph with fewer than about two vertices per part prints
  // "Cannot bisect a graph with 0 vertices" on stdout (it would corrupt `cobalt plan`'s JSON):
  // such small instances start round-robin.
  if (num_nodes == 1 || num_experts < 2 * num_nodes) {
    for (int e = 0; e < num_experts; ++e) part[e] = e % num_nodes;
    return part;
  }
  double max_c = 0, total_c = 0, total_w = 0;
  for (double c : in.coactivation) {
    max_c = std::max(max_c, c);
    total_c += std::max(c, 0.0);
  }
  for (double w : in.expert_load) total_w += w;
  // METIS works in 32-bit integers (IDXTYPEWIDTH 32 on Debian) and adds edge weights up while it
  // coarsens the graph and computes cuts: the heaviest edge maps to at most 1e6 and all of them
  // together to at most 2^28 (E = 640 with dense co-activation would otherwise reach ~4e11).
  const double c_scale = max_c > 0 ? std::min(1e6 / max_c, std::ldexp(1.0, 28) / total_c) : 1.0;
  const double w_scale = total_w > 0 ? 1e6 / total_w : 1.0;
  std::vector<idx_t> xadj(num_experts + 1, 0), adjncy, adjwgt,
      vwgt(static_cast<size_t>(num_experts));
  for (int i = 0; i < num_experts; ++i) {
    for (int j = 0; j < num_experts; ++j) {
      const double c = in.coactivation[static_cast<size_t>(i) * num_experts + j];
      if (i == j || c <= 0) continue;
      adjncy.push_back(j);
      adjwgt.push_back(std::max<idx_t>(1, static_cast<idx_t>(std::llround(c * c_scale))));
    }
    xadj[i + 1] = static_cast<idx_t>(adjncy.size());
    vwgt[i] = std::max<idx_t>(1, static_cast<idx_t>(std::llround(in.expert_load[i] * w_scale)));
  }
  if (adjncy.empty()) {
    for (int e = 0; e < num_experts; ++e) part[e] = e % num_nodes;
    return part;
  }
  idx_t nvtxs = num_experts, ncon = 1, nparts = num_nodes, objval = 0;
  std::vector<real_t> ubvec = {static_cast<real_t>(1.0 + in.eps)};
  idx_t metis_options[METIS_NOPTIONS];
  METIS_SetDefaultOptions(metis_options);
  metis_options[METIS_OPTION_SEED] = 1;
  metis_options[METIS_OPTION_NUMBERING] = 0;
  std::vector<idx_t> metis_part(num_experts, 0);
  // METIS keeps its random-number state in globals (seeded per call from METIS_OPTION_SEED), so
  // concurrent calls, e.g. two layers planning on background threads, would interleave the draws
  // and make partitions depend on timing: one call at a time.
  static std::mutex metis_mutex;
  std::lock_guard<std::mutex> metis_lock(metis_mutex);
  const int status = METIS_PartGraphKway(&nvtxs, &ncon, xadj.data(), adjncy.data(), vwgt.data(),
                                         nullptr, adjwgt.data(), &nparts, nullptr, ubvec.data(),
                                         metis_options, &objval, metis_part.data());
  if (status != METIS_OK) {
    for (int e = 0; e < num_experts; ++e) part[e] = e % num_nodes;
    return part;
  }
  for (int e = 0; e < num_experts; ++e) part[e] = static_cast<int>(metis_part[e]);
  return part;
}

void initial_placement(PlanState& s, const GlobalPlanInput& in, int restart, uint64_t seed,
                       bool use_metis) {
  const int num_experts = s.num_experts();
  SplitMix64 rng(mix64(seed ^ (0x51ed2701ULL * (restart + 1))));
  std::vector<int> order(num_experts);
  std::iota(order.begin(), order.end(), 0);
  std::vector<double> key(num_experts);
  for (int e = 0; e < num_experts; ++e)
    key[e] = s.w(e) * (restart == 0 ? 1.0 : (0.7 + 0.6 * rng.unit()));
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] > key[b]; });
  std::vector<double> noise(s.num_nodes(), 0.0);
  std::vector<int> part;
  if (use_metis && restart == 0) part = metis_partition(in);
  for (int e : order) {
    for (int copy = 0; copy < s.min_replicas(e); ++copy) {
      int n = -1;
      if (copy == 0 && !part.empty()) {
        const int p = part[e];
        if (s.node_used(p) < s.node_slots() && s.excess_after_change(e, p, +1) <= 0) n = p;
      }
      if (n < 0) {
        if (restart > 0) {
          for (double& v : noise) v = 0.2 * (rng.unit() - 0.5);
        }
        n = best_node_for(s, e, noise);
      }
      COBALT_CHECK(n >= 0, kFailedPrecondition,
                   "global plan: no slot left for expert {} ({} of {} replicas placed); raise rho",
                   e, copy, s.min_replicas(e));
      s.add(e, n);
    }
  }
}

}  // namespace

HeuristicResult plan_global_heuristic(const GlobalPlanInput& input,
                                      const HeuristicOptions& options) {
  input.validate();
  COBALT_CHECK_ARG(options.num_restarts >= 1 && options.num_restarts <= kMaxPlannerRestarts,
                   "global plan: restarts {} out of range [1, {}]", options.num_restarts,
                   kMaxPlannerRestarts);
  COBALT_CHECK_ARG(options.max_local_search_passes >= 0,
                   "global plan: local search passes {} must be >= 0",
                   options.max_local_search_passes);
  if (options.initial != nullptr) {
    require_plan_shape(input, *options.initial, "global plan: initial plan");
  }
  const int num_runs = options.num_restarts + (options.initial ? 1 : 0);
  std::vector<double> objectives(num_runs, 0.0);
  std::vector<NodePlan> plans(num_runs);
  // Restarts are independent; they run in parallel and the best is picked in restart order, so the
  // result does not depend on the thread count.
  std::optional<GainScale> scale;
  if (options.bound_pruning) scale.emplace(input);
  const GainScale* scale_ptr = scale ? &*scale : nullptr;
  parallel_chunks(num_runs, num_runs, options.num_threads, [&](int restart, int64_t, int64_t) {
    PlanState state(input);
    if (restart == options.num_restarts) {
      // Incremental start from the given plan: its replicas (capped at M per node and the node's
      // slots), then anything missing placed greedily.
      const NodePlan& init = *options.initial;
      for (int e = 0; e < input.num_experts; ++e) {
        for (int n = 0; n < init.num_nodes; ++n) {
          for (int i = 0; i < init.x(e, n); ++i) {
            if (state.node_used(n) < state.node_slots() && state.x(e, n) < state.per_node()) {
              state.add(e, n);
            }
          }
        }
      }
      const std::vector<double> no_noise(input.topology.num_nodes(), 0.0);
      for (int e = 0; e < input.num_experts; ++e) {
        while (state.total(e) < 1) {
          const int n = best_node_for(state, e, no_noise);
          COBALT_CHECK(n >= 0, kFailedPrecondition, "global plan: no slot left for expert {}", e);
          state.add(e, n);
        }
      }
    } else {
      initial_placement(state, input, restart, options.seed, options.use_metis);
    }
    fill_spare_slots(state);
    for (int pass = 0;
         pass < options.max_local_search_passes && local_search_pass(state, scale_ptr); ++pass) {
      fill_spare_slots(state);
    }
    objectives[restart] = state.objective();
    plans[restart] = state.finish();
  });
  HeuristicResult result;
  result.restart_within_cap.resize(num_runs);
  for (int restart = 0; restart < num_runs; ++restart) {
    result.restart_within_cap[restart] = check_node_plan(input, plans[restart]).empty();
  }
  // The best objective among the plans within the load cap (all of them when none is).
  const bool any_within =
      std::any_of(result.restart_within_cap.begin(), result.restart_within_cap.end(),
                  [](uint8_t ok) { return ok; });
  bool found = false;
  for (int restart = 0; restart < num_runs; ++restart) {
    if (any_within && !result.restart_within_cap[restart]) continue;
    if (!found || objectives[restart] > result.objective + kImprovement) {
      result.objective = objectives[restart];
      result.plan = plans[restart];
      result.best_restart = restart;
      found = true;
    }
  }
  result.within_cap = any_within;
  result.restart_objectives = objectives;
  result.restart_plans = std::move(plans);
  return result;
}

}  // namespace cobalt::plan
