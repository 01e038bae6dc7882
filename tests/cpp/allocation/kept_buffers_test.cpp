// The per-step calls that promise to allocate nothing of the batch's size once their kept buffers
// have seen the largest batch: checked by counting every operator new of the process
// (counting_allocator.hpp) during a warm call.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "cobalt/assign/balanced_cover.hpp"
#include "cobalt/assign/dispatch_layout.hpp"
#include "cobalt/core/topology.hpp"
#include "counting_allocator.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt {
namespace {

using testing::AllocationTally;
using testing::CountAllocations;

TEST(CountAllocations, SeesTheAllocationsOfEveryThread) {
  AllocationTally tally;
  {
    CountAllocations count;
    std::vector<int64_t> here(1000);
    std::thread worker([] { std::vector<int64_t> there(500); });
    worker.join();
    tally = count.tally();
  }
  // The two vectors, and whatever starting the thread took.
  EXPECT_GE(tally.allocations, 2);
  EXPECT_GE(tally.bytes, 1500 * 8);
}

// What a warm call allocates, with the same inputs as the warming call.
template <typename Call>
AllocationTally warm_call_tally(Call&& call) {
  call();
  CountAllocations count;
  call();
  return count.tally();
}

struct BalancedShape {
  int num_nodes;
  int ranks_per_node;
  int num_experts;
  int num_threads;
};

class BalancedCoverAllocations : public ::testing::TestWithParam<BalancedShape> {};

// cobalt+ runs assign_balanced_cover every step with a kept workspace (balanced_cover.hpp): after
// the workspace has seen the largest batch, a call allocates a few small tables of the layout's
// size (the cover search's, the spill's reachability check) and, with more than one thread, the
// threads, the same for a batch of 2^10 tokens as for one of 2^15: nothing grows with the batch or
// with its classes (thousands of them, each of which allocated its own rank and quota lists
// before).
TEST_P(BalancedCoverAllocations, AWarmCallAllocatesNothingOfTheBatchSize) {
  const BalancedShape shape = GetParam();
  const Topology topo(shape.num_nodes, shape.num_nodes * shape.ranks_per_node);
  const auto layout = testing::random_layout(3, topo, shape.num_experts, 4, 0.8);
  assign::BalancedCoverWorkspace workspace;
  const assign::AssignOptions options{assign::CoverSearch::kAuto, shape.num_threads};
  std::vector<AllocationTally> tallies;
  for (const int64_t num_tokens : {int64_t{1} << 15, int64_t{1} << 10}) {
    const auto owned =
        testing::random_batch(7, num_tokens, 8, shape.num_experts, topo.num_ranks(), 1.5);
    const RoutingBatch batch = owned.view();
    std::vector<RankId> exec_rank(batch.num_tasks());
    // Tolerance 0: the skewed batch leaves ranks above the cap, so the spill runs too.
    tallies.push_back(warm_call_tally([&] {
      assign::assign_balanced_cover(batch, layout, {}, options, exec_rank, 0.0, &workspace);
    }));
  }
  const int64_t small_batch_bytes = (int64_t{1} << 10) * 8 * sizeof(RankId);
  for (const AllocationTally& tally : tallies) {
    EXPECT_LE(tally.allocations, 8 + 16 * shape.num_threads) << tally.bytes << " bytes";
    EXPECT_LT(tally.bytes, small_batch_bytes);
  }
  // With one thread exactly the same; with two, the small batch (one token chunk) starts none.
  if (shape.num_threads == 1) EXPECT_EQ(tallies[0].bytes, tallies[1].bytes);
}

INSTANTIATE_TEST_SUITE_P(Shapes, BalancedCoverAllocations,
                         ::testing::Values(BalancedShape{4, 8, 64,
                                                         1},  // classes in per-chunk key tables
                                           BalancedShape{4, 8, 64, 2},    // ... on two threads
                                           BalancedShape{12, 2, 48, 1},   // classes in hash indexes
                                           BalancedShape{12, 2, 48, 2}),  // ... on two threads
                         [](const auto& info) {
                           return std::to_string(info.param.num_nodes) + "Nodes" +
                                  std::to_string(info.param.num_threads) + "Threads";
                         });

// dispatch_layout into a kept DispatchLayout (dispatch_layout.hpp): only a few [G]- and [N]-sized
// tables per call once it has held the largest batch.
TEST(DispatchLayoutAllocations, AKeptLayoutAllocatesNothingOfTheBatchSize) {
  const Topology topo(4, 32);
  assign::DispatchLayout kept;
  std::vector<AllocationTally> tallies;
  for (const int64_t num_tokens : {int64_t{1} << 15, int64_t{1} << 10}) {
    const auto owned = testing::random_batch(5, num_tokens, 8, 128, topo.num_ranks(), 1.0);
    std::vector<RankId> exec_rank(owned.topk_ids.size());
    std::transform(owned.topk_ids.begin(), owned.topk_ids.end(), exec_rank.begin(),
                   [](ExpertId e) { return static_cast<RankId>(e % 32); });
    tallies.push_back(warm_call_tally(
        [&] { assign::dispatch_layout(exec_rank, owned.source_rank, 8, topo, kept); }));
  }
  for (const AllocationTally& tally : tallies) {
    EXPECT_LE(tally.allocations, 8);
    EXPECT_LT(tally.bytes, 64 * 1024);
  }
  EXPECT_EQ(tallies[0].bytes, tallies[1].bytes);
}

}  // namespace
}  // namespace cobalt
