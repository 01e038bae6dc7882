#include "cobalt/eval/simulator.hpp"

#include <fmt/ranges.h>

#include <algorithm>

#include "cobalt/core/assignment.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/eval/metrics.hpp"

namespace cobalt::eval {

SimulationResult simulate(const StepSource& source, const SimulationOptions& options) {
  const auto& config = options.policy_config;
  COBALT_CHECK_ARG(source.num_experts() == config.num_experts && source.top_k() == config.top_k &&
                       source.num_layers() == config.num_layers,
                   "simulate: trace has E={} K={} L={}, policy config E={} K={} L={}",
                   source.num_experts(), source.top_k(), source.num_layers(), config.num_experts,
                   config.top_k, config.num_layers);
  COBALT_CHECK_ARG(!options.policies.empty(), "simulate: no policies given (valid: {})",
                   fmt::format("{}", fmt::join(policy::policy_names(), ", ")));
  const int num_steps = source.num_steps();
  COBALT_CHECK_ARG(options.warmup_steps >= 0 && options.warmup_steps < num_steps,
                   "simulate: warm-up steps {} out of range [0, {}) for a trace of {} steps",
                   options.warmup_steps, num_steps, num_steps);
  SimulationResult result;
  result.num_experts = config.num_experts;
  result.top_k = config.top_k;
  result.num_layers = config.num_layers;
  result.num_steps = num_steps;
  for (int s = 0; s < num_steps; ++s) result.num_tokens += source.num_tokens(s);
  result.first_measured_step = options.warmup_steps;
  // Fail early on unknown names before doing any work.
  std::vector<std::unique_ptr<policy::Policy>> policies;
  for (const auto& name : options.policies) policies.push_back(policy::make_policy(name, config));

  const int64_t total_work = static_cast<int64_t>(policies.size()) * num_steps;
  int64_t done = 0;
  StepScratch scratch;
  std::vector<RankId> exec;
  for (auto& pol : policies) {
    PolicyResult pr;
    pr.name = pol->name();
    pr.step_cross_node_tokens.assign(num_steps, 0);
    pr.step_imbalance.assign(num_steps, 0.0);
    double imbalance_sum = 0, maxvio_sum = 0;
    int64_t measured = 0;
    for (int s = 0; s < num_steps; ++s) {
      for (int l = 0; l < config.num_layers; ++l) {
        RoutingBatch batch = source.batch(s, l, config.topology.num_ranks(), scratch);
        exec.assign(batch.num_tasks(), -1);
        auto layout = pol->run(s, l, batch, exec);
        validate_assignment(batch, *layout, exec);
        const StepMetrics m = step_metrics(batch, exec, config.topology);
        pr.step_cross_node_tokens[s] += m.transfers.dedup;
        pr.step_imbalance[s] += m.imbalance / config.num_layers;
        if (s >= options.warmup_steps) {
          pr.cross_node_tokens += m.transfers.dedup;
          pr.cross_node_tokens_no_dedup += m.transfers.no_dedup;
          imbalance_sum += m.imbalance;
          pr.imbalance_max = std::max(pr.imbalance_max, m.imbalance);
          maxvio_sum += m.max_violation;
          ++measured;
        }
      }
      if (options.progress) options.progress(++done, total_work);
    }
    pr.imbalance_mean = measured ? imbalance_sum / measured : 1.0;
    pr.maxvio_mean = measured ? maxvio_sum / measured : 0.0;
    pr.counters = pol->counters();
    pr.planner_wall_ms = pr.counters.planner_wall_ms;
    result.policies.push_back(std::move(pr));
  }
  const auto it = std::find_if(result.policies.begin(), result.policies.end(),
                               [](const PolicyResult& p) { return p.name == "static"; });
  if (it != result.policies.end() && it->cross_node_tokens > 0) {
    for (auto& p : result.policies) {
      p.cross_node_reduction_vs_static = 1.0 - static_cast<double>(p.cross_node_tokens) /
                                                   static_cast<double>(it->cross_node_tokens);
    }
  }
  return result;
}

}  // namespace cobalt::eval
