// The `cobalt` policy (src/policy/cobalt_policy.cpp): its global plan keeps to the (1 + eps) load
// cap of Eq. (3) (a layout in force that the loads have pushed over the cap is replaced by a
// restart within it, even when it has fewer cross-node transfers: it won on transfers alone
// before, and stayed for good), and micro-batches of one step draw with distinct token keys.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cobalt/assign/node_cover.hpp"
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

}  // namespace
}  // namespace cobalt::policy
