// The exact minimum set cover behind Algorithm 1's step 1 for N > 8 nodes (the subset search;
// internal to src/assign/). The universe is the token's uncovered experts (K <= 16 bits), the
// sets are the nodes' subsets of it.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "cobalt/core/ids.hpp"

namespace cobalt::assign::detail {

struct SetCoverScratch {  // reused across tokens by one thread
  std::vector<uint8_t> best;
  std::vector<uint64_t> choice;
};

// A minimum set of nodes covering `full` (bits 0..|U|-1 all set, |U| <= 16), node n covering
// cover[n] for n in candidate_nodes; returned as a node mask. The answer among equal-size covers:
// the node sets are reduced to the distinct, non-dominated ones (the lowest node kept for each, a
// dominating set appended after the survivors); then a single set covering everything (the first
// in that list); else, for at most 12 sets, the first combination in lexicographic order of the
// list of the smallest size; else a DP over the subsets of `full`.
uint64_t min_node_cover(uint32_t full, const std::array<uint32_t, kMaxNodes>& cover,
                        uint64_t candidate_nodes, SetCoverScratch& scratch);

// The same answer with every combination of each size enumerated (no pruning): the simple
// reference min_node_cover is tested against.
uint64_t min_node_cover_reference(uint32_t full, const std::array<uint32_t, kMaxNodes>& cover,
                                  uint64_t candidate_nodes, SetCoverScratch& scratch);

}  // namespace cobalt::assign::detail
