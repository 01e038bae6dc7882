#include "cobalt/eval/step_timing.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>

#include "../policy/demand_matrix.hpp"
#include "cobalt/assign/balanced_cover.hpp"
#include "cobalt/assign/dispatch_layout.hpp"
#include "cobalt/assign/node_cover.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/core/expert_layout.hpp"
#include "cobalt/eval/metrics.hpp"
#include "cobalt/plan/global_planner.hpp"
#include "cobalt/plan/intra_node_rebalance.hpp"
#include "cobalt/plan/topoep_solver.hpp"
#include "cobalt/stats/routing_stats.hpp"

namespace cobalt::eval {
namespace {

// cobalt+'s spill tolerance (policy/cobalt_policy.cpp).
constexpr double kSpillTolerance = 0.05;

// Keeps the compiler from dropping a computation whose result is only written to memory.
inline void keep(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

template <typename Fn>
TimedOperation time_operation(const StepTimingOptions& options, std::string name, std::string what,
                              double items, std::string unit, Fn&& fn) {
  if (options.on_operation) options.on_operation(name);
  fn();  // untimed: first-touch of outputs, caches, lazy allocations
  std::vector<double> ms;
  for (int i = 0; i < options.reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  TimedOperation op;
  op.name = std::move(name);
  op.what = std::move(what);
  op.median_ms = ms[(ms.size() - 1) / 2];
  op.min_ms = ms.front();
  op.reps = options.reps;
  op.items = items;
  op.unit = std::move(unit);
  return op;
}

}  // namespace

void StepTimingOptions::validate(const RoutingBatch& batch) const {
  const int num_ranks = topology.num_ranks(), num_experts = batch.num_experts();
  COBALT_CHECK_ARG(num_ranks == batch.num_ranks(),
                   "step timing: the cluster has {} ranks, the batch was mapped to {}", num_ranks,
                   batch.num_ranks());
  COBALT_CHECK_ARG(batch.num_tokens() >= 1, "step timing: the batch holds no tokens");
  const int least = (num_experts + num_ranks - 1) / num_ranks;
  COBALT_CHECK_ARG(slots_per_rank >= least && slots_per_rank <= num_experts,
                   "step timing: {} slots per rank out of range [{}, {}] (E = {}, G = {})",
                   slots_per_rank, least, num_experts, num_experts, num_ranks);
  COBALT_CHECK_ARG(topoep_slots_per_rank >= least,
                   "step timing: {} TopoEP slots per rank, need >= {} (E = {}, G = {})",
                   topoep_slots_per_rank, least, num_experts, num_ranks);
  COBALT_CHECK_ARG(reps >= 1 && reps <= 1000000, "step timing: reps {} out of range [1, 1000000]",
                   reps);
  COBALT_CHECK_ARG(num_threads >= 1, "step timing: threads {} must be >= 1", num_threads);
  COBALT_CHECK_ARG(planner_restarts >= 1, "step timing: planner restarts {} must be >= 1",
                   planner_restarts);
  COBALT_CHECK_ARG(layer >= 0, "step timing: layer {} must be >= 0", layer);
}

std::vector<TimedOperation> time_step_operations(const RoutingBatch& batch,
                                                 const StepTimingOptions& options) {
  options.validate(batch);
  const Topology& topology = options.topology;
  const int num_experts = batch.num_experts(), top_k = batch.top_k();
  const auto num_tokens = static_cast<double>(batch.num_tokens());
  const auto num_tasks = static_cast<double>(batch.num_tasks());
  std::vector<TimedOperation> ops;

  // The floor of a one-pass kernel: the batch's ids and sources read and written once.
  std::vector<ExpertId> ids_copy(batch.topk_ids().size());
  std::vector<RankId> src_copy(batch.source_rank().size());
  ops.push_back(time_operation(
      options, "copy_bound", "memcpy of the batch's ids [T, K] and sources [T] (the same bytes)",
      num_tokens, "tokens", [&] {
        std::memcpy(ids_copy.data(), batch.topk_ids().data(), ids_copy.size() * sizeof(ExpertId));
        std::memcpy(src_copy.data(), batch.source_rank().data(), src_copy.size() * sizeof(RankId));
        keep(ids_copy.data());
        keep(src_copy.data());
      }));
  const double copy_ms = ops.back().median_ms;

  RoutingStats stats(num_experts, 0.9);
  ops.push_back(time_operation(
      options, "stats_update", "RoutingStats::update: EMA expert loads and co-activation [E, E]",
      num_tokens, "tokens", [&] { stats.update(batch, options.num_threads); }));

  // Stage 1 as the cobalt policy's planning call: restarts + the incremental one from static EP.
  const plan::GlobalPlanInput input{topology,
                                    num_experts,
                                    options.slots_per_rank,
                                    options.eps,
                                    stats.expert_load(),
                                    stats.coactivation(),
                                    {},
                                    0.0};
  const ExpertLayout static_layout =
      ExpertLayout::static_ep(topology, num_experts, options.slots_per_rank);
  const plan::NodePlan current = plan::node_plan_of(static_layout, stats.expert_load());
  plan::HeuristicOptions heuristic;
  heuristic.num_restarts = options.planner_restarts;
  heuristic.seed = options.seed;
  heuristic.num_threads = options.num_threads;
  heuristic.initial = &current;
  plan::HeuristicResult planned;
  ops.push_back(time_operation(
      options, "global_plan",
      fmt::format("plan_global_heuristic: stage 1, {} restarts (METIS start) + the incremental one",
                  options.planner_restarts),
      0, "", [&] { planned = plan::plan_global_heuristic(input, heuristic); }));
  ops.back().note =
      fmt::format("objective {:.4g}, best of {} restarts: #{}{}", planned.objective,
                  planned.restart_objectives.size(), planned.best_restart,
                  planned.best_restart == options.planner_restarts ? " (the incremental one)" : "");

  std::vector<double> slot_loads;
  std::optional<ExpertLayout> layout;
  ops.push_back(time_operation(
      options, "pack_ranks", "pack_ranks: the node plan onto ranks (slots, per-rank load)", 0, "",
      [&] { layout.emplace(plan::pack_ranks(input, planned.plan, &static_layout, &slot_loads)); }));
  ops.back().note = fmt::format("{} replicas for {} experts", layout->num_replicas(), num_experts);

  int64_t num_moves = 0;
  ops.push_back(time_operation(
      options, "rebalance", "rebalance_intra_node: stage 2 from the planned replica loads", 0, "",
      [&] { num_moves = plan::rebalance_intra_node(*layout, slot_loads).num_moves; }));
  ops.back().note = fmt::format("{} replicas would move", num_moves);

  std::vector<RankId> exec(batch.num_tasks());
  const assign::AssignOptions assign_options{assign::CoverSearch::kAuto, options.num_threads};
  ops.push_back(time_operation(
      options, "assign", "assign_node_cover: Algorithm 1 (minimum remote-node cover per token)",
      num_tokens, "tokens", [&] {
        assign::assign_node_cover(batch, *layout, {options.seed, options.step, options.layer, 0},
                                  assign_options, exec);
      }));
  ops.back().copy_ratio = copy_ms / ops.back().median_ms;
  const StepMetrics faithful = step_metrics(batch, exec, topology);
  ops.back().note =
      fmt::format("V {}, imbalance {:.3f}", faithful.transfers.dedup, faithful.imbalance);

  std::vector<RankId> balanced_exec(batch.num_tasks());
  ops.push_back(
      time_operation(options, "assign_balanced",
                     "assign_balanced_cover: cobalt+ (balanced within the cover, bounded spill)",
                     num_tokens, "tokens", [&] {
                       assign::assign_balanced_cover(batch, *layout, assign_options, balanced_exec,
                                                     kSpillTolerance);
                     }));
  ops.back().copy_ratio = copy_ms / ops.back().median_ms;
  const StepMetrics balanced = step_metrics(batch, balanced_exec, topology);
  ops.back().note =
      fmt::format("V {}, imbalance {:.3f}", balanced.transfers.dedup, balanced.imbalance);

  ops.push_back(time_operation(
      options, "dispatch_layout",
      "dispatch_layout: rank/node counts, offsets, token-in-rank [T, G], send slots", num_tasks,
      "tasks", [&] {
        const auto d = assign::dispatch_layout(exec, batch.source_rank(), top_k, topology);
        keep(d.slot.data());
      }));

  std::vector<int64_t> demand(static_cast<size_t>(topology.num_ranks()) * num_experts);
  ops.push_back(time_operation(options, "demand_matrix",
                               "the routing matrix Omega [G, E] TopoEP plans from", num_tasks,
                               "tasks", [&] { policy::count_demand(batch, demand); }));

  plan::TopoEpSolver solver;
  plan::TopoEpPlan topoep;
  const plan::TopoEpInput topoep_input{topology,
                                       num_experts,
                                       options.topoep_slots_per_rank,
                                       options.token_bytes,
                                       options.expert_param_bytes,
                                       demand};
  ops.push_back(time_operation(options, "topoep_solve",
                               "TopoEpSolver::solve: placement, routing quotas, refinement", 0, "",
                               [&] { solver.solve(topoep_input, topoep); }));
  ops.back().note =
      fmt::format("{} quotas, {}+{} replicas, {} moves, imbalance {:.3f}", topoep.quotas.size(),
                  topoep.stats.num_inter_node_replicas, topoep.stats.num_intra_node_replicas,
                  topoep.stats.num_refinement_moves, imbalance(topoep.rank_loads));
  return ops;
}

}  // namespace cobalt::eval
