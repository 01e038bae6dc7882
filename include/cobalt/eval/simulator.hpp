// Trace-replay simulator: replays every step of a StepSource through each policy (same inputs for
// all), computes the metrics of DESIGN.md §3.3 and the modelled times of the cost model
// (eval/cost_model.hpp) per (step, layer), and aggregates them over the measured steps
// [warmup_steps, S).
//
// Token sources run Policy::run; load-only sources run Policy::run_loads, where token-level
// policies are skipped (PolicyResult::skipped says why) and the token metrics (cross-node
// transfers, exchange time, step time) are absent (has_token_metrics = false).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/routing_batch.hpp"
#include "cobalt/eval/cost_model.hpp"
#include "cobalt/eval/step_source.hpp"
#include "cobalt/policy/policy.hpp"

namespace cobalt::eval {

// Sees every (step, layer) of every token-level replay (e.g. the --dump writer). Calls arrive per
// policy in order: begin_policy, on_step for steps in order and layers in order, end_policy.
class ReplayObserver {
 public:
  virtual ~ReplayObserver() = default;
  virtual void begin_policy(const std::string& name) {}
  virtual void on_step(int step, int layer, const RoutingBatch& batch,
                       std::span<const RankId> exec_rank, const ExpertLayout& layout) {}
  virtual void end_policy(const std::string& name) {}
};

struct SimulationOptions {
  policy::PolicyConfig policy_config;  // topology, E, K, L, slots, eps, P, seed, threads
  std::vector<std::string> policies;
  int warmup_steps = 1;  // steps replayed but not measured, in [0, S)
  CostParams cost;
  ReplayObserver* observer = nullptr;  // optional, not owned
  // Called after each (policy, step) with (done, total) units of work.
  std::function<void(int64_t, int64_t)> progress;
};

// Modelled seconds per measured step, by cause; total() is the step time.
struct TimeBreakdown {
  double compute_s = 0;    // sum over layers of max-rank expert compute
  double exchange_s = 0;   // sum over layers of the exposed part of the 4 exchanges
  double grad_sync_s = 0;  // replica gradient synchronisation
  double migration_s = 0;  // layout changes (parameter + optimizer-state copies)
  double planning_s = 0;   // planner time on the critical path
  double total() const { return compute_s + exchange_s + grad_sync_s + migration_s + planning_s; }
};

struct PolicyResult {
  std::string name;
  std::string skipped;            // non-empty: the policy could not run on this trace, and why
  bool has_token_metrics = true;  // false on load-only traces
  int64_t cross_node_tokens = 0;  // sum of V (node dedup) over measured steps and layers
  int64_t cross_node_tokens_no_dedup = 0;  // sum over tasks of [node(exec) != node(src)]
  double cross_node_bytes = 0;             // cross_node_tokens x token_bytes x exchanges_per_layer
  double cross_node_reduction_vs_static = 0;     // 1 - V / V_static, when has_reduction_vs_static
  bool has_reduction_vs_static = false;          // static simulated, with V_static > 0
  double imbalance_mean = 1, imbalance_max = 1;  // over measured (step, layer)
  // Mean over the same (step, layer) of imbalance_floor (metrics.hpp): the lowest imbalance any
  // assignment reaches on the policy's layout in force; imbalance_mean above it is the
  // assignment's.
  double imbalance_floor_mean = 1;
  // Mean over the same (step, layer) of whole_task_imbalance_bound (metrics.hpp): the lowest
  // imbalance of any layout and assignment, loads being whole tasks. A property of the routing
  // and the rank count, the same for every policy.
  double imbalance_bound_mean = 1;
  double maxvio_mean = 0;
  double planner_wall_ms = 0;
  // Modelled (cost model), means over measured steps.
  double sim_step_time_s = 0;
  double speedup_vs_static = 0;  // static's sim_step_time_s / this one (0 without static)
  TimeBreakdown time;
  // Layout changes over the measured steps (diffs between consecutive layouts of a layer).
  double migration_bytes = 0;             // all replica copies (IB + NVLink)
  double migration_cross_node_bytes = 0;  // the part over the inter-node fabric
  int64_t migrated_replicas_cross_node = 0, migrated_replicas_intra_node = 0;
  double grad_sync_bytes = 0;           // per measured step, mean
  double replicas_per_expert_mean = 1;  // over measured (step, layer) layouts
  policy::PolicyCounters counters;
  std::vector<int64_t> step_cross_node_tokens;  // [S] summed over layers
  std::vector<double> step_imbalance;  // [S] mean over layers with tasks; NaN (JSON null) if none
  std::vector<double> step_time_s;     // [S] modelled step time
  std::vector<std::shared_ptr<const ExpertLayout>> final_layouts;  // [L] after the last step
};

struct SimulationResult {
  int num_experts = 0, top_k = 0, num_layers = 0, num_steps = 0;
  int64_t num_tokens = 0;
  int first_measured_step = 0;
  bool load_only = false;
  std::vector<PolicyResult> policies;
};

// Throws kInvalidArgument when options.policies holds a policy that cannot replay a token source
// of the configured top-k (see policy_max_top_k), before any policy runs.
SimulationResult simulate(const StepSource& source, const SimulationOptions& options);

// The largest top-k `policy` replays from per-token routing: assign::kMaxNodeCoverTopK (16) for
// cobalt and cobalt+ (Algorithm 1's node cover), no limit (INT_MAX) for the others. Load-only
// replays have no such limit (the token-level policies are skipped there).
int policy_max_top_k(const std::string& policy);

// The policies of `policies` whose top-k limit is below `top_k` (empty when all can replay it).
std::vector<std::string> policies_over_top_k(const std::vector<std::string>& policies, int top_k);

// An estimate of the memory simulate(source, options) holds at its peak, in bytes, for an up-front
// check (core/memory.hpp): the policies replay one after another, each built right before its
// replay and freed after it, so the largest policy's policy::policy_memory counts (per-layer
// statistics of cobalt and cobalt+, the peers' [G, E] demand windows and tables, per-layer
// layouts), plus the per-step work of the largest step (its batch, exec ranks and the assignment's
// scratch, shared by the policies): ~10 bytes a task, ~16 with cobalt+ (its balanced assignment's
// workspace; measured at 2^18 and 2^21 tokens a step). Left out: the workload itself and a --dump
// (DumpWriter::memory_bytes). Throws kInvalidArgument for an unknown policy name. `breakdown`, when
// given, receives a one-line account ("the largest policy, cobalt, 3.1 GiB: 16 MiB a layer x 200
// layers + ...; the largest step's work ...").
double simulation_memory_bytes(const StepSource& source, const SimulationOptions& options,
                               std::string* breakdown = nullptr);

}  // namespace cobalt::eval
