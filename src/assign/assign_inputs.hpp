// What Algorithm 1's per-token loops read (internal to src/assign/): the batch's ids and sources,
// the layout's tables and the RNG prefix. Shared by the portable loops in node_cover.cpp and the
// AVX-512 kernel in node_cover_avx512.cpp.
#pragma once

#include <cstdint>

#include "cobalt/core/ids.hpp"

namespace cobalt::assign::detail {

struct AssignInputs {
  const ExpertId* ids;          // [T, K]
  const RankId* src;            // [T]
  const NodeId* node_of_rank;   // [G]
  const uint64_t* node_mask;    // [E]
  const int32_t* node_offsets;  // [E * N + 1] into replica_ranks
  const RankId* replica_ranks;  // replicas grouped by (expert, node)
  int top_k;
  int num_nodes;
  uint64_t prefix;  // counter_prefix(seed, step, layer)
  int64_t token_offset;
  RankId* exec_rank;  // [T, K]
};

}  // namespace cobalt::assign::detail
