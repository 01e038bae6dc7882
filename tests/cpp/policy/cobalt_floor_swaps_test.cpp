// cobalt+'s stage 2b (plan/floor_swaps.hpp) in the policy: an expert that turns hot after the only
// global plan gets replicas (up to 20 swaps per step, from the step's own counts) until the
// layout in force can balance the step within the spill's cap; cobalt (no stage 2b) keeps the
// planned layout's floor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "cobalt/core/rng.hpp"
#include "cobalt/eval/metrics.hpp"
#include "cobalt/policy/policy.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::policy {
namespace {

// Tokens choose K = 2 distinct experts uniformly; from step `hot_from` on, every token's first
// choice is expert 0 (half of all tasks).
testing::OwnedBatch step_batch(int64_t step, int hot_from) {
  SplitMix64 rng(1000 + static_cast<uint64_t>(step));
  testing::OwnedBatch b;
  b.top_k = 2;
  b.num_experts = 16;
  b.num_ranks = 8;
  for (int t = 0; t < 800; ++t) {
    const auto first = static_cast<ExpertId>(step >= hot_from ? 0 : rng.below(16));
    ExpertId second = first;
    while (second == first) second = static_cast<ExpertId>(rng.below(16));
    b.topk_ids.push_back(first);
    b.topk_ids.push_back(second);
    b.source_rank.push_back(t % 8);
  }
  return b;
}

struct ReplayEnd {
  double last_floor = 0;
  double last_imbalance = 0;
  int replicas_of_hot = 0;
  double worst_floor_from_hot = 0;   // from the first hot step on
  double worst_floor_after_hot = 0;  // from the step after the first hot one on
};

ReplayEnd replay(const char* name, const eval::CostParams* cost = nullptr) {
  PolicyConfig config;
  config.topology = Topology(2, 8);
  config.num_experts = 16;
  config.top_k = 2;
  config.slots_per_rank = slots_for_rho(16, 8, 0.5);
  config.steps_per_global_plan = 1000;  // one plan (step 1), from the uniform steps
  config.planner_restarts = 2;
  if (cost) config.cost_model = *cost;
  auto policy = make_policy(name, config);
  ReplayEnd out;
  for (int64_t s = 0; s < 24; ++s) {
    const auto owned = step_batch(s, 3);
    const auto batch = owned.view();
    std::vector<RankId> exec(batch.num_tasks());
    const auto layout = policy->run(s, 0, batch, exec);
    std::vector<int64_t> counts(16, 0);
    for (ExpertId e : batch.topk_ids()) ++counts[e];
    out.last_floor = eval::imbalance_floor(counts, *layout);
    if (s >= 3) out.worst_floor_from_hot = std::max(out.worst_floor_from_hot, out.last_floor);
    if (s >= 4) out.worst_floor_after_hot = std::max(out.worst_floor_after_hot, out.last_floor);
    out.last_imbalance = eval::imbalance(eval::rank_loads(exec, 8));
    out.replicas_of_hot = layout->num_replicas_of(0);
  }
  return out;
}

TEST(CobaltFloorSwaps, ANewlyHotExpertGetsReplicasBetweenPlans) {
  const ReplayEnd plus = replay("cobalt+");
  const ReplayEnd faithful = replay("cobalt");
  // Expert 0 carries 800 of 1600 tasks: at most 1.05 * 200 = 210 per rank needs 4 replicas.
  // The swaps work from the step's own counts, known before dispatch: from the first hot step on
  // (there: expert 0 on seven ranks, floor 1.035) the layout in force balances every step within
  // the cap, and the assignment reaches it.
  const double cap = 210.0 * 8 / 1600;
  EXPECT_GE(plus.replicas_of_hot, 4);
  EXPECT_LE(plus.worst_floor_from_hot, cap + 1e-12);
  EXPECT_LE(plus.last_imbalance, cap + 1e-12);
  // Without stage 2b the planned layout (from uniform loads) cannot balance the step.
  EXPECT_GT(faithful.last_floor, 1.5);
}

// Priced (a cost model in the configuration), the swaps are kept as far as they pay in their
// step: with experts cheap to copy against their tasks' compute, the hot expert gets its replicas
// (at most four swaps per step priced, so within the cap from the second hot step on); when no copy
// can pay (huge experts, free compute), none is made and the floor stays where the layout puts it.
TEST(CobaltFloorSwaps, PricedSwapsAreKeptAsFarAsTheyPay) {
  const double cap = 210.0 * 8 / 1600;
  eval::CostParams cheap;
  cheap.expert_ffn_size = 1;
  cheap.grad_bytes_per_element = 0;
  cheap.param_refresh = false;
  cheap.optimizer_factor = 0;
  cheap.achievable_flops = 1e12;  // a task's compute outlasts an expert's copy
  const ReplayEnd paid = replay("cobalt+", &cheap);
  EXPECT_GE(paid.replicas_of_hot, 4);
  EXPECT_LE(paid.worst_floor_after_hot, cap + 1e-12);
  EXPECT_LE(paid.last_imbalance, cap + 1e-12);
  eval::CostParams hopeless;
  hopeless.expert_ffn_size = 1 << 20;
  hopeless.achievable_flops = 1e30;
  const ReplayEnd refused = replay("cobalt+", &hopeless);
  EXPECT_EQ(refused.replicas_of_hot, 1);
  EXPECT_GT(refused.last_floor, 1.5);
}

}  // namespace
}  // namespace cobalt::policy
