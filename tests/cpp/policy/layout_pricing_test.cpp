// price_layout and widen_slots: a hand-computed fixture, linearity in the step scale, and the
// slot-position contract of widen_slots.
#include "cobalt/policy/layout_pricing.hpp"

#include <gtest/gtest.h>

#include "cobalt/core/error.hpp"
#include "cobalt/eval/cost_model.hpp"
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

}  // namespace
}  // namespace cobalt::policy
