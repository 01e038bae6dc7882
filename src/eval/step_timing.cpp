#include "cobalt/eval/step_timing.hpp"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
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
#include "cobalt/policy/policy.hpp"
#include "cobalt/stats/routing_stats.hpp"

namespace cobalt::eval {
namespace {

// cobalt+'s spill tolerance (policy/cobalt_policy.cpp).
constexpr double kSpillTolerance = 0.05;

// Keeps the compiler from dropping a computation whose result is only written to memory.
inline void keep(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

// Runs `setup` then `fn` once untimed, then up to `reps` times setup (untimed) and fn (timed),
// stopping early once the timed runs took max_seconds.
template <typename Setup, typename Fn>
TimedOperation time_runs(const StepTimingOptions& options, std::string name, std::string what,
                         double items, std::string unit, Setup&& setup, Fn&& fn) {
  if (options.on_operation) options.on_operation(name);
  setup();
  fn();  // untimed: first-touch of outputs, caches, lazy allocations
  std::vector<double> ms;
  double total_ms = 0;
  for (int i = 0; i < options.reps && (i == 0 || total_ms < 1e3 * options.max_seconds); ++i) {
    setup();
    const auto start = std::chrono::steady_clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
    total_ms += ms.back();
  }
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  TimedOperation op;
  op.name = std::move(name);
  op.what = std::move(what);
  op.median_ms = n % 2 == 1 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  op.min_ms = ms.front();
  op.reps = static_cast<int>(n);
  op.items = items;
  op.unit = std::move(unit);
  return op;
}

template <typename Fn>
TimedOperation time_call(const StepTimingOptions& options, std::string name, std::string what,
                         double items, std::string unit, Fn&& fn) {
  return time_runs(
      options, std::move(name), std::move(what), items, std::move(unit), [] {},
      std::forward<Fn>(fn));
}

// V and imbalance of an assignment, and the layout's floor (the lowest imbalance any assignment
// reaches on it).
std::string transfers_note(const RoutingBatch& batch, std::span<const RankId> exec,
                           const ExpertLayout& layout) {
  const StepMetrics m = step_metrics(batch, exec, layout.topology());
  return fmt::format("V {}, imbalance {:.3f} (layout floor {:.3f})", m.transfers.dedup, m.imbalance,
                     imbalance_floor(m.expert_counts, layout));
}

}  // namespace

void StepTimingOptions::validate(const RoutingBatch& batch) const {
  const int num_ranks = topology.num_ranks(), num_experts = batch.num_experts();
  COBALT_CHECK_ARG(num_ranks == batch.num_ranks(),
                   "step timing: the cluster has {} ranks, the batch was mapped to {}", num_ranks,
                   batch.num_ranks());
  COBALT_CHECK_ARG(batch.num_tokens() >= 1, "step timing: the batch holds no tokens");
  // Algorithm 1 (assign, cobalt and cobalt+ steps) takes at most kMaxNodeCoverTopK: refused
  // before the first row is timed, not part-way.
  COBALT_CHECK_ARG(batch.top_k() <= assign::kMaxNodeCoverTopK,
                   "step timing: top-k {} out of range [1, {}] (Algorithm 1's node cover)",
                   batch.top_k(), assign::kMaxNodeCoverTopK);
  const int least = (num_experts + num_ranks - 1) / num_ranks;
  COBALT_CHECK_ARG(slots_per_rank >= least && slots_per_rank <= num_experts,
                   "step timing: {} slots per rank out of range [{}, {}] (E = {}, G = {})",
                   slots_per_rank, least, num_experts, num_experts, num_ranks);
  COBALT_CHECK_ARG(eps >= 0 && eps <= plan::kMaxEps, "step timing: eps {} out of range [0, {}]",
                   eps, plan::kMaxEps);
  COBALT_CHECK_ARG(reps >= 1 && reps <= 100000, "step timing: reps {} out of range [1, 100000]",
                   reps);
  COBALT_CHECK_ARG(max_seconds > 0 && max_seconds <= 1e6,
                   "step timing: max seconds {} out of range (0, 1e6]", max_seconds);
  COBALT_CHECK_ARG(num_threads >= 1, "step timing: threads {} must be >= 1", num_threads);
  COBALT_CHECK_ARG(planner_restarts >= 1, "step timing: planner restarts {} must be >= 1",
                   planner_restarts);
  COBALT_CHECK_ARG(step >= 0 && step <= std::numeric_limits<int64_t>::max() / 2,
                   "step timing: step {} out of range [0, 2^62]", step);
  COBALT_CHECK_ARG(layer >= 0 && layer < 65536, "step timing: layer {} out of range [0, 65536)",
                   layer);
}

std::vector<TimedOperation> time_step_operations(const RoutingBatch& batch,
                                                 const StepTimingOptions& options) {
  options.validate(batch);
  const Topology& topology = options.topology;
  const int num_experts = batch.num_experts(), top_k = batch.top_k();
  const auto num_tokens = static_cast<double>(batch.num_tokens());
  const auto num_tasks = static_cast<double>(batch.num_tasks());
  std::vector<TimedOperation> ops;

  // --- The library calls, each alone.
  // The floor of a one-pass kernel: the batch's ids and sources read and written once.
  std::vector<ExpertId> ids_copy(batch.topk_ids().size());
  std::vector<RankId> src_copy(batch.source_rank().size());
  ops.push_back(time_call(
      options, "copy_bound", "memcpy of the batch's ids [T, K] and sources [T] (the same bytes)",
      num_tokens, "tokens", [&] {
        std::memcpy(ids_copy.data(), batch.topk_ids().data(), ids_copy.size() * sizeof(ExpertId));
        std::memcpy(src_copy.data(), batch.source_rank().data(), src_copy.size() * sizeof(RankId));
        keep(ids_copy.data());
        keep(src_copy.data());
      }));
  const double copy_ms = ops.back().median_ms;

  RoutingStats timed_stats(num_experts, 0.9);
  ops.push_back(time_call(
      options, "stats_update", "RoutingStats::update: EMA expert loads and co-activation [E, E]",
      num_tokens, "tokens", [&] { timed_stats.update(batch, options.num_threads); }));

  // Stage 1 from this batch's statistics, with the policies' options: restarts (the first from a
  // METIS partition) and the incremental one from the layout in force (static EP at the first
  // plan).
  RoutingStats stats(num_experts, 0.9);
  stats.update(batch, options.num_threads);
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
  ops.push_back(time_call(
      options, "plan_heuristic",
      fmt::format("plan_global_heuristic alone: {} restarts + the incremental one (the policies "
                  "also pack and score every restart: *_plan_step)",
                  options.planner_restarts),
      0, "", [&] { planned = plan::plan_global_heuristic(input, heuristic); }));
  ops.back().note =
      fmt::format("objective {:.4g}, best of {} restarts: #{}{}", planned.objective,
                  planned.restart_objectives.size(), planned.best_restart,
                  planned.best_restart == options.planner_restarts ? " (the incremental one)" : "");

  std::optional<ExpertLayout> layout;
  ops.push_back(time_call(
      options, "pack_ranks", "pack_ranks: the heuristic's best node plan onto ranks", 0, "",
      [&] { layout.emplace(plan::pack_ranks(input, planned.plan, &static_layout, nullptr)); }));
  ops.back().note = fmt::format("{} replicas for {} experts", layout->num_replicas(), num_experts);

  std::vector<RankId> exec(batch.num_tasks());
  const assign::AssignOptions assign_options{assign::CoverSearch::kAuto, options.num_threads};
  ops.push_back(time_call(options, "assign", "assign_node_cover: Algorithm 1 on that layout",
                          num_tokens, "tokens", [&] {
                            assign::assign_node_cover(
                                batch, *layout, {options.seed, options.step, options.layer, 0},
                                assign_options, exec);
                          }));
  ops.back().copy_ratio = copy_ms / ops.back().median_ms;
  ops.back().note = transfers_note(batch, exec, *layout);
  const bool uses_avx512 = assign::resolve_kernel(assign_options, topology.num_nodes(), top_k) ==
                           assign::CpuKernel::kAvx512;
  if (uses_avx512) {
    ops.back().what += topology.num_nodes() <= 8 ? " (the AVX-512 kernel)"
                                                 : " (the AVX-512 set list of the subset search)";
  }

  // The same call forced onto the portable loop: the kernel's gain, measured in this run.
  std::vector<RankId> portable_exec(batch.num_tasks());
  ops.push_back(time_call(options, "assign_portable",
                          "assign_node_cover with CpuKernel::kPortable (the baseline-target loop)",
                          num_tokens, "tokens", [&] {
                            assign::assign_node_cover(
                                batch, *layout, {options.seed, options.step, options.layer, 0},
                                {assign::CoverSearch::kAuto, options.num_threads,
                                 assign::CpuKernel::kPortable},
                                portable_exec);
                          }));
  ops.back().copy_ratio = copy_ms / ops.back().median_ms;
  COBALT_CHECK_INTERNAL(portable_exec == exec,
                        "bench: the portable assignment differs from the default one");
  ops.back().note = uses_avx512 ? "same ranks as assign" : "same ranks as assign (the same loop)";

  // Stage 2 from what the policy feeds it after a step: the replicas' task counts.
  const auto counts = replica_task_counts(batch, *layout, exec);
  const std::vector<double> slot_loads(counts.begin(), counts.end());
  int64_t num_moves = 0;
  ops.push_back(time_call(
      options, "rebalance",
      "rebalance_intra_node: stage 2 from the replica task counts of that assignment", 0, "",
      [&] { num_moves = plan::rebalance_intra_node(*layout, slot_loads).num_moves; }));
  ops.back().note = fmt::format("{} replicas move", num_moves);

  std::vector<RankId> balanced_exec(batch.num_tasks());
  assign::BalancedCoverWorkspace balanced_workspace;  // kept across calls, as the policy keeps it
  ops.push_back(time_call(
      options, "assign_balanced", "assign_balanced_cover: cobalt+'s assignment, on the same layout",
      num_tokens, "tokens", [&] {
        assign::assign_balanced_cover(
            batch, *layout, {options.seed, options.step, options.layer, 0}, assign_options,
            balanced_exec, kSpillTolerance, &balanced_workspace);
      }));
  ops.back().copy_ratio = copy_ms / ops.back().median_ms;
  ops.back().note = transfers_note(batch, balanced_exec, *layout);

  // As a runtime calls it: into one DispatchLayout kept across steps (allocated by the untimed
  // first run), and into a fresh one every call (allocation and page faults included).
  assign::DispatchLayout kept_layout;
  ops.push_back(time_call(
      options, "dispatch_layout",
      "dispatch_layout (the runtime's, not a policy's): counts, offsets, token-in-rank, slots; "
      "output buffers kept across calls",
      num_tasks, "tasks", [&] {
        assign::dispatch_layout(exec, batch.source_rank(), top_k, topology, kept_layout);
        keep(kept_layout.slot.data());
      }));
  ops.push_back(time_call(
      options, "dispatch_fresh", "dispatch_layout into a fresh DispatchLayout every call",
      num_tasks, "tasks", [&] {
        const auto d = assign::dispatch_layout(exec, batch.source_rank(), top_k, topology);
        keep(d.slot.data());
      }));
  ops.back().note = "allocates and zero-fills its outputs";

  std::vector<int64_t> demand(static_cast<size_t>(topology.num_ranks()) * num_experts);
  ops.push_back(time_call(options, "demand_matrix",
                          "the routing matrix Omega [G, E] TopoEP plans from", num_tasks, "tasks",
                          [&] { policy::count_demand(batch, demand); }));

  plan::TopoEpSolver solver;
  plan::TopoEpPlan topoep;
  const plan::TopoEpInput topoep_input{topology,
                                       num_experts,
                                       options.slots_per_rank,
                                       options.token_bytes,
                                       options.expert_param_bytes,
                                       demand};
  ops.push_back(time_call(options, "topoep_solve",
                          "TopoEpSolver::solve alone: placement, routing quotas, refinement", 0, "",
                          [&] { solver.solve(topoep_input, topoep); }));
  ops.back().note =
      fmt::format("{} quotas, {}+{} replicas, {} moves", topoep.quotas.size(),
                  topoep.stats.num_inter_node_replicas, topoep.stats.num_intra_node_replicas,
                  topoep.stats.num_refinement_moves);

  // --- Whole policy steps, as the simulator runs them (this batch at every step).
  policy::PolicyConfig config;
  config.topology = topology;
  config.num_experts = num_experts;
  config.top_k = top_k;
  config.num_layers = options.layer + 1;
  config.slots_per_rank = options.slots_per_rank;
  config.eps = options.eps;
  config.seed = options.seed;
  config.num_threads = options.num_threads;
  config.planner_restarts = options.planner_restarts;
  config.token_bytes = options.token_bytes;
  config.expert_param_bytes = options.expert_param_bytes;
  const int64_t first_step = options.step;
  std::vector<RankId> policy_exec(batch.num_tasks());
  std::shared_ptr<const ExpertLayout> policy_layout;  // of the last timed run
  for (const std::string name : {"cobalt", "cobalt+"}) {
    // A step on which the global plan is due: a fresh policy has seen one step (untimed), and
    // plans at the next.
    std::unique_ptr<policy::Policy> fresh;
    double planner_ms = 0;
    ops.push_back(time_runs(
        options, name + "_plan_step",
        fmt::format("{}'s Policy::run on a step where its global plan is due (stage 1 with "
                    "packing and scoring on a token sample, stage 2, assignment, statistics)",
                    name),
        num_tokens, "tokens",
        [&] {
          fresh.reset();  // one policy alive at a time (cli/bench_command.cpp sizes for one)
          fresh = policy::make_policy(name, config);
          fresh->run(first_step, options.layer, batch, policy_exec);
        },
        [&] {
          const double before = fresh->counters().planner_wall_ms;
          policy_layout = fresh->run(first_step + 1, options.layer, batch, policy_exec);
          planner_ms = fresh->counters().planner_wall_ms - before;
        }));
    ops.back().policy_step = true;
    ops.back().note = fmt::format("{}; planning (both stages) {:.3f} ms",
                                  transfers_note(batch, policy_exec, *policy_layout), planner_ms);
    fresh.reset();

    // An ordinary step, once the plan is in force (planning made never due again).
    policy::PolicyConfig steady_config = config;
    steady_config.steps_per_global_plan = std::numeric_limits<int>::max();
    auto steady = policy::make_policy(name, steady_config);
    steady->run(first_step, options.layer, batch, policy_exec);
    steady->run(first_step + 1, options.layer, batch, policy_exec);
    int64_t next_step = first_step + 2;
    ops.push_back(time_call(
        options, name + "_step",
        fmt::format("{}'s Policy::run on an ordinary step (stage 2, assignment, statistics)", name),
        num_tokens, "tokens",
        [&] { policy_layout = steady->run(next_step++, options.layer, batch, policy_exec); }));
    ops.back().policy_step = true;
    ops.back().note = transfers_note(batch, policy_exec, *policy_layout);
  }
  auto topoep_policy = policy::make_policy("topoep", config);
  int64_t topoep_step = first_step;
  ops.push_back(time_call(
      options, "topoep_step",
      "topoep's Policy::run (Omega, solver, layout, quota-filling assignment), every step",
      num_tokens, "tokens", [&] {
        policy_layout = topoep_policy->run(topoep_step++, options.layer, batch, policy_exec);
      }));
  ops.back().policy_step = true;
  ops.back().note = transfers_note(batch, policy_exec, *policy_layout);
  COBALT_CHECK_INTERNAL(static_cast<int>(ops.size()) == kNumTimedOperations,
                        "step timing: {} rows, kNumTimedOperations says {}", ops.size(),
                        kNumTimedOperations);
  return ops;
}

}  // namespace cobalt::eval
