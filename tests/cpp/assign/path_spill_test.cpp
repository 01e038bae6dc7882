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

// A random valid assignment (any holder of each task's expert) and its rank loads.
void random_valid_assignment(const RoutingBatch& batch, const ExpertLayout& layout, SplitMix64& rng,
                             std::vector<RankId>& exec, std::vector<int64_t>& load) {
  exec.assign(batch.num_tasks(), 0);
  load.assign(layout.num_ranks(), 0);
  for (int64_t i = 0; i < batch.num_tasks(); ++i) {
    const auto holders = layout.ranks_of(batch.topk_ids()[i]);
    exec[i] = holders[rng.below(static_cast<uint32_t>(holders.size()))];
    ++load[exec[i]];
  }
}

// A random spill instance: up to max_nodes nodes of up to max_per_node ranks, up to max_slots
// slots, top-k up to max_top_k, 1 to max_tokens tokens drawn with `skew`, a random valid
// assignment and the cap at the mean load.
struct SpillInstance {
  ExpertLayout layout;
  testing::OwnedBatch owned;
  std::vector<RankId> exec;
  std::vector<int64_t> load;
  int64_t cap = 0;
};
SpillInstance random_spill_instance(uint64_t seed, SplitMix64& rng, int max_nodes, int max_per_node,
                                    int max_slots, int max_top_k, int max_tokens, double skew,
                                    uint64_t batch_seed) {
  const int nodes = 1 + static_cast<int>(rng.below(max_nodes)),
            per_node = 1 + static_cast<int>(rng.below(max_per_node));
  const Topology topo(nodes, nodes * per_node);
  const int slots = 1 + static_cast<int>(rng.below(max_slots));
  const int experts = 1 + static_cast<int>(rng.below(topo.num_ranks() * slots));
  SpillInstance in{testing::random_layout(seed, topo, experts, slots, rng.unit()), {}, {}, {}, 0};
  const int top_k = 1 + static_cast<int>(rng.below(std::min(experts, max_top_k)));
  in.owned = testing::random_batch(batch_seed, 1 + static_cast<int64_t>(rng.below(max_tokens)),
                                   top_k, experts, topo.num_ranks(), skew);
  random_valid_assignment(in.owned.view(), in.layout, rng, in.exec, in.load);
  in.cap = in.owned.view().num_tasks() / topo.num_ranks();
  return in;
}

// Everything a caller can keep across spills (as BalancedCoverWorkspace does).
struct KeptSpillBuffers {
  SpillScratch scratch;
  std::vector<uint64_t> per_token;
  std::vector<uint32_t> per_task;
};
struct SpillRun {
  ReachCounting counting = ReachCounting::kAuto;
  SpillScan scan = SpillScan::kCursors;
  KeptSpillBuffers* kept = nullptr;  // nullptr: the spill's own buffers
  int num_threads = 1;
};
// The assignment and loads after one spill of `in` (from copies of its own), run as described.
struct SpillResult {
  std::vector<RankId> exec;
  std::vector<int64_t> load;
  bool operator==(const SpillResult&) const = default;
};
SpillResult spill(const SpillInstance& in, const SpillRun& run) {
  SpillResult r{in.exec, in.load};
  if (run.kept != nullptr) {
    spill_along_paths_unchecked(in.owned.view(), in.layout, in.cap, r.load, r.exec,
                                run.kept->per_token, run.kept->per_task, run.counting, run.scan,
                                &run.kept->scratch, run.num_threads);
  } else {
    spill_along_paths_unchecked(in.owned.view(), in.layout, in.cap, r.load, r.exec, run.counting,
                                run.scan);
  }
  return r;
}

// 3 nodes x 1 rank: expert 0 on ranks 0 and 1, expert 1 on ranks 1 and 2, expert 2 on rank 2.
ExpertLayout chain_layout() { return ExpertLayout(Topology(3, 3), 3, 2, {0, -1, 0, 1, 1, 2}); }

TEST(PathSpill, TargetFoundAlongAChainOfHolders) {
  const ExpertLayout layout = chain_layout();
  // Rank 0 busiest; rank 1 (its only neighbour) is no target (not below the cap, one task
  // lighter), rank 2 is, two hops away: 0 -(expert 0)-> 1 -(expert 1)-> 2.
  EXPECT_TRUE(spill_target_reachable(layout, std::vector<int64_t>{6, 5, 0}, 3));
  // No rank below the cap, but rank 2 is two tasks lighter than the busiest.
  EXPECT_TRUE(spill_target_reachable(layout, std::vector<int64_t>{6, 6, 4}, 3));
  // Every reachable rank within one task of the busiest and at or above the cap: nothing to do.
  EXPECT_FALSE(spill_target_reachable(layout, std::vector<int64_t>{6, 5, 5}, 3));
}

TEST(PathSpill, NoTargetOutsideTheBusiestRanksComponent) {
  // 2 nodes x 2 ranks; rank 0 holds only expert 0, which nobody else holds: rank 0 reaches no one.
  const ExpertLayout isolated(Topology(2, 4), 4, 1, {0, 1, 2, 3});
  EXPECT_FALSE(spill_target_reachable(isolated, std::vector<int64_t>{9, 0, 0, 0}, 3));
  // Ties pick the lowest busiest rank, as the spill does. Here rank 0 (expert 0, also on rank 2)
  // reaches a target and rank 1 (expert 1 alone) does not; a highest-id rule would say no.
  const ExpertLayout tied(Topology(2, 4), 4, 2, {0, -1, 1, -1, 0, 2, 3, -1});
  EXPECT_TRUE(spill_target_reachable(tied, std::vector<int64_t>{9, 9, 0, 0}, 3));
  EXPECT_FALSE(spill_target_reachable(tied, std::vector<int64_t>{8, 9, 0, 0}, 3));
}

// The shortcut is exact: on random instances the spill with it and without it (always building
// its bookkeeping) give the same assignment and loads; where the check says no, brute force
// agrees that the busiest rank's load is already the best any assignment on the layout reaches
// (the spill's contract for stopping above the cap).
TEST(PathSpill, ShortcutGivesTheSameResultAsTheFullSpill) {
  int num_without_target = 0, num_with_target = 0;
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    SplitMix64 rng(seed);
    const Topology topo(2, 4);
    auto layout = testing::random_layout(seed, topo, 6, 2, rng.unit());
    auto owned = testing::random_batch(seed * 5, 30, 2, 6, topo.num_ranks(), 1.5);
    auto batch = owned.view();
    std::vector<RankId> exec;
    std::vector<int64_t> load;
    random_valid_assignment(batch, layout, rng, exec, load);
    const int64_t cap = batch.num_tasks() / topo.num_ranks();
    const int64_t busiest = *std::max_element(load.begin(), load.end());
    if (busiest <= cap) continue;
    const bool reachable = spill_target_reachable(layout, load, cap);
    (reachable ? num_with_target : num_without_target) += 1;
    if (!reachable) {
      EXPECT_EQ(busiest, testing::optimal_max_load(batch, layout)) << "seed " << seed;
    }
    auto shortcut_exec = exec, full_exec = exec;
    auto shortcut_load = load, full_load = load;
    spill_along_paths(batch, layout, cap, shortcut_load, shortcut_exec);
    spill_along_paths_unchecked(batch, layout, cap, full_load, full_exec);
    EXPECT_EQ(shortcut_exec, full_exec) << "seed " << seed;
    EXPECT_EQ(shortcut_load, full_load) << "seed " << seed;
    if (!reachable) {
      EXPECT_EQ(full_exec, exec) << "seed " << seed;  // the full spill moved nothing either
    }
  }
  EXPECT_GT(num_without_target, 0);  // the sample reaches both sides
  EXPECT_GT(num_with_target, 0);
}

// The two ways of counting the tasks whose token reaches each node (by reach-set pairs up to 8
// nodes, per task otherwise) drive the same spill: same assignment and loads on random instances
// of 1 to 8 nodes (more nodes only have the per-task way).
TEST(PathSpill, ReachCountingByPairsMatchesPerTask) {
  int num_moved = 0;
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    SplitMix64 rng(seed * 31);
    const SpillInstance in = random_spill_instance(seed, rng, 8, 3, 3, 4, 200, 1.5, seed * 5);
    const SpillResult by_pairs = spill(in, {ReachCounting::kByReachSet});
    EXPECT_TRUE(spill(in, {ReachCounting::kPerTask}) == by_pairs) << "seed " << seed;
    num_moved += by_pairs.exec != in.exec;
  }
  EXPECT_GT(num_moved, 50);  // the spill had work to do on many of them
}

// The cursors that resume each free search (SpillScan::kCursors) find the same tasks as searching
// from the start every time (kPlain): same assignment and loads on random instances of 1 to 12
// nodes, counting reach by pairs (up to 8 nodes) and per task, with batches of up to 1500 tokens
// and caps at the mean, so that many augmentations pass through the same replicas. (A free search
// that missed a task would also trip the spill's own check that the free pass found them all.)
TEST(PathSpill, CursorsFindTheSameTasksAsPlainSearches) {
  int num_moved = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    SplitMix64 rng(seed * 77);
    const SpillInstance in =
        random_spill_instance(seed, rng, seed % 3 == 0 ? 12 : 8, 4, 4, 6, 1500, 2.0, seed * 3);
    const auto pairs =
        in.layout.num_nodes() <= 8 ? ReachCounting::kByReachSet : ReachCounting::kPerTask;
    for (auto counting : {pairs, ReachCounting::kPerTask}) {
      const SpillResult plain = spill(in, {counting, SpillScan::kPlain});
      ASSERT_TRUE(spill(in, {counting, SpillScan::kCursors}) == plain) << "seed " << seed;
      num_moved += plain.exec != in.exec;
    }
  }
  EXPECT_GT(num_moved, 200);
}

// A SpillScratch kept across runs (as BalancedCoverWorkspace keeps it) changes nothing: one
// scratch and one pair of [T] / [T K] buffers reused over instances whose replica count, rank
// count, node count, counting and scan change from run to run give what runs with their own give.
TEST(PathSpill, KeptScratchGivesTheSameResult) {
  KeptSpillBuffers kept;
  int num_moved = 0;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    SplitMix64 rng(seed * 131);
    const SpillInstance in =
        random_spill_instance(seed, rng, seed % 3 == 0 ? 12 : 8, 4, 4, 6, 1500, 2.0, seed * 5);
    const auto counting = in.layout.num_nodes() <= 8 && seed % 2 == 0 ? ReachCounting::kByReachSet
                                                                      : ReachCounting::kPerTask;
    const auto scan = seed % 5 == 0 ? SpillScan::kPlain : SpillScan::kCursors;
    const SpillResult own = spill(in, {counting, scan});
    ASSERT_TRUE(spill(in, {counting, scan, &kept}) == own) << "seed " << seed;
    num_moved += own.exec != in.exec;
  }
  EXPECT_GT(num_moved, 40);  // 55 of the 150 instances move tasks
  EXPECT_GT(kept.scratch.capacity_bytes(), 0u);
}

// The bookkeeping built over token chunks on several threads (batches of at least two chunks of
// 4096 tokens) is the serial one: same assignment and loads for 1 to 4 threads, for both ways of
// counting reach and both scans, on random instances of up to 30000 tokens (one kept scratch, so
// the chunk tallies of a run with more chunks are also reused by one with fewer).
TEST(PathSpill, SameResultForAnyThreadCount) {
  KeptSpillBuffers kept;
  int num_chunked = 0, num_moved = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    SplitMix64 rng(seed * 389);
    const SpillInstance in =
        random_spill_instance(seed, rng, seed % 3 == 0 ? 12 : 6, 4, 4, 6, 30000, 2.0, seed * 7);
    num_chunked += in.owned.view().num_tokens() >= 2 * 4096;
    const auto pairs =
        in.layout.num_nodes() <= 8 ? ReachCounting::kByReachSet : ReachCounting::kPerTask;
    for (auto counting : {pairs, ReachCounting::kPerTask}) {
      const auto scan = seed % 2 ? SpillScan::kCursors : SpillScan::kPlain;
      const SpillResult serial = spill(in, {counting, scan});
      num_moved += serial.exec != in.exec;
      for (int threads : {4, 2, 3}) {
        ASSERT_TRUE(spill(in, {counting, scan, &kept, threads}) == serial)
            << "seed " << seed << ", " << threads << " threads";
      }
    }
  }
  EXPECT_GT(num_chunked, 8);  // 13 of the 16 instances
  EXPECT_GT(num_moved, 8);    // 14 of the 32 runs
}

// Reach-set counting (by pairs of reach sets) against per-task counting where tokens reach all
// 8 nodes (top-k 7 or 8 on 8 nodes: reach sets up to 0xff, which the other tests, at K <= 4,
// never build).
TEST(PathSpill, ReachSetCountingEqualsPerTaskWhenTokensReachAllEightNodes) {
  int full_reach = 0;
  for (uint64_t seed = 1; seed <= 60; ++seed) {
    SplitMix64 rng(seed * 131);
    const int per_node = 1 + static_cast<int>(rng.below(2));
    const Topology topo(8, 8 * per_node);
    const int slots = 2;
    const int experts = 8 + static_cast<int>(rng.below(topo.num_ranks() * slots - 8));
    const auto layout = testing::random_layout(seed, topo, experts, slots, rng.unit());
    const int top_k = 7 + static_cast<int>(rng.below(2));
    auto owned = testing::random_batch(seed * 3, 1 + static_cast<int64_t>(rng.below(300)), top_k,
                                       experts, topo.num_ranks(), 1.2);
    const auto batch = owned.view();
    std::vector<RankId> exec(batch.num_tasks());
    std::vector<int64_t> load(topo.num_ranks(), 0);
    for (int64_t i = 0; i < batch.num_tasks(); ++i) {
      const auto holders = layout.ranks_of(batch.topk_ids()[i]);
      exec[i] = holders[rng.below(static_cast<uint32_t>(holders.size()))];
      ++load[exec[i]];
    }
    for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
      uint64_t reach = uint64_t{1} << topo.node_of(batch.source_of(t));
      for (int k = 0; k < top_k; ++k) reach |= uint64_t{1} << topo.node_of(exec[t * top_k + k]);
      full_reach += reach == 0xff;
    }
    const int64_t cap = batch.num_tasks() / topo.num_ranks();
    auto exec_a = exec, exec_b = exec;
    auto load_a = load, load_b = load;
    spill_along_paths_unchecked(batch, layout, cap, load_a, exec_a, ReachCounting::kByReachSet,
                                SpillScan::kCursors);
    spill_along_paths_unchecked(batch, layout, cap, load_b, exec_b, ReachCounting::kPerTask,
                                SpillScan::kCursors);
    ASSERT_EQ(exec_a, exec_b) << "seed " << seed;
    ASSERT_EQ(load_a, load_b) << "seed " << seed;
  }
  EXPECT_GT(full_reach, 100);
}

}  // namespace
}  // namespace cobalt::assign::detail
