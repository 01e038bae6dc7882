// Even-split routing of tasks over an expert's replicas, the rule the load-based peers (SmartMoE,
// FasterMoE, FlexMoE, LAER-MoE) use to turn a layout into execution ranks.
//
// For a task of expert e from source rank s the *candidates* are, by scope:
//   kAllReplicas       every rank holding e (FlexMoE: topology-unaware even split);
//   kSameNodeFirst     the ranks of s's node holding e if any, else every holder (LAER-MoE's
//                      "intra-node first, then inter-node evenly");
//   kSourceRankFirst   s itself when it holds e, else every holder (FasterMoE shadows and SmartMoE
//                      full replicas: a fully replicated expert runs where its token is).
// The n tasks of (s, e) are split evenly over its L candidates (ascending rank order): candidate j
// receives floor(n / L) tasks, plus one when ((j - s) mod L) < n mod L. So remainders rotate with
// the source rank, and sparse demand (n = 1 from many sources) still spreads over all replicas.
// At token level the c-th task of (s, e) in token order (c = 0, 1, ...) runs on candidate
// (c + s) mod L, which realises exactly those counts: route_tokens and route_counts give identical
// rank loads for the same per-(source, expert) counts. No randomness; results do not depend on any
// thread count.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/routing_batch.hpp"

namespace cobalt::plan {

enum class ReplicaScope {
  kAllReplicas,
  kSameNodeFirst,
  kSourceRankFirst,
};

// Tasks from each source rank choosing each expert: [G, E] (row = source rank).
std::vector<int64_t> count_demand(const RoutingBatch& batch);

// Writes exec_rank [T, K] by the even split above, in O(T K + min(G E, T K + G + E)) time and
// memory (a [G, E] table only when it is no larger than the tasks). Throws
// kInvalidArgument when sizes or the layout's E / G disagree with the batch.
void route_tokens(const RoutingBatch& batch, const ExpertLayout& layout, ReplicaScope scope,
                  std::span<RankId> exec_rank);

// Load-only version: counts [G, E] -> rank_loads [G] (tasks executed per rank).
void route_counts(std::span<const int64_t> counts, const ExpertLayout& layout, ReplicaScope scope,
                  std::span<int64_t> rank_loads);

// Planning version with fractional demand (e.g. EMA or windowed counts, [G, E]): each (s, e)
// demand splits exactly evenly over its candidates. Returns flows [G_src, G_dst].
std::vector<double> expected_flows(std::span<const double> demand, const ExpertLayout& layout,
                                   ReplicaScope scope);
// Column sums of expected_flows: expected tasks executed per rank [G].
std::vector<double> expected_rank_loads(std::span<const double> demand, const ExpertLayout& layout,
                                        ReplicaScope scope);

// Expert loads of a demand matrix: sum over source ranks [E].
std::vector<double> expert_loads_of(std::span<const double> demand, int num_experts);

}  // namespace cobalt::plan
