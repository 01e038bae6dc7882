// The chain spill's precheck (src/assign/path_spill.hpp): whether any augmentation could find a
// target, judged on the layout alone, by hand and against brute force.
#include "assign/path_spill.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/rng.hpp"
#include "testing/optimal_max_load.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::assign::detail {
namespace {

// 3 nodes x 1 rank: expert 0 on ranks 0 and 1, expert 1 on ranks 1 and 2, expert 2 on rank 2.
ExpertLayout chain_layout() { return ExpertLayout(Topology(3, 3), 3, 2, {0, -1, 0, 1, 1, 2}); }

TEST(PathSpill, TargetFoundAlongAChainOfHolders) {
  const ExpertLayout layout = chain_layout();
  // Rank 0 busiest; rank 2 is two hops away (0 -(expert 0)-> 1 -(expert 1)-> 2) and below the cap.
  EXPECT_TRUE(spill_target_reachable(layout, std::vector<int64_t>{6, 3, 0}, 3));
  // No rank below the cap, but rank 2 is at least two tasks lighter than the busiest.
  EXPECT_TRUE(spill_target_reachable(layout, std::vector<int64_t>{6, 6, 4}, 3));
  // Every reachable rank within one task of the busiest and at or above the cap: nothing to do.
  EXPECT_FALSE(spill_target_reachable(layout, std::vector<int64_t>{6, 5, 5}, 3));
}

TEST(PathSpill, NoTargetOutsideTheBusiestRanksComponent) {
  // 2 nodes x 2 ranks; rank 0 holds only expert 0, which nobody else holds: rank 0 reaches no one.
  const ExpertLayout layout(Topology(2, 4), 4, 1, {0, 1, 2, 3});
  EXPECT_FALSE(spill_target_reachable(layout, std::vector<int64_t>{9, 0, 0, 0}, 3));
  // Ties pick the lowest busiest rank, as the spill does: rank 0 again.
  EXPECT_FALSE(spill_target_reachable(layout, std::vector<int64_t>{9, 9, 0, 0}, 3));
}

// Where the check says no, skipping the spill is right: the spill's contract says it stops above
// the cap only when the busiest rank's load is already the best any assignment on the layout
// reaches, and brute force agrees on every such random instance. (Where it says yes, the balanced
// cover's brute-force tests check the spill's result.)
TEST(PathSpill, NoTargetMeansTheBusiestRankIsAlreadyOptimal) {
  int num_without_target = 0;
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    SplitMix64 rng(seed);
    const Topology topo(2, 4);
    auto layout = testing::random_layout(seed, topo, 6, 2, rng.unit());
    auto owned = testing::random_batch(seed * 5, 30, 2, 6, topo.num_ranks(), 1.5);
    auto batch = owned.view();
    // A random valid assignment (any holder of each task's expert) and its loads.
    std::vector<RankId> exec(batch.num_tasks());
    std::vector<int64_t> load(topo.num_ranks(), 0);
    for (int64_t i = 0; i < batch.num_tasks(); ++i) {
      const auto holders = layout.ranks_of(batch.topk_ids()[i]);
      exec[i] = holders[rng.below(static_cast<uint32_t>(holders.size()))];
      ++load[exec[i]];
    }
    const int64_t cap = batch.num_tasks() / topo.num_ranks();
    const int64_t busiest = *std::max_element(load.begin(), load.end());
    if (busiest <= cap || spill_target_reachable(layout, load, cap)) continue;
    ++num_without_target;
    EXPECT_EQ(busiest, testing::optimal_max_load(batch, layout)) << "seed " << seed;
    // And the spill indeed leaves everything as it was.
    const auto exec_before = exec;
    spill_along_paths(batch, layout, cap, load, exec);
    EXPECT_EQ(exec, exec_before) << "seed " << seed;
  }
  EXPECT_GT(num_without_target, 0);  // the sample reaches the "no target" side
}

}  // namespace
}  // namespace cobalt::assign::detail
