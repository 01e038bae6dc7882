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

// The candidate sets min_node_cover searches: the distinct, non-dominated node sets (cover[n] &
// full, empty ones dropped), each with the lowest node holding it, in the order of that node. (It
// is built incrementally in node order, a dominating set appended after the survivors; since a
// maximal set is appended at its lowest node and never removed, that is the node order.) Only
// [0, size) is meaningful.
struct SetList {
  std::array<uint32_t, kMaxNodes> sets;
  std::array<int, kMaxNodes> node;
  int size = 0;
};

// The list for `full` (bits 0..|U|-1 all set, |U| <= 16) and the node sets cover[n], n in
// candidate_nodes, built incrementally into `list` (the portable construction and the reference
// of the AVX-512 one).
void make_set_list(uint32_t full, const std::array<uint32_t, kMaxNodes>& cover,
                   uint64_t candidate_nodes, SetList& list);

// The same list from the uncovered experts' node masks directly (expert i of |U| =
// num_uncovered <= 8 is held on the nodes of uncovered_masks[i]; full = 2^|U| - 1): one byte lane
// per node of an AVX-512 register, the dominated lanes found by compares. Requires
// set_list_avx512_supported() (the CPU features of the assignment kernel).
inline constexpr int kSetListAvx512MaxElements = 8;
bool set_list_avx512_supported();
void make_set_list_avx512(const uint64_t* uncovered_masks, int num_uncovered, SetList& list);

// A minimum set of nodes covering `full` among the sets of `list`, as a node mask. The answer
// among equal-size covers: a single set covering everything (the first in the list); else, for at
// most 12 sets, the first combination in lexicographic order of the list of the smallest size;
// else a DP over the subsets of `full`: walking down from `full`, each step takes the first set
// of the list whose removal leaves a subset coverable with one set fewer (the CUDA kernel,
// src/cuda/detail/assign_body.hpp, makes the same choice). 0 when the list is empty.
uint64_t min_cover_of_list(const SetList& list, uint32_t full, SetCoverScratch& scratch);

// min_cover_of_list on make_set_list's list.
uint64_t min_node_cover(uint32_t full, const std::array<uint32_t, kMaxNodes>& cover,
                        uint64_t candidate_nodes, SetCoverScratch& scratch);

// The same answer with every combination of each size enumerated (no pruning): the simple
// reference min_node_cover is tested against.
uint64_t min_node_cover_reference(uint32_t full, const std::array<uint32_t, kMaxNodes>& cover,
                                  uint64_t candidate_nodes, SetCoverScratch& scratch);

}  // namespace cobalt::assign::detail
