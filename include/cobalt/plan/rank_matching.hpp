// Matching of packed replica groups to the ranks of a node, so that a re-packing moves as few
// replicas as possible. Packing (pack_ranks, stage-2 rebalancing) decides which replicas share a
// rank; the ranks of one node are interchangeable for loads and for cross-node traffic, so any
// permutation of the groups over the node's ranks is equally good for both. The permutation that
// keeps the most replicas where they already are is a maximum-weight perfect matching (the
// assignment problem), solved exactly here.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/expert_layout.hpp"

namespace cobalt::plan {

// Maximum-weight perfect matching of n rows to n columns (Hungarian algorithm with potentials,
// O(n^3), exact on integers). weight: [n, n] row-major, weight[row * n + col]; entries may be
// negative; |entries| * n must fit in int64 with headroom (checked: |entry| <= 2^40).
// Returns row2col [n], a permutation maximising sum(weight[row, row2col[row]]). Deterministic: the
// same weights always give the same permutation. Throws kInvalidArgument on n < 0, a weight span
// of the wrong size or an entry out of range.
std::vector<int> max_weight_perfect_matching(std::span<const int64_t> weight, int n);

// Reference for tests: the best total weight by trying every permutation (n <= 9).
int64_t max_weight_perfect_matching_brute_force(std::span<const int64_t> weight, int n);

// Permutation group2pos [n] maximising the replicas kept in place, kept[g * n + p] = replicas of
// group g already at position p (>= 0); among the best it keeps the most groups at their own
// index (g -> g). Throws kInvalidArgument for a kept span of the wrong size or negative counts.
std::vector<int> keep_most_in_place(std::span<const int64_t> kept, int n);

// Permutation of the packed groups of node `node` over its ranks that keeps the most replicas on
// their current rank. groups: [ranks_per_node] lists of experts (group g is bound for some rank of
// the node); current: the layout in force. Returns group2rank [ranks_per_node], local rank indices
// (0 .. ranks_per_node-1). Among the permutations that keep the most replicas it keeps the most
// groups at their own index (g -> g), so packings that already agree with `current` are not
// shuffled.
std::vector<int> keep_replicas_in_place(const ExpertLayout& current, NodeId node,
                                        std::span<const std::vector<ExpertId>> groups);

}  // namespace cobalt::plan
