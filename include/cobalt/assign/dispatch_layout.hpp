// Dispatch layout: what a DeepEP-style token exchange needs to know about an assignment before it
// moves any data (cf. DeepEP's get_dispatch_layout), plus the send-buffer offsets an
// all-to-all-v needs. The CPU reference of the GPU kernel cobalt::cuda::dispatch_layout
// (include/cobalt/cuda/dispatch_layout.hpp), which must match it bit for bit.
//
// For token t let D_t be the distinct ranks among exec_rank[t, 0..K) (a rank receives a token once,
// however many of its experts run there) and N_t the nodes of those ranks.
//   rank_counts[d]     = |{t : d in D_t}|                         (DeepEP num_tokens_per_rank)
//   node_counts[n]     = |{t : n in N_t}| (the source node only when a rank of it is in D_t;
//                        DeepEP num_tokens_per_rdma_rank)
//   rank_offsets[d]    = sum_{d' < d} rank_counts[d'], [G + 1]    (send buffer grouped by rank)
//   token_in_rank[t,d] = 1 when d in D_t, else 0                  (DeepEP is_token_in_rank)
//   slot[t, k]         = rank_offsets[d] + |{t' < t : d in D_t'}| with d = exec_rank[t, k]: the
//                        row of the send buffer that holds token t's copy for rank d (tasks of one
//                        token on one rank share the row); rows are in token order within a rank
//   pair_counts[s, d]  = |{t : source_rank[t] = s, d in D_t}|, [G, G] (all-to-all split sizes when
//                        the batch holds several source ranks' tokens)
// With one source rank's tokens this is exactly that rank's dispatch; with a whole step's tokens
// (the simulator's view) slot orders the copies by destination, then token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/ids.hpp"
#include "cobalt/core/topology.hpp"

namespace cobalt::assign {

struct DispatchLayout {
  std::vector<int64_t> rank_counts;    // [G]
  std::vector<int64_t> node_counts;    // [N]
  std::vector<int64_t> rank_offsets;   // [G + 1]
  std::vector<int64_t> pair_counts;    // [G, G] (source rank, destination rank)
  std::vector<uint8_t> token_in_rank;  // [T, G]
  std::vector<int32_t> slot;           // [T, K]
};

// exec_rank [T, K], source_rank [T]: every value in [0, G). Throws kInvalidArgument naming the
// first bad entry when sizes disagree or a rank is out of range, and when the copies reach 2^31
// (slot is int32).
DispatchLayout dispatch_layout(std::span<const RankId> exec_rank,
                               std::span<const RankId> source_rank, int top_k,
                               const Topology& topology);

// The same into `out`, reusing its vectors' capacity: a runtime that keeps one DispatchLayout per
// layer allocates (and page-faults) nothing of the batch's size after the first step (only a few
// [G]- and [N]-sized tables per call). Every field is overwritten; the
// inputs are checked before `out` is touched, so a bad rank leaves it as it was (the int32 overflow
// check comes after the counting pass: then `out` is valid but unspecified).
void dispatch_layout(std::span<const RankId> exec_rank, std::span<const RankId> source_rank,
                     int top_k, const Topology& topology, DispatchLayout& out);

// The definitions above computed one at a time (sorted unique ranks and nodes per token, slots
// from the flags of earlier tokens): the simple reference dispatch_layout is tested against.
// Same contract, O(T G) time.
DispatchLayout dispatch_layout_reference(std::span<const RankId> exec_rank,
                                         std::span<const RankId> source_rank, int top_k,
                                         const Topology& topology);

}  // namespace cobalt::assign
