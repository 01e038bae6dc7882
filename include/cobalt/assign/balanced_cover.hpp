// Load-balanced node-cover assignment (cobalt+; not in the paper). Same cross-node transfers as
// Algorithm 1 — every token reaches exactly the nodes of its minimum remote cover — but the ranks
// are chosen to balance load instead of uniformly at random:
//
//   1. covers: Algorithm 1's step 1 per token (remote_node_covers with `key`: ties between minimum
//      covers drawn as assign_node_cover draws them; the only use of the key).
//   2. classes: task (t, e) may run on any rank holding e on a node of A = ({src} u cover_t) n
//   nodes(e)
//      at no extra cross-node cost (the token travels to those nodes anyway). Tasks are grouped by
//      (e, A) with their counts.
//   3. quotas: classes in order of flexibility (fewest allowed ranks first, then larger count, then
//      key) are water-filled onto their allowed ranks: integer quotas that raise the least loaded
//      ranks first; when the last level splits unevenly, its extra tasks go to the ranks that
//      were least loaded before the class was placed (ties: lowest rank id), not to the lowest
//      rank ids among the ranks tied at the end.
//   4. mapping: tasks take their class's quotas in token order (ranks ascending).
//
// Deterministic and independent of the thread count (options.num_threads): steps 1, 2 and 4 run
// in parallel over token chunks, and so does the spill's O(T K) bookkeeping; step 3 and the
// spill's moves are serial.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cobalt/assign/node_cover.hpp"

namespace cobalt::assign {

namespace detail {
struct CoverClassScratch;  // the classes, quotas and mapping state (src/assign/balanced_cover.cpp)
struct SpillScratch;       // the spill's per-replica bookkeeping (src/assign/path_spill.hpp)
}  // namespace detail

// The scratch memory of assign_balanced_cover, kept across calls so that a caller running it every
// step (cobalt+ keeps one per policy) allocates and page-faults nothing of the batch's size once it
// has seen its largest batch and layout: one word per token and one per task (shared by the class
// pass and the spill), the classes with their ranks and quotas (flat lists), the per-chunk class
// tables and mapping state, and the spill's per-replica task lists and search state. What a call
// still allocates is a few tables of the layout's size ([G] entries, the cover search's mask
// table) and, with more than one thread, the threads (tests/cpp/allocation counts it). The
// buffers only grow; they are freed with the workspace. Movable, not copyable. Not for concurrent
// calls.
class BalancedCoverWorkspace {
 public:
  BalancedCoverWorkspace();
  ~BalancedCoverWorkspace();
  BalancedCoverWorkspace(BalancedCoverWorkspace&&) noexcept;
  BalancedCoverWorkspace& operator=(BalancedCoverWorkspace&&) noexcept;

  // Bytes held (the buffers' capacities).
  size_t capacity_bytes() const;

 private:
  friend void assign_balanced_cover(const RoutingBatch&, const ExpertLayout&, const AssignKey&,
                                    const AssignOptions&, std::span<RankId>, double,
                                    BalancedCoverWorkspace*);
  std::vector<uint64_t> per_token_;  // [T] covers, then the spill's token reach
  std::vector<uint32_t> per_task_;   // [T K] task classes, then the spill's task lists
  std::unique_ptr<detail::CoverClassScratch> classes_;  // made by the first call
  std::unique_ptr<detail::SpillScratch> spill_;         // made by the first call that spills
};

// spill_tolerance >= 0 adds a last step that trades cross-node transfers for balance: while the
// busiest rank is above cap = balance_cap(tasks, ranks, spill_tolerance) (balance_cap.hpp: the
// largest whole load within (1 + spill_tolerance) * mean), tasks move along chains of
// holders (rank u gives a task of expert e to rank v holding e, v gives one of its own experts'
// tasks onward, ...) from it to a rank below the cap, or, when none is reachable, to one at least
// two tasks lighter. Chains that add no cross-node copy (every moved task's token already reaches
// the destination node) are preferred, then fewer copies, then shorter chains. The busiest rank
// ends at max(cap, the lowest maximum load any assignment on the layout can reach) or at its load
// without spill when that is lower. < 0 (default): never adds cross-node transfers.
//
// workspace: scratch kept by the caller (see above); nullptr allocates it for this call only. The
// result does not depend on it.
void assign_balanced_cover(const RoutingBatch& batch, const ExpertLayout& layout,
                           const AssignKey& key, const AssignOptions& options,
                           std::span<RankId> exec_rank, double spill_tolerance = -1.0,
                           BalancedCoverWorkspace* workspace = nullptr);

}  // namespace cobalt::assign
