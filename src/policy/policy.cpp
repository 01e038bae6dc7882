#include "cobalt/policy/policy.hpp"

#include <fmt/ranges.h>

#include <cmath>
#include <limits>

#include "cobalt/core/error.hpp"
#include "cobalt/core/memory.hpp"
#include "cobalt/core/text.hpp"
#include "cobalt/plan/global_planner.hpp"
#include "policy_registry.hpp"

namespace cobalt::policy {

void PolicyConfig::validate() const {
  COBALT_CHECK_ARG(num_experts >= 1 && num_experts <= kMaxExperts,
                   "policy: number of experts {} out of range [1, {}]", num_experts, kMaxExperts);
  COBALT_CHECK_ARG(top_k >= 1 && top_k <= num_experts, "policy: top-k {} out of range [1, {}]",
                   top_k, num_experts);
  COBALT_CHECK_ARG(num_layers >= 1, "policy: number of layers {} must be >= 1", num_layers);
  COBALT_CHECK_ARG(slots_per_rank >= 1 && slots_per_rank <= num_experts,
                   "policy: slots per rank {} out of range [{}, {}] (ceil(E / G) to E: a rank "
                   "never holds an expert twice)",
                   slots_per_rank, (num_experts + topology.num_ranks() - 1) / topology.num_ranks(),
                   num_experts);
  COBALT_CHECK(static_cast<int64_t>(slots_per_rank) * topology.num_ranks() >= num_experts,
               kFailedPrecondition,
               "replica budget too small: {} slots per rank x {} ranks < {} experts",
               slots_per_rank, topology.num_ranks(), num_experts);
  COBALT_CHECK_ARG(eps >= 0 && eps <= plan::kMaxEps, "policy: eps {} out of range [0, {}]", eps,
                   plan::kMaxEps);
  COBALT_CHECK_ARG(steps_per_global_plan >= 1, "policy: steps per global plan {} must be >= 1",
                   steps_per_global_plan);
  COBALT_CHECK_ARG(ema_decay >= 0 && ema_decay < 1, "policy: EMA decay {} out of range [0, 1)",
                   ema_decay);
  COBALT_CHECK_ARG(planner_restarts >= 1 && planner_restarts <= plan::kMaxPlannerRestarts,
                   "policy: planner restarts {} out of range [1, {}]", planner_restarts,
                   plan::kMaxPlannerRestarts);
  COBALT_CHECK_ARG(std::isfinite(token_bytes) && token_bytes > 0,
                   "policy: token bytes {} must be finite and > 0", token_bytes);
  COBALT_CHECK_ARG(std::isfinite(expert_param_bytes) && expert_param_bytes > 0,
                   "policy: expert parameter bytes {} must be finite and > 0", expert_param_bytes);
  COBALT_CHECK_ARG(std::isfinite(gemm_flops_per_s) && gemm_flops_per_s > 0,
                   "policy: GEMM FLOP/s {} must be finite and > 0", gemm_flops_per_s);
  COBALT_CHECK_ARG(num_threads >= 0, "policy: threads {} must be >= 0 (0 = all cores)",
                   num_threads);
  if (cost_model) cost_model->validate();
}

std::shared_ptr<const ExpertLayout> Policy::run(int64_t step, int layer, const RoutingBatch& batch,
                                                std::span<RankId> exec_rank) {
  COBALT_CHECK_ARG(
      batch.num_experts() == num_experts_ && batch.top_k() == top_k_ &&
          batch.num_ranks() == num_ranks_,
      "policy {}: batch has E={} K={} G={}, the policy was configured for E={} K={} G={}", name(),
      batch.num_experts(), batch.top_k(), batch.num_ranks(), num_experts_, top_k_, num_ranks_);
  COBALT_CHECK_ARG(layer >= 0 && layer < num_layers_, "policy {}: layer {} out of range [0, {})",
                   name(), layer, num_layers_);
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "policy {}: output holds {} ranks for {} tasks", name(), exec_rank.size(),
                   batch.num_tasks());
  check_step_order(step, layer);
  // Recorded before the step runs: one that fails midway may have changed the policy's state
  // (a plan applied), so an earlier step must not follow it.
  last_step_[layer] = step;
  return do_run(step, layer, batch, exec_rank);
}

std::shared_ptr<const ExpertLayout> Policy::run_loads(int64_t step, int layer,
                                                      std::span<const int64_t> counts,
                                                      std::span<int64_t> rank_loads) {
  COBALT_CHECK_ARG(layer >= 0 && layer < num_layers_, "policy {}: layer {} out of range [0, {})",
                   name(), layer, num_layers_);
  COBALT_CHECK_ARG(
      counts.size() == static_cast<size_t>(num_ranks_) * num_experts_ &&
          rank_loads.size() == static_cast<size_t>(num_ranks_),
      "policy {}: counts has {} entries (need G x E = {} x {}), rank loads {} (need {})", name(),
      counts.size(), num_ranks_, num_experts_, rank_loads.size(), num_ranks_);
  // Refused before any policy state changes. Loads are summed (and some peers compute in
  // doubles): at most 2^52 tasks in all, as the balance floor takes.
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    COBALT_CHECK_ARG(counts[i] >= 0, "policy {}: counts[{}][{}] = {} is negative", name(),
                     i / num_experts_, i % num_experts_, counts[i]);
    total += std::min<int64_t>(counts[i], int64_t{1} << 53);
    COBALT_CHECK_ARG(total <= int64_t{1} << 52,
                     "policy {}: the counts sum past 2^52 tasks (at counts[{}][{}] = {})", name(),
                     i / num_experts_, i % num_experts_, counts[i]);
  }
  // A token-level policy refuses load-only input before anything is recorded.
  COBALT_CHECK(!needs_token_ids(), kFailedPrecondition,
               "policy '{}' needs per-token expert ids (topk_ids); this trace is load-only "
               "(counts)",
               name());
  check_step_order(step, layer);
  last_step_[layer] = step;
  return do_run_loads(step, layer, counts, rank_loads);
}

void Policy::check_step_order(int64_t step, int layer) const {
  COBALT_CHECK_ARG(step >= 0, "policy {}: step {} must be >= 0", name(), step);
  const int64_t last = last_step_[layer];
  COBALT_CHECK_ARG(step >= last,
                   "policy {}: step {} of layer {} after step {} (steps must not decrease per "
                   "layer)",
                   name(), step, layer, last);
}

std::shared_ptr<const ExpertLayout> Policy::do_run_loads(int64_t, int, std::span<const int64_t>,
                                                         std::span<int64_t>) {
  fail(ErrorCode::kFailedPrecondition,
       "policy '{}' needs per-token expert ids (topk_ids); this trace is load-only (counts)",
       name());
}

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const auto& entry : registry()) names.push_back(entry.name);
  return names;
}

PolicyMemory policy_memory(const std::string& name, const PolicyConfig& config) {
  for (const auto& entry : registry()) {
    if (entry.name != name) continue;
    const MemoryCoefficients& c = entry.memory;
    const double num_experts = config.num_experts;
    const double eg = num_experts * config.topology.num_ranks(), ee = num_experts * num_experts;
    PolicyMemory memory;
    memory.num_layers = config.num_layers;
    memory.per_layer_bytes =
        c.per_layer_eg * eg +
        (c.per_layer_ee + (config.async_planning ? c.async_per_layer_ee : 0.0)) * ee;
    memory.working_bytes = c.working_eg * eg + c.working_ee * ee;
    return memory;
  }
  fail(ErrorCode::kInvalidArgument, "unknown policy '{}' (valid: {})", printable(name),
       fmt::join(policy_names(), ", "));
}

std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyConfig& config) {
  config.validate();
  for (const auto& entry : registry()) {
    if (entry.name == name) {
      // What the policy will hold (its statistics grow with E^2 per layer): refused up front.
      require_memory(policy_memory(name, config).total_bytes(),
                     fmt::format("policy '{}' ({} layers, E = {}, G = {})", name, config.num_layers,
                                 config.num_experts, config.topology.num_ranks()),
                     "lower the number of layers or experts");
      auto policy = entry.make(config);
      policy->num_experts_ = config.num_experts;
      policy->top_k_ = config.top_k;
      policy->num_ranks_ = config.topology.num_ranks();
      policy->num_layers_ = config.num_layers;
      policy->last_step_.assign(config.num_layers, std::numeric_limits<int64_t>::min());
      return policy;
    }
  }
  fail(ErrorCode::kInvalidArgument, "unknown policy '{}' (valid: {})", printable(name),
       fmt::join(policy_names(), ", "));
}

}  // namespace cobalt::policy
