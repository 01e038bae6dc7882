// The specific rule of each load-based peer policy (SmartMoE, FasterMoE, FlexMoE, LAER-MoE),
// checked through the Policy interface on small hand-made batches.
#include <gtest/gtest.h>

#include "cobalt/core/error.hpp"
#include "cobalt/eval/metrics.hpp"
#include "cobalt/plan/replica_routing.hpp"
#include "cobalt/policy/policy.hpp"
#include "policy/peer_policy_base.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::policy {
namespace {

PolicyConfig base_config(const Topology& topo, int experts, int top_k, int slots) {
  PolicyConfig c;
  c.topology = topo;
  c.num_experts = experts;
  c.top_k = top_k;
  c.num_layers = 1;
  c.slots_per_rank = slots;
  c.seed = 3;
  return c;
}

// A top-1 batch: `tokens_of[e]` tokens choose expert e, sources round-robin over the ranks.
testing::OwnedBatch top1_batch(const std::vector<int>& tokens_of, int num_ranks) {
  testing::OwnedBatch b;
  b.top_k = 1;
  b.num_experts = static_cast<int>(tokens_of.size());
  b.num_ranks = num_ranks;
  for (ExpertId e = 0; e < b.num_experts; ++e) {
    for (int i = 0; i < tokens_of[e]; ++i) {
      b.topk_ids.push_back(e);
      b.source_rank.push_back(static_cast<RankId>(b.source_rank.size() % num_ranks));
    }
  }
  return b;
}

// A skewed random batch whose hot experts move with the step.
testing::OwnedBatch drifting_batch(int step, int64_t tokens, int top_k, int experts, int ranks) {
  auto b = testing::random_batch(100 + step, tokens, top_k, experts, ranks, 2.0);
  for (auto& e : b.topk_ids) e = (e + 5 * step) % experts;
  return b;
}

// A peer that proposes, at step s, the layout `proposals[s]`.
class ScriptedPeer final : public LoadBasedPeerPolicy {
 public:
  ScriptedPeer(const PolicyConfig& config, std::vector<ExpertLayout> proposals)
      : LoadBasedPeerPolicy(config, plan::ReplicaScope::kSourceRankFirst, Decides::kPerStep),
        proposals_(std::move(proposals)) {}
  std::string name() const override { return "scripted"; }

 private:
  std::shared_ptr<const ExpertLayout> decide(int64_t step, int layer,
                                             std::span<const int64_t>) override {
    return install(layer, proposals_.at(step));
  }
  std::vector<ExpertLayout> proposals_;
};

// The same replicas in another slot order are no re-layout: the layout in force stays (the same
// object) and nothing is counted; a real change is counted once with its copies.
TEST(LoadBasedPeerPolicy, ASlotReorderIsNoRelayout) {
  const Topology topo(2, 4);
  const auto config = base_config(topo, 4, 1, 2);
  // Static EP on 4 ranks with 2 slots: expert r on rank r, one free slot each.
  const auto with_extra = [&](std::vector<std::vector<ExpertId>> lists) {
    return ExpertLayout::from_rank_lists(topo, 4, 2, lists);
  };
  const ExpertLayout a = with_extra({{0, 1}, {1}, {2}, {3}});
  const ExpertLayout a_reordered = with_extra({{1, 0}, {1}, {2}, {3}});
  const ExpertLayout b = with_extra({{0}, {1}, {2}, {3, 0}});
  ASSERT_FALSE(a == a_reordered);
  ScriptedPeer policy(config, {a, a_reordered, b});
  const auto batch = top1_batch({4, 4, 4, 4}, 4);
  std::vector<RankId> exec(batch.topk_ids.size());
  // do_run: Policy::run's shape check is set up by make_policy only.
  const auto first = policy.do_run(0, 0, batch.view(), exec);
  const auto second = policy.do_run(1, 0, batch.view(), exec);
  EXPECT_EQ(first.get(), second.get());
  EXPECT_TRUE(*second == a);
  EXPECT_EQ(policy.counters().num_global_plans, 1);
  EXPECT_EQ(policy.counters().intra_node_moves, 1);  // expert 1 onto rank 0, from rank 1
  const auto third = policy.do_run(2, 0, batch.view(), exec);
  EXPECT_TRUE(*third == b);
  EXPECT_EQ(policy.counters().num_global_plans, 2);
  EXPECT_EQ(policy.counters().cross_node_moves, 1);  // expert 0 onto rank 3, from node 0
}

TEST(SmartMoePolicy, RePlacesOnlyEveryPSteps) {
  auto config = base_config(Topology(2, 16), 32, 4, 3);
  config.steps_per_global_plan = 3;
  auto policy = make_policy("smartmoe", config);
  std::vector<ExpertId> previous;
  std::vector<int> change_steps;
  for (int s = 0; s < 10; ++s) {
    auto owned = drifting_batch(s, 4000, 4, 32, 16);
    std::vector<RankId> exec(owned.topk_ids.size());
    auto layout = policy->run(s, 0, owned.view(), exec);
    std::vector<ExpertId> slots(layout->slots().begin(), layout->slots().end());
    if (s > 0 && slots != previous) change_steps.push_back(s);
    previous = slots;
  }
  // Plans are due at steps 1, 4, 7 (first as soon as history exists, then every P = 3).
  ASSERT_FALSE(change_steps.empty());
  EXPECT_EQ(change_steps.front(), 1);
  for (int s : change_steps) EXPECT_EQ((s - 1) % 3, 0) << "layout changed at step " << s;
  EXPECT_GE(change_steps.size(), 2u);
  EXPECT_EQ(policy->counters().num_global_plans, static_cast<int64_t>(change_steps.size()));
}

TEST(FasterMoePolicy, ShadowsExactlyWhenItsCostModelSaysSo) {
  // 1 node x 4 ranks, IB 400 GB/s per node -> 100 GB/s per GPU. token 1e4 B, expert 1e7 B:
  // feat = 1e-7 s, model = 1e-4 s, comp = 2 * (1e7 / 2) FLOPs / 4e14 FLOP/s = 2.5e-8 s.
  // Shadow the hottest iff (3 comp + 4 feat) * (B_0 - B_1) > model, i.e. gap > 210.5 tokens.
  auto config = base_config(Topology(1, 4), 8, 1, 3);
  config.token_bytes = 1e4;
  config.expert_param_bytes = 1e7;
  const double threshold = 1e-4 / (3 * 2.5e-8 + 4 * 1e-7);
  ASSERT_NEAR(threshold, 210.5, 0.1);
  auto policy = make_policy("fastermoe", config);

  auto above = top1_batch({100 + 211, 100, 10, 10, 10, 10, 10, 10}, 4);
  std::vector<RankId> exec(above.topk_ids.size());
  auto layout = policy->run(0, 0, above.view(), exec);
  EXPECT_EQ(layout->num_replicas_of(0), 4) << "gap 211 > 210.5: expert 0 shadowed everywhere";
  EXPECT_EQ(layout->num_replicas_of(1), 1);
  for (size_t i = 0; i < exec.size(); ++i) {
    if (above.topk_ids[i] == 0) EXPECT_EQ(exec[i], above.source_rank[i]);
  }

  auto below = top1_batch({100 + 210, 100, 10, 10, 10, 10, 10, 10}, 4);
  exec.assign(below.topk_ids.size(), -1);
  layout = policy->run(1, 0, below.view(), exec);
  EXPECT_EQ(layout->num_replicas_of(0), 1) << "gap 210 < 210.5: no shadow";
  EXPECT_EQ(*layout, ExpertLayout::static_ep(Topology(1, 4), 8, 3));
  EXPECT_EQ(policy->counters().max_solver_calls, 2);

  // The model reads the configured GPU: at 4e13 FLOP/s comp = 2.5e-7 s and the threshold is
  // 1e-4 / (7.5e-7 + 4e-7) = 87 tokens, so the gap of 210 is now worth a shadow.
  config.gemm_flops_per_s = 4e13;
  auto slower_gpu = make_policy("fastermoe", config);
  EXPECT_EQ(slower_gpu->run(0, 0, below.view(), exec)->num_replicas_of(0), 4);
  config.gemm_flops_per_s = 0;
  EXPECT_THROW(make_policy("fastermoe", config), Error);
}

TEST(FlexMoePolicy, ExpandsTheOverloadedExpertWhileImbalanced) {
  auto config = base_config(Topology(1, 4), 8, 1, 4);
  auto hot = top1_batch({400, 20, 20, 20, 20, 20, 20, 20}, 4);
  std::vector<RankId> exec(hot.topk_ids.size());
  auto policy = make_policy("flexmoe", config);
  EXPECT_EQ(policy->run(0, 0, hot.view(), exec)->num_replicas_of(0), 1);  // no history yet
  auto after = policy->run(1, 0, hot.view(), exec);
  EXPECT_GT(after->num_replicas_of(0), 1);
  EXPECT_LT(eval::imbalance(eval::rank_loads(exec, 4)), 2.0);

  config.eps = 100;  // threshold 101: never imbalanced enough to act
  auto lenient = make_policy("flexmoe", config);
  lenient->run(0, 0, hot.view(), exec);
  EXPECT_EQ(lenient->run(1, 0, hot.view(), exec)->num_replicas_of(0), 1);
}

TEST(LaerPolicy, RoutesSameNodeFirst) {
  // 2 nodes x 8 ranks, 16 experts, 3 slots: 48 slots >= 2 x 16, so every expert gets a replica on
  // each node and, from the first re-layout on, no task leaves its node.
  const Topology topo(2, 16);
  auto policy = make_policy("laer", base_config(topo, 16, 2, 3));
  for (int s = 0; s < 4; ++s) {
    auto owned = drifting_batch(s, 3000, 2, 16, 16);
    const auto batch = owned.view();
    std::vector<RankId> exec(batch.num_tasks());
    auto layout = policy->run(s, 0, batch, exec);
    if (s == 0) continue;  // static EP before any history
    for (ExpertId e = 0; e < 16; ++e) {
      EXPECT_FALSE(layout->ranks_of(e, 0).empty());
      EXPECT_FALSE(layout->ranks_of(e, 1).empty());
    }
    EXPECT_EQ(eval::cross_node_transfers(batch, exec, topo).no_dedup, 0) << "step " << s;
  }
}

TEST(PeerPolicies, LoadOnlyReplayMatchesTokenReplay) {
  const Topology topo(2, 8);
  for (const char* name : {"smartmoe", "fastermoe", "flexmoe", "laer"}) {
    auto config = base_config(topo, 24, 4, slots_for_rho(24, 8, 0.5));
    config.steps_per_global_plan = 2;
    auto tokens = make_policy(name, config);
    auto loads_only = make_policy(name, config);
    EXPECT_FALSE(tokens->needs_token_ids()) << name;
    for (int s = 0; s < 6; ++s) {
      auto owned = drifting_batch(s, 2500, 4, 24, 8);
      const auto batch = owned.view();
      std::vector<RankId> exec(batch.num_tasks());
      auto a = tokens->run(s, 0, batch, exec);
      const auto counts = plan::count_demand(batch);
      std::vector<int64_t> rank_loads(8);
      auto b = loads_only->run_loads(s, 0, counts, rank_loads);
      EXPECT_EQ(*a, *b) << name << " step " << s;
      EXPECT_EQ(eval::rank_loads(exec, 8), rank_loads) << name << " step " << s;
    }
  }
}

// A demand window of capacity 2 holds the last two steps only.
TEST(DemandWindow, DemandWindowKeepsCapacitySteps) {
  DemandWindow window(2);
  for (int64_t step = 0; step < 4; ++step) {
    const std::vector<int64_t> counts{step + 1, 0};
    window.push(step, counts);
  }
  EXPECT_EQ(window.size(), 2);
  EXPECT_DOUBLE_EQ(window.sum()[0], 3.0 + 4.0);
  EXPECT_DOUBLE_EQ(window.mean()[0], 3.5);
}

}  // namespace
}  // namespace cobalt::policy
