// Issue target: on `coactivated-late` with 2x8 ranks (EP16, rho 0.5, eps 0.15) the `cobalt` policy
// cuts cross-node transfers by >= 75% against static EP with mean imbalance <= 1.25
// (paper: 75.7-99.3%, 1.13-1.24). Measured at steady state, as the paper does (it starts from a
// checkpoint trained for 200 steps): the first P = 10 steps, during which the first plan rests on
// one step of history, are warm-up. Same command as the README:
//   cobalt simulate --preset coactivated-late --cluster 2x8 --warmup-steps 10
#include <gtest/gtest.h>

#include "cobalt/eval/simulator.hpp"
#include "cobalt/workload/presets.hpp"
#include "cobalt/workload/synthetic.hpp"

namespace cobalt {
namespace {

TEST(CobaltTarget, CoactivatedLateOnTwoNodes) {
  const auto data = workload::generate_trace(workload::workload_preset("coactivated-late"));
  auto source = eval::make_step_source(data);
  eval::SimulationOptions options;
  auto& config = options.policy_config;
  config.topology = Topology::parse("2x8");
  config.num_experts = source->num_experts();
  config.top_k = source->top_k();
  config.num_layers = source->num_layers();
  config.slots_per_rank = slots_for_rho(config.num_experts, config.topology.num_ranks(), 0.5);
  config.eps = 0.15;
  options.policies = {"static", "cobalt", "cobalt+"};
  options.warmup_steps = 10;
  const auto result = eval::simulate(*source, options);
  ASSERT_EQ(result.policies.size(), 3u);
  const auto& cobalt = result.policies[1];
  EXPECT_GE(cobalt.cross_node_reduction_vs_static, 0.75);
  EXPECT_LE(cobalt.imbalance_mean, 1.25);
  // The improved policy must not be worse than the faithful one on this workload.
  EXPECT_LE(result.policies[2].cross_node_tokens, cobalt.cross_node_tokens);
}

}  // namespace
}  // namespace cobalt
