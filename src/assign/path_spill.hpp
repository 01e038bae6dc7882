// Internal: the second spill phase of the balanced assignment (assign/balanced_cover.hpp).
//
// After water-filling and the one-hop spill, the busiest rank can stay above the cap although the
// layout could balance it: every other holder of its experts is at the cap, but their experts have
// holders below it. This phase moves tasks along chains of holders (augmenting paths).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/routing_batch.hpp"

namespace cobalt::assign::detail {

// Where a replica's search for tasks free towards one node resumes (SpillScan::kCursors): a
// position in its original task list and, once that list is exhausted, an index into the tasks
// moved onto it.
struct SpillCursor {
  int64_t list = 0;
  size_t moved_in = 0;
};

// The spill's bookkeeping apart from its [T] and [T K] buffers: per replica, per rank and per
// augmentation. A caller running the spill every step keeps one (BalancedCoverWorkspace does), so
// that a spill allocates and page-faults nothing once it has seen its largest batch and layout;
// every run resizes and overwrites what it uses (contents on entry do not matter), so buffers only
// grow. Not for concurrent runs.
struct SpillScratch {
  std::vector<RankId> rep_rank;                 // [reps]
  std::vector<ExpertId> rep_expert;             // [reps]
  std::vector<std::vector<int>> reps_of_rank;   // [G] reps on each rank, ascending
  std::vector<int32_t> rep_index;               // [E, G] replica of (expert, rank), -1 if none
  std::vector<int> node_of_rank;                // [G]
  std::vector<int64_t> offsets;                 // [reps + 1] into the task lists
  std::vector<int64_t> scan_begin;              // [reps] first possibly live entry
  std::vector<std::vector<uint32_t>> moved_in;  // [reps] tasks moved onto each replica
  std::vector<int64_t> count;                   // [reps] live tasks
  std::vector<int64_t> reach_count;             // [reps, N] live tasks whose token reaches n
  // Per token chunk of the bookkeeping passes: reach-pair counts [chunks, reps, 256] (reach-set
  // counting) or per-node counts [chunks, reps, N] (per task), and tasks per replica, then where
  // the chunk's tasks of each replica go [chunks, reps].
  std::vector<uint32_t> pair_count;
  std::vector<int64_t> chunk_reach;
  std::vector<int64_t> chunk_count;
  std::vector<SpillCursor> free_cursor;  // [reps, N] (SpillScan::kCursors)
  // One augmentation's search ([G] each), its heap and its path.
  std::vector<std::pair<int, int>> dist;  // (paid, hops)
  std::vector<int> parent_rep;
  std::vector<char> done;
  std::vector<std::tuple<int, int, RankId>> heap;
  std::vector<std::pair<int, RankId>> path;

  // Bytes held (capacities).
  size_t capacity_bytes() const;
};

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
// buffers, so that nothing is allocated per call; their contents on entry do not matter); scratch:
// the rest of its bookkeeping, kept likewise (nullptr: its own for this call). The result does not
// depend on what they held.
//
// num_threads (>= 1) threads build the O(T K) bookkeeping over token chunks (batches of at least
// two chunks of 4096 tokens); the augmentations are serial. The result does not depend on it.
void spill_along_paths(const RoutingBatch& batch, const ExpertLayout& layout, int64_t cap,
                       std::vector<int64_t>& load, std::span<RankId> exec_rank,
                       std::vector<uint64_t>& per_token, std::vector<uint32_t>& per_task,
                       SpillScratch* scratch = nullptr, int num_threads = 1);
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
                                 SpillScan scan = SpillScan::kCursors,
                                 SpillScratch* scratch = nullptr, int num_threads = 1);

// The check spill_along_paths makes before its O(T K) bookkeeping: whether its first augmentation
// could find a target, judged on the layout alone. The graph "u -> v when u holds a replica of an
// expert v holds" contains the spill's graph (which also needs a task on u's replica), so when no
// rank reachable in it from the busiest rank (the lowest id on ties, as the spill picks) has load
// below `cap` or at most its load - 2, the spill would stop at once. load: [G].
bool spill_target_reachable(const ExpertLayout& layout, std::span<const int64_t> load, int64_t cap);

}  // namespace cobalt::assign::detail
