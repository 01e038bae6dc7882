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

// Two micro-batches of one step (the same step twice, as under gradient accumulation): the second
// continues the step's token numbering, so its draws are those of tokens T1.. of the step, not a
// repeat of the first micro-batch's (which every call starting at token 0 gave).
TEST(CobaltPolicy, MicroBatchesOfAStepContinueItsTokenNumbering) {
  PolicyConfig config;
  config.topology = Topology(4, 16);
  config.num_experts = 32;
  config.top_k = 4;
  config.slots_per_rank = 3;
  config.seed = 11;
  auto policy = make_policy("cobalt", config);
  auto batch = testing::random_batch(5, 2000, 4, 32, 16, 1.0);
  std::vector<RankId> first(batch.topk_ids.size()), second(batch.topk_ids.size());
  policy->run(0, 0, batch.view(), first);
  const auto again = policy->run(0, 0, batch.view(), second);
  std::vector<RankId> expected(batch.topk_ids.size());
  assign::assign_node_cover(batch.view(), *again, {config.seed, 0, 0, 2000}, {}, expected);
  EXPECT_EQ(second, expected);
  EXPECT_NE(second, first);
  // A new step starts at token 0 again.
  std::vector<RankId> next(batch.topk_ids.size()), fresh(batch.topk_ids.size());
  const auto later = policy->run(1, 0, batch.view(), next);
  assign::assign_node_cover(batch.view(), *later, {config.seed, 1, 0, 0}, {}, fresh);
  EXPECT_EQ(next, fresh);
}

}  // namespace
}  // namespace cobalt::policy
