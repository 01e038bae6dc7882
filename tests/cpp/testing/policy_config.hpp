// A small policy configuration for tests of Policy::run and make_policy.
#pragma once

#include "cobalt/core/topology.hpp"
#include "cobalt/policy/policy.hpp"

namespace cobalt::testing {

// One layer of `num_experts` experts, top-k `top_k`, `slots` slots per rank, two planner restarts
// (fast plans).
inline policy::PolicyConfig small_policy_config(const Topology& topology, int num_experts,
                                                int top_k, int slots) {
  policy::PolicyConfig config;
  config.topology = topology;
  config.num_experts = num_experts;
  config.top_k = top_k;
  config.slots_per_rank = slots;
  config.planner_restarts = 2;
  return config;
}

}  // namespace cobalt::testing
