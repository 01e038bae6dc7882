// The fast accept test behind validate_topk_rows and RoutingBatch's source check: whether every
// entry is valid, without saying which is not. Branch-free over blocks of rows so the compiler
// vectorises it; on false, the caller runs the reference loop (validate_topk_rows_reference) for
// the first bad entry and its message. Internal to the library (and its tests).
#pragma once

#include <span>

#include "cobalt/core/ids.hpp"

namespace cobalt::detail {

// Every row of topk_ids [T, top_k] holds top_k distinct ids in [0, num_experts). top_k >= 1 and
// topk_ids.size() a multiple of it (checked by the caller).
bool topk_rows_valid(std::span<const ExpertId> topk_ids, int top_k, int num_experts);

// Every entry of ranks is in [0, num_ranks).
bool ranks_valid(std::span<const RankId> ranks, int num_ranks);

// The plain loop: throws kInvalidArgument for the first bad entry (token, slot, value), as
// validate_topk_rows documents; returns when every row is valid.
void validate_topk_rows_reference(std::span<const ExpertId> topk_ids, int top_k, int num_experts,
                                  const char* what);

}  // namespace cobalt::detail
