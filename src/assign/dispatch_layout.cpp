#include "cobalt/assign/dispatch_layout.hpp"

#include <algorithm>
#include <bit>
#include <limits>
#include <vector>

#include "cobalt/core/error.hpp"

namespace cobalt::assign {
namespace {

DispatchLayout sized_layout(int64_t num_tokens, int top_k, const Topology& topology) {
  const int num_ranks = topology.num_ranks();
  DispatchLayout out;
  out.rank_counts.assign(num_ranks, 0);
  out.node_counts.assign(topology.num_nodes(), 0);
  out.rank_offsets.assign(num_ranks + 1, 0);
  out.pair_counts.assign(static_cast<size_t>(num_ranks) * num_ranks, 0);
  out.token_in_rank.assign(static_cast<size_t>(num_tokens) * num_ranks, 0);
  out.slot.assign(static_cast<size_t>(num_tokens) * top_k, 0);
  return out;
}

// Sizes, then every rank in [0, G); the first bad entry is named (found only when there is one).
void check_inputs(std::span<const RankId> exec_rank, std::span<const RankId> source_rank, int top_k,
                  int num_ranks) {
  COBALT_CHECK_ARG(top_k >= 1, "dispatch layout: top-k {} must be >= 1", top_k);
  const int64_t num_tokens = static_cast<int64_t>(source_rank.size());
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == num_tokens * top_k,
                   "dispatch layout: {} execution ranks for {} tokens x top-k {}", exec_rank.size(),
                   num_tokens, top_k);
  // One branch-free pass (min and max) for the common, valid case.
  const auto in_range = [num_ranks](std::span<const RankId> values) {
    RankId low = 0, high = 0;
    for (RankId v : values) {
      low = std::min(low, v);
      high = std::max(high, v);
    }
    return low >= 0 && high < num_ranks;
  };
  if (in_range(source_rank) && in_range(exec_rank)) return;
  // Token by token (its source, then its tasks), so the first bad entry is the one named.
  for (int64_t t = 0; t < num_tokens; ++t) {
    COBALT_CHECK_ARG(source_rank[t] >= 0 && source_rank[t] < num_ranks,
                     "dispatch layout: token {} source rank {} out of range [0, {})", t,
                     source_rank[t], num_ranks);
    for (int k = 0; k < top_k; ++k) {
      const RankId d = exec_rank[t * top_k + k];
      COBALT_CHECK_ARG(d >= 0 && d < num_ranks,
                       "dispatch layout: task ({}, {}) rank {} out of range [0, {})", t, k, d,
                       num_ranks);
    }
  }
}

// rank_offsets [G + 1] from rank_counts; the copies must fit the int32 slots.
void finish_offsets(DispatchLayout& out) {
  const size_t num_ranks = out.rank_counts.size();
  for (size_t d = 0; d < num_ranks; ++d)
    out.rank_offsets[d + 1] = out.rank_offsets[d] + out.rank_counts[d];
  COBALT_CHECK_ARG(out.rank_offsets[num_ranks] <= std::numeric_limits<int32_t>::max(),
                   "dispatch layout: {} copies overflow the int32 slots",
                   out.rank_offsets[num_ranks]);
}

}  // namespace

DispatchLayout dispatch_layout(std::span<const RankId> exec_rank,
                               std::span<const RankId> source_rank, int top_k,
                               const Topology& topology) {
  const int num_ranks = topology.num_ranks();
  check_inputs(exec_rank, source_rank, top_k, num_ranks);
  const int64_t num_tokens = static_cast<int64_t>(source_rank.size());
  DispatchLayout out = sized_layout(num_tokens, top_k, topology);
  std::vector<NodeId> node_of_rank(num_ranks);
  for (RankId r = 0; r < num_ranks; ++r) node_of_rank[r] = topology.node_of(r);
  // Pass 1: D_t (the token's flag row doubles as its seen set), counts; slot holds the copy's
  // index within its rank, shared by the tasks of one token on one rank.
  int64_t* rank_counts = out.rank_counts.data();
  for (int64_t t = 0; t < num_tokens; ++t) {
    uint8_t* flags = out.token_in_rank.data() + static_cast<size_t>(t) * num_ranks;
    int64_t* pairs = out.pair_counts.data() + static_cast<size_t>(source_rank[t]) * num_ranks;
    const RankId* row = exec_rank.data() + t * top_k;
    int32_t* slot = out.slot.data() + t * top_k;
    uint64_t nodes = 0;
    for (int k = 0; k < top_k; ++k) {
      const RankId d = row[k];
      if (flags[d] == 0) {
        flags[d] = 1;
        slot[k] = static_cast<int32_t>(rank_counts[d]++);
        ++pairs[d];
        nodes |= uint64_t{1} << node_of_rank[d];
      } else {
        // A repeated rank within the row: the row of its first task.
        int j = 0;
        while (row[j] != d) ++j;
        slot[k] = slot[j];
      }
    }
    for (; nodes; nodes &= nodes - 1) ++out.node_counts[std::countr_zero(nodes)];
  }
  finish_offsets(out);
  for (size_t i = 0; i < out.slot.size(); ++i)
    out.slot[i] += static_cast<int32_t>(out.rank_offsets[exec_rank[i]]);
  return out;
}

DispatchLayout dispatch_layout_reference(std::span<const RankId> exec_rank,
                                         std::span<const RankId> source_rank, int top_k,
                                         const Topology& topology) {
  const int num_ranks = topology.num_ranks();
  check_inputs(exec_rank, source_rank, top_k, num_ranks);
  const int64_t num_tokens = static_cast<int64_t>(source_rank.size());
  DispatchLayout out = sized_layout(num_tokens, top_k, topology);
  // The definitions of the header, one at a time.
  for (int64_t t = 0; t < num_tokens; ++t) {
    std::vector<RankId> ranks(exec_rank.begin() + t * top_k, exec_rank.begin() + (t + 1) * top_k);
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());  // D_t
    std::vector<NodeId> nodes;
    for (RankId d : ranks) {
      out.token_in_rank[static_cast<size_t>(t) * num_ranks + d] = 1;
      out.rank_counts[d] += 1;
      out.pair_counts[static_cast<size_t>(source_rank[t]) * num_ranks + d] += 1;
      nodes.push_back(topology.node_of(d));
    }
    std::sort(nodes.begin(), nodes.end());
    nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());  // N_t
    for (NodeId n : nodes) out.node_counts[n] += 1;
  }
  finish_offsets(out);
  // slot[t, k] = rank_offsets[d] + |{t' < t : d in D_t'}|, from the flags of earlier tokens.
  std::vector<int64_t> earlier(num_ranks, 0);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int k = 0; k < top_k; ++k) {
      const RankId d = exec_rank[t * top_k + k];
      out.slot[t * top_k + k] = static_cast<int32_t>(out.rank_offsets[d] + earlier[d]);
    }
    for (RankId d = 0; d < num_ranks; ++d)
      earlier[d] += out.token_in_rank[static_cast<size_t>(t) * num_ranks + d];
  }
  return out;
}

}  // namespace cobalt::assign
