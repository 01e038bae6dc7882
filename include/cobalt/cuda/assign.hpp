// Cobalt task assignment (Algorithm 1) on the GPU, one token per thread.
//
// Bitwise identical to the CPU: exec_rank equals assign::assign_node_cover(batch, layout, key,
// {search}) for the same batch, layout, key and search (kAuto: masks for N <= 8, subset DP above,
// as on the CPU), and so, for kMaskEnumeration, assign::assign_node_cover_reference too. Every draw
// is the counter-based RNG keyed by (key.seed, key.step, key.layer, key.token_offset + t, k), so
// any token range can be assigned separately (pass its first token's index as token_offset).
#pragma once

#include <cstddef>
#include <cstdint>

#include "cobalt/assign/node_cover.hpp"  // AssignKey, CoverSearch
#include "cobalt/cuda/common.hpp"

namespace cobalt::cuda {

// Workspace bytes assign_node_cover needs: 0 unless the subset DP may need more than the per-thread
// table (search resolves to kSubsetDp and top_k > 8); then a deferred-token list (8 bytes per
// token) and 1024 DP tables of 2^K bytes (64 MiB at K = 16). The workspace is 256-byte aligned.
size_t assign_workspace_bytes(int64_t num_tokens, int top_k, int num_nodes,
                              assign::CoverSearch search);

// topk_ids [T, K] (K in [1, 16]), source_rank [T], exec_rank [T, K] out: device pointers. The
// inputs are trusted (as RoutingBatch::trusted: ids in [0, E) and distinct within a row, ranks in
// [0, G)); they are not validated on the device. Throws kInvalidArgument for bad sizes, a
// workspace smaller than assign_workspace_bytes, kMaskEnumeration with more than 20 nodes, or more
// tokens than one call takes (2^31 - 1 with the subset DP at top_k > 8, else (2^31 - 1) x 256;
// split the batch and pass each part's first token as key.token_offset).
void assign_node_cover(const LayoutView& layout, const int32_t* topk_ids,
                       const int32_t* source_rank, int64_t num_tokens, int top_k,
                       const assign::AssignKey& key, assign::CoverSearch search, int32_t* exec_rank,
                       void* workspace, size_t workspace_bytes, Stream stream);

}  // namespace cobalt::cuda
