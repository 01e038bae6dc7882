// Load-proportional replica counts: how many replicas each expert gets out of a fixed budget so
// that the hottest load per replica is as small as the increments allow (LAER-MoE's
// allocate_expert_replicas_precise, csrc/greedy_balancer.cpp of PKU-DAIR/Hetu-Galvatron).
//
// Start: every expert gets `node_step` replicas when node_step * E <= total_replicas (one per node,
// so that every node can serve every expert), else 1. Then repeatedly give one more increment to
// the expert with the largest load per replica (ties: lower expert id): +1 while the expert has
// fewer than node_step replicas, +node_step once it has node_step or more (so node-spread experts
// stay spread evenly over nodes). An expert whose next increment does not fit the remaining budget,
// or would exceed max_per_expert, is frozen. Stops when the budget is used or every expert is
// frozen (so a few slots may stay unused when node_step > 1).
#pragma once

#include <span>
#include <vector>

namespace cobalt::plan {

// expert_load: [E], >= 0. total_replicas >= E, node_step >= 1, max_per_expert >= 1 (e.g. G, since
// no rank holds two replicas of one expert). Returns counts [E] with sum <= total_replicas, each in
// [1, max_per_expert]. Throws kInvalidArgument on out-of-range arguments.
std::vector<int> proportional_replica_counts(std::span<const double> expert_load,
                                             int total_replicas, int node_step, int max_per_expert);

}  // namespace cobalt::plan
