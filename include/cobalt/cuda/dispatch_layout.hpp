// Dispatch layout on the GPU: the quantities of cobalt/assign/dispatch_layout.hpp (definitions
// there), from an assignment in device memory, bitwise identical to assign::dispatch_layout.
//
// Work: two passes over exec_rank, 32 tokens per warp, 256 per block; per warp and destination
// rank one ballot gives the warp's tokens for that rank, so slots are exact in-order prefix sums
// without atomics (a per-rank scan over blocks sits between the passes). node_counts and
// pair_counts use warp-aggregated integer atomics.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cobalt/cuda/common.hpp"

namespace cobalt::cuda {

struct DispatchLayoutOutputs {
  int64_t* rank_counts = nullptr;    // [G] required
  int64_t* node_counts = nullptr;    // [N] required
  int64_t* rank_offsets = nullptr;   // [G + 1] required
  int32_t* slot = nullptr;           // [T, K] optional (nullptr: skipped)
  uint8_t* token_in_rank = nullptr;  // [T, G] optional
  int64_t* pair_counts = nullptr;    // [G, G] optional (needs source_rank)
};

// Workspace bytes for T tokens over G ranks.
size_t dispatch_layout_workspace_bytes(int64_t num_tokens, int num_ranks);

// exec_rank [T, K] (K in [1, 64]) with values in [0, G); source_rank [T] (may be nullptr when
// pair_counts is not requested). G <= 2048 (the per-block ballots live in shared memory), N in
// [1, 64] dividing G. The total number of copies must stay below 2^31 (slot is int32); the inputs
// are trusted (not validated on the device).
void dispatch_layout(const int32_t* exec_rank, const int32_t* source_rank, int64_t num_tokens,
                     int top_k, int num_nodes, int num_ranks, const DispatchLayoutOutputs& out,
                     void* workspace, size_t workspace_bytes, Stream stream);

}  // namespace cobalt::cuda
