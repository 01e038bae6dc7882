// Trace-replay simulator: replays every step of a StepSource through each policy (same inputs for
// all) and aggregates the metrics of DESIGN.md §3.3 over the measured steps [warmup_steps, S).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "cobalt/eval/step_source.hpp"
#include "cobalt/policy/policy.hpp"

namespace cobalt::eval {

struct SimulationOptions {
  policy::PolicyConfig policy_config;  // topology, E, K, L, slots, eps, P, seed, threads
  std::vector<std::string> policies;
  int warmup_steps = 1;
  // Called after each (policy, step) with (done, total) units of work.
  std::function<void(int64_t, int64_t)> progress;
};

struct PolicyResult {
  std::string name;
  int64_t cross_node_tokens = 0;           // sum of V (node dedup) over measured steps and layers
  int64_t cross_node_tokens_no_dedup = 0;  // sum over tasks of [node(exec) != node(src)]
  double cross_node_reduction_vs_static = 0;  // 1 - V / V_static (0 when static is not simulated)
  double imbalance_mean = 1, imbalance_max = 1;  // over measured (step, layer)
  double maxvio_mean = 0;
  double planner_wall_ms = 0;
  policy::PolicyCounters counters;
  std::vector<int64_t> step_cross_node_tokens;  // [S] summed over layers
  std::vector<double> step_imbalance;           // [S] mean over layers
};

struct SimulationResult {
  int num_experts = 0, top_k = 0, num_layers = 0, num_steps = 0;
  int64_t num_tokens = 0;
  int first_measured_step = 0;
  std::vector<PolicyResult> policies;
};

SimulationResult simulate(const StepSource& source, const SimulationOptions& options);

}  // namespace cobalt::eval
