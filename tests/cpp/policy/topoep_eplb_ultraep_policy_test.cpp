// The `topoep`, `eplb` and `ultraep` policies through the Policy interface: each task assignment
// realises exactly what its planner decided (TopoEP quotas in index order, UltraEP per-source
// splits, vLLM's position-modulo rule over EPLB's log2phy), load-only replay gives the same loads
// and layouts as token replay, counters, and thread-count independence.
#include <gtest/gtest.h>

#include <map>
#include <tuple>

#include "cobalt/core/error.hpp"
#include "cobalt/eval/metrics.hpp"
#include "cobalt/plan/eplb.hpp"
#include "cobalt/plan/topoep_solver.hpp"
#include "cobalt/plan/ultraep_solver.hpp"
#include "cobalt/policy/policy.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::policy {
namespace {

PolicyConfig config_for(const Topology& topo, int experts, int top_k, int slots) {
  PolicyConfig c;
  c.topology = topo;
  c.num_experts = experts;
  c.top_k = top_k;
  c.num_layers = 1;
  c.slots_per_rank = slots;
  c.seed = 5;
  c.token_bytes = 100;  // cross-node replicas pay off from 2 * D * 100 > 4000: D > 20
  c.expert_param_bytes = 4000;
  return c;
}

std::vector<int64_t> demand_of(const RoutingBatch& batch) {
  std::vector<int64_t> d(static_cast<size_t>(batch.num_ranks()) * batch.num_experts(), 0);
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    for (ExpertId e : batch.experts_of(t)) {
      d[static_cast<size_t>(batch.source_of(t)) * batch.num_experts() + e] += 1;
    }
  }
  return d;
}

// (src, expert, exec rank) -> tasks.
std::map<std::tuple<RankId, ExpertId, RankId>, int64_t> realised(const RoutingBatch& batch,
                                                                 std::span<const RankId> exec) {
  std::map<std::tuple<RankId, ExpertId, RankId>, int64_t> out;
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    auto experts = batch.experts_of(t);
    for (int k = 0; k < batch.top_k(); ++k) {
      out[{batch.source_of(t), experts[k], exec[t * batch.top_k() + k]}] += 1;
    }
  }
  return out;
}

TEST(TopoEpPolicy, TasksFillTheSolverQuotasInIndexOrder) {
  const Topology topo(2, 8);
  const auto config = config_for(topo, 32, 4, 6);
  auto owned = testing::random_batch(41, 3000, 4, 32, 8, 2.0);
  const auto batch = owned.view();
  auto policy = make_policy("topoep", config);
  std::vector<RankId> exec(batch.num_tasks());
  auto layout = policy->run(0, 0, batch, exec);

  const auto demand = demand_of(batch);
  const auto plan = plan::solve_topoep(
      plan::TopoEpInput{topo, 32, 6, config.token_bytes, config.expert_param_bytes, demand});
  EXPECT_EQ(std::vector<ExpertId>(layout->slots().begin(), layout->slots().end()), plan.slots);
  std::map<std::tuple<RankId, ExpertId, RankId>, int64_t> want;
  for (RankId s = 0; s < 8; ++s) {
    for (int64_t i = plan.source_offsets[s]; i < plan.source_offsets[s + 1]; ++i) {
      want[{s, plan.quotas[i].expert, plan.quotas[i].dst}] = plan.quotas[i].count;
    }
  }
  EXPECT_EQ(realised(batch, exec), want);
  EXPECT_GT(plan.stats.num_inter_node_replicas + plan.stats.num_intra_node_replicas, 0);
  // Index order: the first task of every (src, expert) runs on its lowest quota rank.
  std::map<std::pair<RankId, ExpertId>, RankId> first_rank;
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    for (int k = 0; k < 4; ++k) {
      first_rank.try_emplace({batch.source_of(t), batch.experts_of(t)[k]}, exec[t * 4 + k]);
    }
  }
  for (const auto& [key, count] : want) {
    const auto [s, e, r] = key;
    EXPECT_LE(first_rank.at({s, e}), r);
  }
  EXPECT_EQ(policy->counters().max_solver_calls, 1);
}

TEST(UltraEpPolicy, TasksRealiseThePerSourceSplits) {
  const Topology topo(2, 8);
  const auto config = config_for(topo, 32, 4, 6);
  auto owned = testing::random_batch(42, 4000, 4, 32, 8, 2.0);
  const auto batch = owned.view();
  auto policy = make_policy("ultraep", config);
  std::vector<RankId> exec(batch.num_tasks());
  auto layout = policy->run(0, 0, batch, exec);

  const auto demand = demand_of(batch);
  plan::UltraEpInput in{topo, 32, 6, demand, {}};
  in.options.min_tokens_per_replica = std::max<int64_t>(1, batch.num_tasks() / 8 / 64);
  const auto plan = plan::solve_ultraep(in);
  EXPECT_EQ(std::vector<ExpertId>(layout->slots().begin(), layout->slots().end()), plan.slots);
  EXPECT_GT(plan.num_replicas, 0);
  std::map<std::tuple<RankId, ExpertId, RankId>, int64_t> want;
  for (RankId s = 0; s < 8; ++s) {
    for (ExpertId e = 0; e < 32; ++e) {
      const int64_t own = demand[s * 32 + e];
      if (own == 0) continue;
      const int64_t at = plan.alloc_index[s * 32 + e];
      const int begin = plan.instance_offsets[e], n = plan.instance_offsets[e + 1] - begin;
      if (at < 0) {
        want[{s, e, plan.instances[begin].rank}] = own;
        continue;
      }
      for (int j = 0; j < n; ++j) {
        if (plan.alloc[at + j] > 0)
          want[{s, e, plan.instances[begin + j].rank}] = plan.alloc[at + j];
      }
    }
  }
  EXPECT_EQ(realised(batch, exec), want);
  // Replicas stay in their master's node: no task crosses nodes beyond static EP's.
  const auto static_layout = ExpertLayout::static_ep(topo, 32, 6);
  std::vector<RankId> static_exec(batch.num_tasks());
  for (size_t i = 0; i < static_exec.size(); ++i) {
    static_exec[i] = static_layout.ranks_of(batch.topk_ids()[i])[0];
  }
  EXPECT_EQ(eval::cross_node_transfers(batch, exec, topo).no_dedup,
            eval::cross_node_transfers(batch, static_exec, topo).no_dedup);
}

TEST(EplbPolicy, ReplansFromEmaLoadsAndSplitsByPositionModulo) {
  const Topology topo(2, 8);
  auto config = config_for(topo, 16, 2, 3);
  config.steps_per_global_plan = 3;
  config.ema_decay = 0.5;
  auto policy = make_policy("eplb", config);
  std::vector<double> ema(16, 0.0);
  for (int step = 0; step < 5; ++step) {
    auto owned = testing::random_batch(60 + step, 2000, 2, 16, 8, 2.0);
    const auto batch = owned.view();
    std::vector<RankId> exec(batch.num_tasks());
    auto layout = policy->run(step, 0, batch, exec);
    if (step == 1 || step == 4) {  // plans due: first history at step 1, then every P = 3
      const auto r = plan::rebalance_experts(ema, 1, 16, 8 * 3, 1, 2, 8);
      // Layout: GPU g holds physical experts [3g, 3g + 3), duplicates merged.
      for (RankId g = 0; g < 8; ++g) {
        for (int p = 3 * g; p < 3 * g + 3; ++p) EXPECT_TRUE(layout->holds(g, r.phy2log_at(0, p)));
      }
      // vLLM: replica = (local flat position) mod logcnt, physical = log2phy[e][replica].
      std::vector<int64_t> local(8, 0);
      for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
        const int64_t base = local[batch.source_of(t)]++ * 2;
        for (int k = 0; k < 2; ++k) {
          const ExpertId e = batch.experts_of(t)[k];
          const int replica = static_cast<int>((base + k) % r.logcnt_at(0, e));
          ASSERT_EQ(exec[t * 2 + k], r.log2phy_at(0, e, replica) / 3) << "step " << step;
        }
      }
    }
    if (step == 0) {
      EXPECT_EQ(*layout, ExpertLayout::static_ep(topo, 16, 3));
    }
    // EMA of task counts (the first step initialises).
    std::vector<double> counts(16, 0.0);
    for (ExpertId e : batch.topk_ids()) counts[e] += 1;
    for (int e = 0; e < 16; ++e) ema[e] = step == 0 ? counts[e] : 0.5 * ema[e] + 0.5 * counts[e];
  }
  EXPECT_EQ(policy->counters().num_global_plans, 2);
}

// Load-only replay: the same layouts as token replay, and for the per-microbatch policies the same
// rank loads (EPLB's load-only split is even instead of by position, so only totals agree).
TEST(TopoEpEplbUltraEp, LoadOnlyReplayMatchesTokenReplay) {
  const Topology topo(2, 8);
  for (const char* name : {"topoep", "ultraep", "eplb"}) {
    auto config = config_for(topo, 32, 4, 6);
    config.steps_per_global_plan = 2;
    auto by_tokens = make_policy(name, config);
    auto by_loads = make_policy(name, config);
    EXPECT_FALSE(by_tokens->needs_token_ids());
    for (int step = 0; step < 4; ++step) {
      auto owned = testing::random_batch(80 + step, 2500, 4, 32, 8, 2.0);
      const auto batch = owned.view();
      std::vector<RankId> exec(batch.num_tasks());
      auto layout_tokens = by_tokens->run(step, 0, batch, exec);
      std::vector<int64_t> loads(8, 0);
      auto layout_loads = by_loads->run_loads(step, 0, demand_of(batch), loads);
      EXPECT_EQ(*layout_tokens, *layout_loads) << name << " step " << step;
      const auto token_loads = eval::rank_loads(exec, 8);
      if (std::string(name) != "eplb") {
        EXPECT_EQ(loads, token_loads) << name << " step " << step;
      } else {
        int64_t a = 0, b = 0;
        for (int r = 0; r < 8; ++r) a += loads[r], b += token_loads[r];
        EXPECT_EQ(a, b);
      }
    }
  }
}

TEST(TopoEpEplbUltraEp, IdenticalForOneAndEightThreadsAndReportSolverTime) {
  const Topology topo(4, 16);
  for (const char* name : {"topoep", "ultraep", "eplb"}) {
    std::vector<std::vector<RankId>> runs;
    for (int threads : {1, 8}) {
      auto config = config_for(topo, 64, 8, 6);
      config.num_threads = threads;
      auto policy = make_policy(name, config);
      std::vector<RankId> all;
      for (int step = 0; step < 3; ++step) {
        auto owned = testing::random_batch(90 + step, 3000, 8, 64, 16, 1.5);
        std::vector<RankId> exec(owned.topk_ids.size());
        policy->run(step, 0, owned.view(), exec);
        all.insert(all.end(), exec.begin(), exec.end());
      }
      if (std::string(name) != "eplb") {
        EXPECT_EQ(policy->counters().max_solver_calls, 3) << name;
        EXPECT_GT(policy->counters().planner_wall_ms, 0.0) << name;
      }
      runs.push_back(std::move(all));
    }
    EXPECT_EQ(runs[0], runs[1]) << name;
  }
}

// The per-batch policies' move counters: the replica copies each batch's layout needs from static
// EP, as diff() counts them (what the batch would have to fetch), summed over batches.
TEST(TopoEpUltraEp, MoveCountersAreEachBatchsCopiesFromStaticEp) {
  const Topology topo(2, 16);
  for (const char* name : {"topoep", "ultraep"}) {
    const auto config = config_for(topo, 32, 4, 4);
    auto policy = make_policy(name, config);
    const auto home = ExpertLayout::static_ep(topo, 32, 4);
    int64_t cross = 0, intra = 0;
    for (int step = 0; step < 3; ++step) {
      auto owned = testing::random_batch(60 + step, 3000, 4, 32, 16, 2.0);
      std::vector<RankId> exec(owned.topk_ids.size());
      const auto layout = policy->run(step, 0, owned.view(), exec);
      const LayoutDiff copies = diff(home, *layout);
      cross += copies.num_cross_node;
      intra += copies.num_intra_node;
    }
    EXPECT_GT(cross + intra, 0) << name << ": the skewed batches get replicas";
    EXPECT_EQ(policy->counters().cross_node_moves, cross) << name;
    EXPECT_EQ(policy->counters().intra_node_moves, intra) << name;
    EXPECT_EQ(policy->counters().num_global_plans, 0) << name;
  }
}

TEST(TopoEpEplbUltraEp, RejectMismatchedInputs) {
  const Topology topo(2, 8);
  for (const char* name : {"topoep", "ultraep", "eplb"}) {
    auto policy = make_policy(name, config_for(topo, 16, 2, 3));
    std::vector<int64_t> loads(8, 0);
    EXPECT_THROW(policy->run_loads(0, 0, std::vector<int64_t>(8 * 15, 1), loads), Error) << name;
    EXPECT_THROW(policy->run_loads(0, 1, std::vector<int64_t>(8 * 16, 1), loads), Error) << name;
  }
}

}  // namespace
}  // namespace cobalt::policy
