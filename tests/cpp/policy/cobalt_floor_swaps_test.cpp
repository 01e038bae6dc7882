// cobalt+'s stage 2b (plan/floor_swaps.hpp) in the policy: an expert that turns hot after the only
// global plan gets replicas (up to four swaps per step, from the step's own counts) until the
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
  double worst_floor_after_hot = 0;  // from the step after the first hot one on
};

ReplayEnd replay(const char* name) {
  PolicyConfig config;
  config.topology = Topology(2, 8);
  config.num_experts = 16;
  config.top_k = 2;
  config.slots_per_rank = slots_for_rho(16, 8, 0.5);
  config.steps_per_global_plan = 1000;  // one plan (step 1), from the uniform steps
  config.planner_restarts = 2;
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
    if (s >= 4) out.worst_floor_after_hot = std::max(out.worst_floor_after_hot, out.last_floor);
    out.last_imbalance = eval::imbalance(eval::rank_loads(exec, 8));
    out.replicas_of_hot = layout->num_replicas_of(0);
  }
  return out;
}

TEST(CobaltFloorSwaps, ANewlyHotExpertGetsReplicasBetweenPlans) {
  const ReplayEnd plus = replay("cobalt+");
  const ReplayEnd faithful = replay("cobalt");
  // Expert 0 carries 800 of 1600 tasks: at most ceil(1.05 * 200) = 210 per rank needs 4 replicas.
  // The swaps work from the step's own counts: the first hot step gets four (expert 0 on five
  // ranks, floor 1.145), and from the next step on the layout in force balances every step within
  // the cap, and the assignment reaches it.
  const double cap = 210.0 * 8 / 1600;
  EXPECT_GE(plus.replicas_of_hot, 4);
  EXPECT_LE(plus.worst_floor_after_hot, cap + 1e-12);
  EXPECT_LE(plus.last_imbalance, cap + 1e-12);
  // Without stage 2b the planned layout (from uniform loads) cannot balance the step.
  EXPECT_GT(faithful.last_floor, 1.5);
}

}  // namespace
}  // namespace cobalt::policy
