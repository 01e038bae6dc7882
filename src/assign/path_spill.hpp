// Internal: the second spill phase of the balanced assignment (assign/balanced_cover.hpp).
//
// After water-filling and the one-hop spill, the busiest rank can stay above the cap although the
// layout could balance it: every other holder of its experts is at the cap, but their experts have
// holders below it. This phase moves tasks along chains of holders (augmenting paths).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/routing_batch.hpp"

namespace cobalt::assign::detail {

// Lowers the maximum rank load of exec_rank [T, K] (a valid assignment on `layout`) towards `cap`.
//
// Repeatedly takes the most loaded rank r (ties: lowest id), load L > cap, and searches the graph
// "rank u -> rank v when u runs a movable task of an expert that v holds" for a target: a rank
// below `cap` if one is reachable, else one at or below L - 2. Among targets it takes the cheapest
// path (fewest edges that must add a cross-node copy of some token, i.e. move a task to a node its
// token does not reach yet; then fewest edges), then the least loaded target, then the lowest id,
// and moves delta tasks along every edge of the path, so only the two ends change load (delta: the
// smallest of r's excess over cap, or half the gap when levelling, the target's room and every
// edge's movable tasks). A free edge moves tasks whose token already reaches the destination node
// first. Stops when the busiest rank is at or below `cap` or has no path to a target.
//
// Guarantees: a valid assignment again (every task on a holder of its expert); loads [G] updated;
// no rank ends above max(cap, the busiest rank's load on entry); when it stops above `cap` because
// the busiest rank has no target, the ranks that rank reaches average more than L - 1 tasks and
// must keep them, so L is the optimum for this layout: the result's maximum load is
// max(cap, optimum) (tests check it against brute force). Deterministic.
//
// per_token, per_task: scratch the spill sizes to [T] and [T K] and overwrites (a caller's kept
// buffers, so that nothing is allocated per call; their contents on entry do not matter).
void spill_along_paths(const RoutingBatch& batch, const ExpertLayout& layout, int64_t cap,
                       std::vector<int64_t>& load, std::span<RankId> exec_rank,
                       std::vector<uint64_t>& per_token, std::vector<uint32_t>& per_task);
// The same with scratch of its own.
void spill_along_paths(const RoutingBatch& batch, const ExpertLayout& layout, int64_t cap,
                       std::vector<int64_t>& load, std::span<RankId> exec_rank);

// How the spill counts, per (replica, node), the tasks whose token reaches the node: by (replica,
// reach set) pairs summed after the pass (up to 8 nodes: a [replicas, 256] table), or node by node
// per task. kAuto takes the pairs when N <= 8 and the table is not much larger than the batch (a
// decode batch of a few hundred tasks would spend more on the table than it saves); the others
// force one way, for the tests that compare them (kByReachSet needs N <= 8).
enum class ReachCounting { kAuto, kPerTask, kByReachSet };

// How a move finds a replica's tasks whose token already reaches the destination node: kCursors
// resumes, per (replica, node), where its last search ended (the entries before it are known
// not to qualify; a cursor goes back to the start of its list whenever an entry could qualify
// again: the token of one of its tasks gains that node, or a task moves onto the replica); kPlain
// searches from the start of the list every time. The same tasks are found either way (the tests
// compare them); kPlain is the reference.
enum class SpillScan { kCursors, kPlain };

// spill_along_paths without its two shortcuts (nothing above the cap, spill_target_reachable):
// always builds the bookkeeping and runs. The same result; for tests of the shortcuts.
void spill_along_paths_unchecked(const RoutingBatch& batch, const ExpertLayout& layout, int64_t cap,
                                 std::vector<int64_t>& load, std::span<RankId> exec_rank,
                                 ReachCounting counting = ReachCounting::kAuto,
                                 SpillScan scan = SpillScan::kCursors);
void spill_along_paths_unchecked(const RoutingBatch& batch, const ExpertLayout& layout, int64_t cap,
                                 std::vector<int64_t>& load, std::span<RankId> exec_rank,
                                 std::vector<uint64_t>& per_token, std::vector<uint32_t>& per_task,
                                 ReachCounting counting = ReachCounting::kAuto,
                                 SpillScan scan = SpillScan::kCursors);

// The check spill_along_paths makes before its O(T K) bookkeeping: whether its first augmentation
// could find a target, judged on the layout alone. The graph "u -> v when u holds a replica of an
// expert v holds" contains the spill's graph (which also needs a task on u's replica), so when no
// rank reachable in it from the busiest rank (the lowest id on ties, as the spill picks) has load
// below `cap` or at most its load - 2, the spill would stop at once. load: [G].
bool spill_target_reachable(const ExpertLayout& layout, std::span<const int64_t> load, int64_t cap);

}  // namespace cobalt::assign::detail
