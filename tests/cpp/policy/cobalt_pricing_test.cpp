// cobalt+ with a cost model (PolicyConfig::cost_model): replicas and re-layouts are kept only where
// the modelled step time says they pay. Extreme cost models make the right answer unambiguous.
#include <gtest/gtest.h>

#include "cobalt/eval/cost_model.hpp"
#include "cobalt/eval/metrics.hpp"
#include "cobalt/eval/step_source.hpp"
#include "cobalt/policy/policy.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::policy {
namespace {

struct Replay {
  int max_replicas = 0;
  int64_t cross_node = 0;
  PolicyCounters counters;
  std::shared_ptr<const ExpertLayout> last_layout;
};

Replay replay(const eval::CostParams* cost, const char* name = "cobalt+") {
  const auto data = testing::random_trace(21, 12, 2000, 1, 32, 4, 16);
  const auto source = eval::make_step_source(data);
  PolicyConfig config;
  config.topology = Topology(2, 16);
  config.num_experts = 32;
  config.top_k = 4;
  config.slots_per_rank = slots_for_rho(32, 16, 0.5);
  config.steps_per_global_plan = 3;
  config.planner_restarts = 2;
  if (cost) config.cost_model = *cost;
  auto policy = make_policy(name, config);
  Replay out;
  eval::StepScratch scratch;
  for (int s = 0; s < source->num_steps(); ++s) {
    auto batch = source->batch(s, 0, 16, scratch);
    std::vector<RankId> exec(batch.num_tasks());
    out.last_layout = policy->run(s, 0, batch, exec);
    out.max_replicas = std::max(out.max_replicas, out.last_layout->num_replicas());
    if (s >= 3) out.cross_node += eval::cross_node_transfers(batch, exec, config.topology).dedup;
  }
  out.counters = policy->counters();
  return out;
}

TEST(CobaltPricing, NothingPaysKeepsStaticEp) {
  // Huge experts with Adam state, free compute, fast links for tokens: no replica, re-layout or
  // intra-node move can pay for its copies.
  eval::CostParams cost;
  cost.expert_ffn_size = 1 << 20;
  cost.achievable_flops = 1e30;
  const auto run = replay(&cost);
  EXPECT_EQ(run.counters.num_global_plans, 0);
  EXPECT_EQ(run.counters.intra_node_moves, 0);
  EXPECT_EQ(run.counters.cross_node_moves, 0);
  EXPECT_EQ(*run.last_layout, ExpertLayout::static_ep(Topology(2, 16), 32, 3));
}

TEST(CobaltPricing, ExpensiveReplicasAreNotKept) {
  // Replicas cost a lot of gradient traffic every step; re-layouts without replicas may still pay.
  eval::CostParams cost;
  cost.expert_ffn_size = 1 << 16;
  cost.optimizer_factor = 0;
  const auto run = replay(&cost);
  EXPECT_EQ(run.max_replicas, 32);
}

TEST(CobaltPricing, CheapReplicasAreUsed) {
  // Experts as small as three tokens, no gradient or optimizer traffic, slow inter-node links:
  // replication pays, and priced cobalt+ cuts transfers like unpriced cobalt+ does.
  eval::CostParams cost;
  cost.expert_ffn_size = 1;
  cost.grad_bytes_per_element = 0;
  cost.param_refresh = false;
  cost.optimizer_factor = 0;
  cost.ib_bytes_per_s_per_node = 1e9;
  const auto priced = replay(&cost);
  const auto unpriced = replay(nullptr);
  const auto baseline = replay(nullptr, "static");
  EXPECT_GT(priced.max_replicas, 32);
  EXPECT_LT(priced.cross_node, baseline.cross_node * 3 / 4);
  EXPECT_LE(priced.cross_node, unpriced.cross_node * 11 / 10);
}

}  // namespace
}  // namespace cobalt::policy
