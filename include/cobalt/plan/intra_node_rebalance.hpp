// Cobalt stage 2: per-step intra-node rebalancing (paper §3.2). For each node, re-partition the
// node's replicas over its ranks to minimise the maximum rank load, using replica-level EMA loads:
// greedy bin packing (replicas sorted by load, descending; each on the least-loaded rank with a
// free slot and no replica of that expert; ties prefer the replica's current rank, then the lowest
// rank). The packed groups are then put on the node's ranks by a maximum-weight matching that keeps
// the most replicas on their current rank (rank_matching.hpp; the loads do not depend on which rank
// gets which group). A node keeps its current placement unless the packing lowers its maximum rank
// load by more than `min_gain` (relative), so replicas stay put when moving them gains nothing,
// and unless some rank's experts change: replicas of one expert are interchangeable, so a packing
// that only trades them between ranks is a relabelling of their loads, not a move.
// Only ranks within a node change: the set of replicas per node is preserved.
#pragma once

#include <span>
#include <vector>

#include "cobalt/core/expert_layout.hpp"

namespace cobalt::plan {

struct RebalanceResult {
  ExpertLayout layout;
  std::vector<double> slot_loads;  // [G, S] the replica loads re-keyed to the new slots
  int64_t num_moves = 0;  // replicas on a rank that did not hold their expert (NVLink copies)
};

// slot_loads: [G, S] EMA load of the replica in each slot of `layout` (0 for empty slots).
RebalanceResult rebalance_intra_node(const ExpertLayout& layout, std::span<const double> slot_loads,
                                     double min_gain = 0.01);

}  // namespace cobalt::plan
