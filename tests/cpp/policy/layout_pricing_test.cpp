// price_layout, change_pays, some_change_may_pay and widen_slots: hand-computed fixtures,
// linearity in the step scale, the bound of some_change_may_pay over stage 2b's swaps on random
// instances, and the slot-position contract of widen_slots.
#include "cobalt/policy/layout_pricing.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "cobalt/core/error.hpp"
#include "cobalt/eval/cost_model.hpp"
#include "cobalt/plan/floor_swaps.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::policy {
namespace {

// 1 GB/s links, tokens of 2 bytes, experts of 3 parameters (6 bytes, 6 bytes of gradients), 1 ns
// of compute per task.
eval::CostParams tiny_params() {
  eval::CostParams p;
  p.nvlink_bytes_per_s = 1e9;
  p.ib_bytes_per_s_per_node = 1e9;
  p.hidden_size = 1;
  p.expert_ffn_size = 1;
  p.bytes_per_element = 2;
  p.achievable_flops = p.flops_per_task() * 1e9;
  return p;
}

TEST(LayoutPricing, HandComputedFixture) {
  // Two nodes of one rank; expert 0 on rank 0, expert 1 on rank 1 (its main); the candidate adds
  // a replica of expert 1 on rank 0.
  const Topology topo(2, 2);
  const ExpertLayout current(topo, 2, 2, {0, kEmptySlot, 1, kEmptySlot});
  const ExpertLayout candidate(topo, 2, 2, {0, 1, 1, kEmptySlot});
  const auto mains = eval::initial_main_ranks(current);
  ASSERT_EQ(mains, (std::vector<RankId>{0, 1}));
  // One token of rank 0 choosing both experts, both run on rank 0: no exchange, 2 tasks there.
  const std::vector<ExpertId> ids{0, 1};
  const std::vector<RankId> src{0};
  const auto sample = RoutingBatch::trusted(ids, src, 2, 2, 2);
  const std::vector<RankId> exec{0, 0};
  const auto p = price_layout(sample, exec, 1.0, current, mains, candidate, tiny_params(), 2);
  EXPECT_DOUBLE_EQ(p.layer_s, 2e-9);      // 2 tasks x 1 ns, no copies
  EXPECT_DOUBLE_EQ(p.grad_sync_s, 6e-9);  // 6 gradient bytes out, 6 parameter bytes back over IB
  EXPECT_DOUBLE_EQ(p.migration_s, 6e-9);  // the new replica's 6 parameter bytes; no main moves
  EXPECT_DOUBLE_EQ(p.per_step_s, 2e-9 + 6e-9 + 6e-9 / 2);
  // The layout in force costs no migration and, without replicas, no gradient sync.
  const std::vector<RankId> exec_current{0, 1};
  const auto q = price_layout(sample, exec_current, 1.0, current, mains, current, tiny_params(), 2);
  EXPECT_EQ(q.migration_s, 0.0);
  EXPECT_EQ(q.grad_sync_s, 0.0);
  // One task per rank (1 ns) and 4 exchanges of one 2-byte copy over IB (2 ns each).
  EXPECT_DOUBLE_EQ(q.layer_s, 1e-9 + 4 * 2e-9);
}

TEST(LayoutPricing, LayerTimeIsLinearInTheStepScale) {
  const Topology topo(2, 8);
  const auto layout = testing::random_layout(3, topo, 32, 6, 0.8);
  const auto b = testing::random_batch(5, 500, 4, 32, 8, 1.0);
  std::vector<RankId> exec(b.view().num_tasks());
  for (size_t i = 0; i < exec.size(); ++i) {
    const auto e = b.topk_ids[i];
    exec[i] = layout.ranks_of(e)[i % layout.ranks_of(e).size()];
  }
  const auto mains = eval::initial_main_ranks(layout);
  const auto one = price_layout(b.view(), exec, 1.0, layout, mains, layout, tiny_params(), 1);
  const auto three = price_layout(b.view(), exec, 3.0, layout, mains, layout, tiny_params(), 1);
  EXPECT_NEAR(three.layer_s, 3 * one.layer_s, 1e-15);
  EXPECT_EQ(three.grad_sync_s, one.grad_sync_s);  // per step, independent of the tokens
  EXPECT_GT(one.grad_sync_s, 0.0);                // the random layout has replicas
  EXPECT_THROW(price_layout(b.view(), exec, -1.0, layout, mains, layout, tiny_params(), 1), Error);
  EXPECT_THROW(price_layout(b.view(), exec, 1.0, layout, mains, layout, tiny_params(), 0), Error);
  // A sample of another shape is refused, not read out of range.
  const auto other = testing::random_batch(5, 10, 4, 32, 16, 1.0);
  std::vector<RankId> other_exec(other.view().num_tasks(), 0);
  EXPECT_THROW(price_layout(other.view(), other_exec, 1.0, layout, mains, layout, tiny_params(), 1),
               Error);
}

// Without replicas there is no gradient synchronisation to remove, so a change may pay only when
// the tasks it saves take longer than one parameter copy (6 bytes at 1 GB/s: 6 ns, 1 ns a task).
TEST(LayoutPricing, SomeChangeMayPayOnlyWhenTheSavedComputeOutlastsOneCopy) {
  const Topology topo(1, 2);
  const ExpertLayout layout(topo, 2, 2, {0, kEmptySlot, 1, kEmptySlot});
  const auto mains = eval::initial_main_ranks(layout);
  const auto params = tiny_params();
  EXPECT_FALSE(some_change_may_pay(layout, mains, 5, 1, params));
  EXPECT_TRUE(some_change_may_pay(layout, mains, 7, 1, params));
  EXPECT_TRUE(some_change_may_pay(layout, mains, 2, 4, params));  // 8 ns over 4 steps
  EXPECT_FALSE(some_change_may_pay(layout, mains, -3, 100, params));
  EXPECT_THROW(some_change_may_pay(layout, mains, 5, 0, params), Error);
  // A replica of expert 0 on rank 1 (same node as its main, rank 0) saving 7 tasks: 7 ns against
  // a 6 ns copy and the replica's gradient synchronisation.
  const ExpertLayout replicated(topo, 2, 2, {0, kEmptySlot, 1, 0});
  const double sync_s =
      eval::link_time(
          eval::grad_sync_bytes(replicated, eval::next_main_ranks(replicated, mains), params),
          params)
          .time_s();
  ASSERT_GT(sync_s, 0);
  const double per_task_s = 1e-9, copy_s = 6e-9;
  for (double saved : {1.0, 6.0, 7.0, 12.0, 40.0}) {
    EXPECT_EQ(change_pays(layout, mains, replicated, saved, 1, params),
              saved * per_task_s - sync_s > copy_s)
        << saved;
  }
  EXPECT_THROW(change_pays(layout, mains, replicated, 1, 0, params), Error);
  // Bad main ranks and non-finite savings are invalid arguments.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THROW(change_gain_s(layout, mains, replicated, nan, 1, params), Error);
  EXPECT_THROW(some_change_may_pay(layout, mains, nan, 1, params), Error);
  const std::vector<RankId> out_of_range{2, 1};
  EXPECT_THROW(change_gain_s(layout, out_of_range, replicated, 7, 1, params), Error);
  EXPECT_THROW(some_change_may_pay(replicated, out_of_range, 7, 1, params), Error);
  EXPECT_THROW(some_change_may_pay(replicated, std::vector<RankId>{}, 7, 1, params), Error);
}

// Stage 2b's use: whenever some_change_may_pay says no for the floor's distance to the whole-task
// bound, no prefix of the swaps that swap_toward_floor then makes pays either (priced cobalt+
// keeps the best-paying prefix, so skipping the search changes no decision). Random layouts (with
// replicas, so synchronisation can be removed), skewed counts, task costs from 1 ns down to 1 ps
// against parameter copies of 6 to 240 bytes.
TEST(LayoutPricing, SomeChangeMayPayBoundsTheSwapsOfStage2b) {
  int skipped = 0, paid = 0, checked = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    SplitMix64 rng(seed);
    const int num_nodes = 2 + static_cast<int>(rng.below(3));
    const Topology topo(num_nodes, num_nodes * (1 + static_cast<int>(rng.below(3))));
    const int num_experts = 2 * topo.num_ranks();
    const auto layout = testing::random_layout(seed, topo, num_experts, 3, 0.8);
    std::vector<int64_t> counts(num_experts);
    for (auto& c : counts) c = static_cast<int64_t>(rng.below(8));
    counts[rng.below(num_experts)] += 40 + static_cast<int64_t>(rng.below(200));
    auto params = tiny_params();
    params.expert_ffn_size = 1 + static_cast<int>(rng.below(40));
    params.achievable_flops = params.flops_per_task() * std::pow(10.0, 9 + rng.below(4));
    const auto mains = eval::initial_main_ranks(layout);
    const auto swapped = plan::swap_toward_floor(
        layout, counts, std::vector<double>(static_cast<size_t>(topo.num_nodes() * num_experts)),
        {0.05, 16, 64});
    if (swapped.swaps.empty()) continue;
    ++checked;
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    const int64_t lowest = (total + topo.num_ranks() - 1) / topo.num_ranks();
    const int64_t amortisation = 1 + static_cast<int64_t>(rng.below(3));
    const bool may = some_change_may_pay(
        layout, mains, static_cast<double>(swapped.floor_before - lowest), amortisation, params);
    // Every prefix, as keep_paying_prefix builds it (the last one is swapped.layout).
    bool pays = false;
    std::vector<ExpertId> slots(layout.slots().begin(), layout.slots().end());
    for (const auto& swap : swapped.swaps) {
      plan::apply_swap(swap, layout.slots_per_rank(), slots);
      const ExpertLayout prefix(topo, num_experts, layout.slots_per_rank(), slots);
      pays |= change_pays(layout, mains, prefix,
                          static_cast<double>(swapped.floor_before - swap.floor_after),
                          amortisation, params);
    }
    EXPECT_EQ(ExpertLayout(topo, num_experts, layout.slots_per_rank(), slots), swapped.layout);
    EXPECT_TRUE(may || !pays) << "seed " << seed;
    skipped += !may;
    paid += pays;
  }
  EXPECT_GT(checked, 100);
  EXPECT_GT(skipped, 5);  // the bound does skip searches (16 of 288 checked)
  EXPECT_GT(paid, 5);     // and the instances are not all hopeless (some prefix pays)
}

TEST(LayoutPricing, WidenSlotsKeepsPositions) {
  const Topology topo(2, 4);
  const ExpertLayout narrow(topo, 6, 2, {0, kEmptySlot, 1, 2, 3, kEmptySlot, 4, 5});
  const auto wide = widen_slots(narrow, 4);
  EXPECT_EQ(wide.slots_per_rank(), 4);
  EXPECT_EQ(
      std::vector<ExpertId>(wide.slots().begin(), wide.slots().end()),
      (std::vector<ExpertId>{0, kEmptySlot, kEmptySlot, kEmptySlot, 1, 2, kEmptySlot, kEmptySlot, 3,
                             kEmptySlot, kEmptySlot, kEmptySlot, 4, 5, kEmptySlot, kEmptySlot}));
  EXPECT_EQ(widen_slots(narrow, 2), narrow);
  EXPECT_THROW(widen_slots(narrow, 1), Error);
}

// some_change_may_pay is a cheap pre-check: it may never rule out a change that change_pays
// accepts (a saving worth 1.5 NVLink copies, one NVLink copy needed).
TEST(LayoutPricing, SomeChangeMayPayIsNeverStricterThanChangePays) {
  const Topology topo(1, 2);
  eval::CostParams p;
  p.grad_bytes_per_element = 0;
  p.param_refresh = false;
  p.optimizer_factor = 0;
  const auto current = ExpertLayout::from_rank_lists(topo, 2, 2, {{0}, {1}});
  const auto candidate = ExpertLayout::from_rank_lists(topo, 2, 2, {{0}, {1, 0}});
  const std::vector<RankId> mains{0, 1};
  const double nvlink_copy_s = p.expert_param_bytes() / p.nvlink_bytes_per_s;
  const double seconds_per_task = p.flops_per_task() / p.achievable_flops;
  const double saved = 1.5 * nvlink_copy_s / seconds_per_task;  // 1.5 NVLink copies of time
  ASSERT_TRUE(change_pays(current, mains, candidate, saved, 1, p));
  EXPECT_TRUE(some_change_may_pay(current, mains, saved, 1, p));
}

}  // namespace
}  // namespace cobalt::policy
