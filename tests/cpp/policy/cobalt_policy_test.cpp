// The `cobalt` policy (src/policy/cobalt_policy.cpp): its global plan keeps to the (1 + eps) load
// cap of Eq. (3) (a layout in force that the loads have pushed over the cap is replaced by a
// restart within it, even when it has fewer cross-node transfers: it won on transfers alone
// before, and stayed for good), and micro-batches of one step draw with distinct token keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cobalt/assign/node_cover.hpp"
#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/policy/policy.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::policy {
namespace {

// 4000 top-2 tokens from 4 ranks (contiguous blocks); each picks two distinct experts of one
// group: group A (experts 0-3) for every token once `shifted`, else A and B (4-7) alternately.
testing::OwnedBatch shifting_batch(int step, bool shifted) {
  testing::OwnedBatch b;
  b.top_k = 2;
  b.num_experts = 8;
  b.num_ranks = 4;
  const int num_tokens = 4000;
  for (int t = 0; t < num_tokens; ++t) {
    const int base = (shifted || t % 2 == 0) ? 0 : 4;
    const uint64_t h = mix64(static_cast<uint64_t>(step) * 1000003 + t);
    const int first = static_cast<int>(h % 4);
    const int second = (first + 1 + static_cast<int>((h >> 8) % 3)) % 4;
    b.topk_ids.push_back(base + first);
    b.topk_ids.push_back(base + second);
    b.source_rank.push_back(t * 4 / num_tokens);
  }
  return b;
}

// A configuration for the small policy scenarios in this file.
PolicyConfig scenario_config(Topology topology, int num_experts, int top_k, int slots_per_rank,
                             int steps_per_global_plan) {
  PolicyConfig config;
  config.topology = topology;
  config.num_experts = num_experts;
  config.top_k = top_k;
  config.slots_per_rank = slots_per_rank;
  config.steps_per_global_plan = steps_per_global_plan;
  return config;
}

// A batch of `num_tokens` tokens for `config`: token(t, ids) writes token t's K expert ids and
// returns its source rank.
template <class Token>
testing::OwnedBatch scenario_batch(const PolicyConfig& config, int num_tokens, Token&& token) {
  testing::OwnedBatch b;
  b.top_k = config.top_k;
  b.num_experts = config.num_experts;
  b.num_ranks = config.topology.num_ranks();
  std::vector<ExpertId> ids(config.top_k);
  for (int t = 0; t < num_tokens; ++t) {
    const RankId source = token(t, ids);
    b.topk_ids.insert(b.topk_ids.end(), ids.begin(), ids.end());
    b.source_rank.push_back(source);
  }
  return b;
}

TEST(CobaltPolicy, ALayoutInForceOverTheLoadCapIsReplaced) {
  PolicyConfig config;
  config.topology = Topology(2, 4);  // 2 nodes x 2 ranks
  config.num_experts = 8;
  config.top_k = 2;
  config.slots_per_rank = 2;  // no spare slot: stage 2 cannot help
  config.eps = 0.15;
  config.steps_per_global_plan = 10;
  auto policy = make_policy("cobalt", config);
  // Static EP puts group A on node 0. From step 12 every token chooses A: node 0 carries all the
  // load (imbalance 2), twice the (1 + eps) cap; splitting A over both nodes meets it at the cost
  // of cross-node transfers. The plans due at steps 21 and 31 must take such a layout.
  double last_imbalance = 0;
  std::shared_ptr<const ExpertLayout> layout;
  for (int step = 0; step < 40; ++step) {
    auto batch = shifting_batch(step, step >= 12);
    std::vector<RankId> exec(batch.topk_ids.size());
    layout = policy->run(step, 0, batch.view(), exec);
    std::vector<int64_t> loads(4, 0);
    for (RankId r : exec) ++loads[r];
    last_imbalance =
        static_cast<double>(*std::max_element(loads.begin(), loads.end())) / (2.0 * 4000 / 4);
  }
  int a_on_node0 = 0;
  for (ExpertId e = 0; e < 4; ++e) a_on_node0 += layout->holds(0, e) || layout->holds(1, e);
  EXPECT_LT(a_on_node0, 4) << "group A still gathered on node 0";
  EXPECT_LT(last_imbalance, 1.5);
  EXPECT_GE(policy->counters().num_global_plans, 1);
}

// 4 nodes x 4 ranks, 32 experts, top-4, 3 slots per rank, a global plan every 2 steps.
PolicyConfig micro_batch_config() {
  PolicyConfig config;
  config.topology = Topology(4, 16);
  config.num_experts = 32;
  config.top_k = 4;
  config.slots_per_rank = 3;
  config.steps_per_global_plan = 2;
  return config;
}

// A step given as two micro-batches (gradient accumulation) is the step given whole: one layout for
// the step (decided at its first call), Algorithm 1's draws continuing the step's token numbering,
// and one observation of the step's counts. With decay 0.5 every EMA sum is exact, so the policy
// fed halves and the policy fed whole steps stay identical, bit for bit, over the following steps.
TEST(CobaltPolicy, MicroBatchesOfAStepAreTheStepGivenWhole) {
  PolicyConfig config = micro_batch_config();
  config.seed = 11;
  config.ema_decay = 0.5;
  auto halves = make_policy("cobalt", config);
  auto whole = make_policy("cobalt", config);
  for (int64_t step = 0; step < 6; ++step) {
    const auto batch = testing::random_batch(5 + step, 2000, 4, 32, 16, 1.0);
    const auto first = testing::token_range(batch, 0, 1200),
               second = testing::token_range(batch, 1200, 800);
    std::vector<RankId> exec_first(first.topk_ids.size()), exec_second(second.topk_ids.size());
    std::vector<RankId> exec_whole(batch.topk_ids.size());
    const auto layout_first = halves->run(step, 0, first.view(), exec_first);
    const auto layout_second = halves->run(step, 0, second.view(), exec_second);
    const auto layout_whole = whole->run(step, 0, batch.view(), exec_whole);
    EXPECT_EQ(layout_first, layout_second) << "the layout changed within step " << step;
    ASSERT_TRUE(*layout_first == *layout_whole) << "step " << step;
    exec_first.insert(exec_first.end(), exec_second.begin(), exec_second.end());
    ASSERT_EQ(exec_first, exec_whole) << "step " << step;
  }
  EXPECT_EQ(halves->counters().num_global_plans, whole->counters().num_global_plans);
  EXPECT_EQ(halves->counters().intra_node_moves, whole->counters().intra_node_moves);
  EXPECT_EQ(halves->counters().cross_node_moves, whole->counters().cross_node_moves);
  EXPECT_GT(whole->counters().num_global_plans + whole->counters().intra_node_moves, 0);
}

// cobalt+ too keeps one layout per step (its balanced assignment is per call, so its ranks
// differ), and a batch without tasks decides nothing: a step whose first micro-batch is empty is
// the step alone (stage 2b included, which an empty batch would have run on no counts).
TEST(CobaltPolicy, CobaltPlusDecidesOncePerStepAndNotOnAnEmptyBatch) {
  auto policy = make_policy("cobalt+", micro_batch_config());
  auto empty_first = make_policy("cobalt+", micro_batch_config());
  auto plain = make_policy("cobalt+", micro_batch_config());
  for (int64_t step = 0; step < 5; ++step) {
    const auto batch = testing::random_batch(7 + step, 1500, 4, 32, 16, 1.0);
    const auto empty = testing::token_range(batch, 0, 0);
    std::vector<RankId> exec(batch.topk_ids.size()), exec_plain(batch.topk_ids.size()), none;
    const auto layout = policy->run(step, 0, batch.view(), exec);
    for (int micro_batch = 1; micro_batch < 3; ++micro_batch) {
      EXPECT_EQ(policy->run(step, 0, batch.view(), exec), layout) << step << " " << micro_batch;
    }
    empty_first->run(step, 0, empty.view(), none);
    const auto after_empty = empty_first->run(step, 0, batch.view(), exec);
    const auto alone = plain->run(step, 0, batch.view(), exec_plain);
    ASSERT_TRUE(*after_empty == *alone) << "step " << step;
    ASSERT_EQ(exec, exec_plain) << "step " << step;
  }
  EXPECT_EQ(empty_first->counters().intra_node_moves, plain->counters().intra_node_moves);
  EXPECT_EQ(empty_first->counters().cross_node_moves, plain->counters().cross_node_moves);
}

// On shifting_batch with P = 10 (plans due at steps 1, 11, 21), the shift at step 12 first splits
// group A over the nodes at step 21: a plan is due exactly every P steps, not one step later.
TEST(CobaltPolicy, CobaltPlansEveryPStepsExactly) {
  const auto config = scenario_config(Topology(2, 4), 8, 2, 2, 10);
  auto policy = make_policy("cobalt", config);
  int first_split = -1;
  for (int step = 0; step < 30 && first_split < 0; ++step) {
    auto batch = shifting_batch(step, step >= 12);
    std::vector<RankId> exec(batch.topk_ids.size());
    auto layout = policy->run(step, 0, batch.view(), exec);
    int a_on_node0 = 0;
    for (ExpertId e = 0; e < 4; ++e) a_on_node0 += layout->holds(0, e) || layout->holds(1, e);
    if (a_on_node0 < 4) first_split = step;
  }
  EXPECT_EQ(first_split, 21);
}

// cobalt+'s move counters cover every replica that is new on its rank from one step to the next,
// stage 2b's swaps within a node included.
TEST(CobaltPolicy, CobaltPlusCountsEveryCopy) {
  auto config = scenario_config(Topology(2, 8), 16, 2, slots_for_rho(16, 8, 0.5), 1000);
  config.planner_restarts = 2;
  auto policy = make_policy("cobalt+", config);
  std::shared_ptr<const ExpertLayout> previous;
  int64_t counted_before = 0, copies = 0;
  for (int64_t s = 0; s < 10; ++s) {
    SplitMix64 rng(1000 + static_cast<uint64_t>(s));
    const auto b = scenario_batch(config, 800, [&](int t, std::vector<ExpertId>& ids) {
      ids[0] = static_cast<ExpertId>(s >= 3 ? 0 : rng.below(16));
      ids[1] = ids[0];
      while (ids[1] == ids[0]) ids[1] = static_cast<ExpertId>(rng.below(16));
      return static_cast<RankId>(t % 8);
    });
    std::vector<RankId> exec(b.topk_ids.size());
    auto layout = policy->run(s, 0, b.view(), exec);
    const int64_t counted =
        policy->counters().intra_node_moves + policy->counters().cross_node_moves;
    if (previous) {
      const auto d = diff(*previous, *layout);
      EXPECT_GE(counted - counted_before, static_cast<int64_t>(d.moves.size())) << "step " << s;
      copies += static_cast<int64_t>(d.moves.size());
    }
    counted_before = counted;
    previous = layout;
  }
  EXPECT_GT(copies, 0);
}

// On one node every layout has zero cross-node transfers, so a plan is adopted for its balance
// alone: experts 0 and 1 (static EP: both on rank 0) carry 20% of the tasks each, under the
// per-expert cap but 40% on rank 0.
TEST(CobaltPolicy, OneNodeCobaltAdoptsABetterBalancedPlan) {
  const auto config = scenario_config(Topology(1, 4), 8, 2, 2, 5);
  auto policy = make_policy("cobalt", config);
  for (int step = 0; step < 3; ++step) {
    const auto b = scenario_batch(config, 4000, [&](int t, std::vector<ExpertId>& ids) {
      const uint64_t h = mix64(static_cast<uint64_t>(step) * 1000003 + t);
      const int r = static_cast<int>(h % 10);
      ids[0] = r < 4 ? 0 : r < 8 ? 1 : 2 + static_cast<int>((h >> 8) % 6);
      ids[1] = 2 + static_cast<int>((h >> 16) % 6);
      if (ids[1] == ids[0]) ids[1] = 2 + (ids[1] - 2 + 1) % 6;
      return static_cast<RankId>(t % 4);
    });
    std::vector<RankId> exec(b.topk_ids.size());
    policy->run(step, 0, b.view(), exec);
  }
  EXPECT_GE(policy->counters().num_global_plans, 1);
}

// When no restart meets the load cap the layout in force is replaced only for fewer sampled
// transfers. 2 nodes x 2 ranks, 2 experts, one slot per rank: expert 0 carries 900 of 1000
// tasks (it needs 4 replicas under the cap and can have 3), and tokens of node 0 choose expert 0,
// tokens of node 1 expert 1, which static EP already serves without a transfer.
TEST(CobaltPolicy, CobaltKeepsTheLayoutWhenNoPlanMeetsTheCap) {
  const auto config = scenario_config(Topology(2, 4), 2, 1, 1, 1);
  auto policy = make_policy("cobalt", config);
  for (int step = 0; step < 6; ++step) {
    const auto b = scenario_batch(config, 1000, [](int t, std::vector<ExpertId>& ids) {
      const bool hot = t % 10 != 0;
      ids[0] = hot ? 0 : 1;
      return static_cast<RankId>(hot ? 0 : 2);
    });
    std::vector<RankId> exec(b.topk_ids.size());
    policy->run(step, 0, b.view(), exec);
  }
  EXPECT_EQ(policy->counters().num_global_plans, 0);
}

}  // namespace
}  // namespace cobalt::policy
