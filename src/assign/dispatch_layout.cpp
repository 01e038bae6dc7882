#include "cobalt/assign/dispatch_layout.hpp"

#include <algorithm>
#include <limits>

#include "cobalt/core/error.hpp"

namespace cobalt::assign {

DispatchLayout dispatch_layout(std::span<const RankId> exec_rank,
                               std::span<const RankId> source_rank, int top_k,
                               const Topology& topology) {
  const int num_ranks = topology.num_ranks(), num_nodes = topology.num_nodes();
  COBALT_CHECK_ARG(top_k >= 1, "dispatch layout: top-k {} must be >= 1", top_k);
  const int64_t num_tokens = static_cast<int64_t>(source_rank.size());
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == num_tokens * top_k,
                   "dispatch layout: {} execution ranks for {} tokens x top-k {}", exec_rank.size(),
                   num_tokens, top_k);
  DispatchLayout out;
  out.rank_counts.assign(num_ranks, 0);
  out.node_counts.assign(num_nodes, 0);
  out.rank_offsets.assign(num_ranks + 1, 0);
  out.pair_counts.assign(static_cast<size_t>(num_ranks) * num_ranks, 0);
  out.token_in_rank.assign(static_cast<size_t>(num_tokens) * num_ranks, 0);
  out.slot.assign(exec_rank.size(), 0);

  // Pass 1: D_t, counts and flags; slot temporarily holds the index within the rank.
  std::vector<uint8_t> node_seen(num_nodes, 0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    const RankId src = source_rank[t];
    COBALT_CHECK_ARG(src >= 0 && src < num_ranks,
                     "dispatch layout: token {} source rank {} out of "
                     "range [0, {})",
                     t, src, num_ranks);
    uint8_t* flags = out.token_in_rank.data() + static_cast<size_t>(t) * num_ranks;
    const RankId* row = exec_rank.data() + t * top_k;
    for (int k = 0; k < top_k; ++k) {
      const RankId d = row[k];
      COBALT_CHECK_ARG(d >= 0 && d < num_ranks,
                       "dispatch layout: task ({}, {}) rank {} out of range [0, {})", t, k, d,
                       num_ranks);
      if (flags[d] == 0) {
        flags[d] = 1;
        COBALT_CHECK_ARG(out.rank_counts[d] < std::numeric_limits<int32_t>::max(),
                         "dispatch layout: more than 2^31 copies");
        out.slot[t * top_k + k] = static_cast<int32_t>(out.rank_counts[d]++);
        out.pair_counts[static_cast<size_t>(src) * num_ranks + d] += 1;
        const NodeId n = topology.node_of(d);
        if (!node_seen[n]) {
          node_seen[n] = 1;
          out.node_counts[n] += 1;
        }
      } else {
        // A repeated rank within the row: share the first task's row (found below).
        out.slot[t * top_k + k] = -1;
      }
    }
    for (int k = 0; k < top_k; ++k) node_seen[topology.node_of(row[k])] = 0;
    for (int k = 0; k < top_k; ++k) {
      if (out.slot[t * top_k + k] >= 0) continue;
      for (int j = 0; j < k; ++j) {
        if (row[j] == row[k] && out.slot[t * top_k + j] >= 0) {
          out.slot[t * top_k + k] = out.slot[t * top_k + j];
          break;
        }
      }
    }
  }
  for (int d = 0; d < num_ranks; ++d)
    out.rank_offsets[d + 1] = out.rank_offsets[d] + out.rank_counts[d];
  COBALT_CHECK_ARG(out.rank_offsets[num_ranks] <= std::numeric_limits<int32_t>::max(),
                   "dispatch layout: {} copies overflow the int32 slots",
                   out.rank_offsets[num_ranks]);
  for (size_t i = 0; i < out.slot.size(); ++i)
    out.slot[i] += static_cast<int32_t>(out.rank_offsets[exec_rank[i]]);
  return out;
}

}  // namespace cobalt::assign
