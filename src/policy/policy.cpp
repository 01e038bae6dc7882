#include "cobalt/policy/policy.hpp"

#include <fmt/ranges.h>

#include "cobalt/core/error.hpp"
#include "policy_registry.hpp"

namespace cobalt::policy {

void PolicyConfig::validate() const {
  COBALT_CHECK_ARG(num_experts >= 1, "policy: number of experts {} must be >= 1", num_experts);
  COBALT_CHECK_ARG(top_k >= 1 && top_k <= num_experts, "policy: top-k {} out of range [1, {}]",
                   top_k, num_experts);
  COBALT_CHECK_ARG(num_layers >= 1, "policy: number of layers {} must be >= 1", num_layers);
  COBALT_CHECK(static_cast<int64_t>(slots_per_rank) * topology.num_ranks() >= num_experts,
               kFailedPrecondition,
               "replica budget too small: {} slots per rank x {} ranks < {} experts",
               slots_per_rank, topology.num_ranks(), num_experts);
  COBALT_CHECK_ARG(eps >= 0, "policy: eps {} must be >= 0", eps);
  COBALT_CHECK_ARG(steps_per_global_plan >= 1, "policy: steps per global plan {} must be >= 1",
                   steps_per_global_plan);
  COBALT_CHECK_ARG(ema_decay >= 0 && ema_decay < 1, "policy: EMA decay {} out of range [0, 1)",
                   ema_decay);
  COBALT_CHECK_ARG(planner_restarts >= 1, "policy: planner restarts {} must be >= 1",
                   planner_restarts);
}

std::shared_ptr<const ExpertLayout> Policy::run_loads(int64_t, int, std::span<const int64_t>,
                                                     std::span<int64_t>) {
  fail(ErrorCode::kFailedPrecondition,
       "policy '{}' needs per-token expert ids (topk_ids); this trace is load-only (counts)", name());
}

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const auto& entry : registry()) names.push_back(entry.name);
  return names;
}

std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyConfig& config) {
  config.validate();
  for (const auto& entry : registry()) {
    if (entry.name == name) return entry.make(config);
  }
  fail(ErrorCode::kInvalidArgument, "unknown policy '{}' (valid: {})", name,
       fmt::join(policy_names(), ", "));
}

}  // namespace cobalt::policy
