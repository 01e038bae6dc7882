// Policy: everything that decides the expert layout and the task assignment over a stream of steps
// — one per system (static EP, Cobalt, the peers). The simulator and the runtime drive a policy the
// same way: for each step in order, for each layer, call run() with that step's routing (after
// gating). A policy may plan before gating from history (its statistics) and/or after gating from
// the batch itself.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/routing_batch.hpp"
#include "cobalt/core/topology.hpp"
#include "cobalt/eval/cost_model.hpp"
#include "cobalt/plan/peer_cost.hpp"

namespace cobalt::policy {

struct PolicyConfig {
  Topology topology{1, 1};
  int num_experts = 0;
  int top_k = 0;
  int num_layers = 1;
  int slots_per_rank = 0;  // S: replica slots per rank (see slots_for_rho / slots_for_extra)
  double eps = 0.15;       // load tolerance of planners: (1 + eps) * mean
  int steps_per_global_plan = 10;  // P: Cobalt's global re-layout period
  double ema_decay = 0.9;          // history weight of the EMA statistics per step
  uint64_t seed = 0;
  int num_threads = 1;          // results are identical for any value
  bool async_planning = false;  // plan on a background thread; the layout applies one step later
  int planner_restarts = 8;
  // Sizes for TopoEP's benefit rule 2 D S_tok - |W_e| (the `topoep` policy reads them; layout
  // pricing reads the cost model's own): one token's hidden state (hidden * bytes per element) and
  // one expert's parameters. Defaults: those of eval::CostParams{} (GLM-4.5-Air in BF16: 4096 x 2
  // bytes and 3 x 4096 x 1408 x 2 bytes), so a default config and a default cost model describe
  // the same model. `cobalt simulate` sets both from its model preset.
  double token_bytes = eval::CostParams{}.token_bytes();
  double expert_param_bytes = eval::CostParams{}.expert_param_bytes();
  // Achievable dense GEMM FLOP/s of one GPU, for the peers' own cost models (FasterMoE's shadowing
  // rule, LAER-MoE's candidate choice; plan/peer_cost.hpp), which each system profiles on its
  // cluster. Default: plan::kAchievableGemmFlopsPerS (an H800's); `cobalt simulate` sets it from
  // its cluster preset (eval::CostParams::achievable_flops), so the peers see the modelled GPU.
  double gemm_flops_per_s = plan::kAchievableGemmFlopsPerS;
  // The cluster and model as the simulator's cost model sees them. When set, cobalt+ prices its
  // candidate layouts in modelled step time (replica gradient sync and migration included) and
  // also plans with smaller replica budgets, keeping replicas only where they pay for themselves
  // (cobalt/policy/layout_pricing.hpp). Unset: cobalt+ always fills slots_per_rank and picks by
  // cross-node transfers alone. Other policies ignore it.
  std::optional<eval::CostParams> cost_model;

  void validate() const;  // throws cobalt::Error naming the bad field and its valid range
};

struct PolicyCounters {
  double planner_wall_ms = 0;  // wall time spent deciding layouts (all stages, all calls;
                               // background plans by their own run time, not the wait)
  double async_plan_ms = 0;    // part of planner_wall_ms: background plans' cost (thread CPU
                               // time with num_threads 1, else wall time)
  // Over every call (warm-up steps included). Layout-keeping policies count the replica copies
  // of each layout change (diff() in core/expert_layout.hpp) and the changes; per-batch policies
  // (topoep, ultraep) plan every batch afresh and count the copies each batch's layout needs
  // from static EP, where the weights live between batches.
  int64_t num_global_plans = 0;  // re-layouts applied (cobalt: global plans; peers: any change)
  int64_t intra_node_moves = 0;  // replica copies over NVLink
  int64_t cross_node_moves = 0;  // replica copies across nodes
  int64_t max_solver_calls = 0;  // per-batch solver calls (per-microbatch policies)
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  // Token-level policies need per-token expert ids; load-based ones also run on load-only traces.
  virtual bool needs_token_ids() const { return true; }

  // Decides (step, layer): returns the layout in force and writes exec_rank [T, K], the rank
  // that runs each task; every rank written holds the task's expert in the returned layout. The
  // returned pointer is the policy's current layout: the same object until the policy changes
  // layouts (compare pointers to detect a change; diff() in core/expert_layout.hpp gives the
  // replica copies, eval::initial_main_ranks / next_main_ranks in eval/cost_model.hpp where each
  // expert's main instance, with its optimizer state, lives; examples/cpp). Steps start
  // at 0 and must not decrease per layer (a step may repeat: several micro-batches of one step.
  // `cobalt`, `cobalt+` and the history-based peers (eplb, smartmoe, flexmoe, laer) decide the
  // step's layout at its first call (cobalt and cobalt+: its first call with tasks) and fold the
  // later calls' counts into the step's observation; fastermoe, topoep and ultraep plan every call
  // from its own counts, as they do per forward pass / microbatch).
  // Throws kInvalidArgument, changing nothing, when the batch's E, K or ranks, the layer or the
  // output size disagree with the policy's configuration, or a step is negative or earlier than
  // the layer's previous one. With async_planning, a call may wait for the layer's background
  // plan, whose layout applies from the call after the one that started it. Not thread-safe:
  // one thread calls run() for all layers (the policy may run threads of its own).
  std::shared_ptr<const ExpertLayout> run(int64_t step, int layer, const RoutingBatch& batch,
                                          std::span<RankId> exec_rank);

  // Load-only replay (traces with a `counts` tensor, no per-token ids). counts: [G, E] tasks from
  // rank r choosing expert e this (step, layer) (sources already mapped onto the G ranks). Writes
  // the tasks each rank executes, rank_loads [G], and returns the layout in force. Token-level
  // policies cannot run here: they throw kFailedPrecondition naming the policy. A negative count,
  // or counts summing past 2^52, is kInvalidArgument before any state changes.
  std::shared_ptr<const ExpertLayout> run_loads(int64_t step, int layer,
                                                std::span<const int64_t> counts,
                                                std::span<int64_t> rank_loads);

  const PolicyCounters& counters() const { return counters_; }

 protected:
  // What run() / run_loads() call after validating their arguments.
  virtual std::shared_ptr<const ExpertLayout> do_run(int64_t step, int layer,
                                                     const RoutingBatch& batch,
                                                     std::span<RankId> exec_rank) = 0;
  virtual std::shared_ptr<const ExpertLayout> do_run_loads(int64_t step, int layer,
                                                           std::span<const int64_t> counts,
                                                           std::span<int64_t> rank_loads);

  PolicyCounters counters_;

 private:
  friend std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyConfig& config);
  // Throws unless step >= 0 and step >= the layer's last step (run() records the step before
  // it runs).
  void check_step_order(int64_t step, int layer) const;
  int num_experts_ = 0, top_k_ = 0, num_ranks_ = 0, num_layers_ = 0;  // set by make_policy
  std::vector<int64_t> last_step_;                                    // [L]
};

// Known policy names, in display order.
std::vector<std::string> policy_names();

// An estimate of the memory one policy holds at its peak while replaying config's shape (E =
// config.num_experts, G = config.topology.num_ranks(), config.num_layers layers), for up-front
// checks (core/memory.hpp). Fitted to peak RSS (docs/simulator.md "Memory"): cobalt and cobalt+
// keep ~19 E^2 bytes a layer of routing statistics (27 with async planning) plus ~10 E^2 + 3.5 E G
// once for the planner's copies; smartmoe and laer keep windows of [G, E] demand matrices per
// layer (16 and 25 E G bytes); the peers' per-batch demand and planning hold 9-32 E G bytes once;
// every policy but static keeps a layout per layer (~0.25 E G). Not included: the step's batch
// and tasks (eval::simulation_memory_bytes adds them). Throws kInvalidArgument for an unknown name.
struct PolicyMemory {
  double per_layer_bytes = 0;  // held for each layer
  double working_bytes = 0;    // held once
  int num_layers = 0;
  double total_bytes() const { return per_layer_bytes * num_layers + working_bytes; }
};
PolicyMemory policy_memory(const std::string& name, const PolicyConfig& config);
// Throws kInvalidArgument listing the valid names when `name` is unknown, or for a configuration
// the policy cannot run (PolicyConfig::validate; cobalt and cobalt+: top_k above
// assign::kMaxNodeCoverTopK), and kFailedPrecondition when policy_memory() is above the memory
// budget (core/memory.hpp).
std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyConfig& config);

}  // namespace cobalt::policy
