#include "cobalt/assign/dispatch_layout.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <vector>

#include "cobalt/core/error.hpp"

namespace cobalt::assign {
namespace {

// Sizes every field for T tokens; the counters are zeroed, token_in_rank and slot are left as they
// are (every entry is written by the pass). Reuses the vectors' capacity.
void size_layout(int64_t num_tokens, int top_k, const Topology& topology, DispatchLayout& out) {
  const int num_ranks = topology.num_ranks();
  out.rank_counts.assign(num_ranks, 0);
  out.node_counts.assign(topology.num_nodes(), 0);
  out.rank_offsets.assign(num_ranks + 1, 0);
  out.pair_counts.assign(static_cast<size_t>(num_ranks) * num_ranks, 0);
  out.token_in_rank.resize(static_cast<size_t>(num_tokens) * num_ranks);
  out.slot.resize(static_cast<size_t>(num_tokens) * top_k);
}

// kSpreadBits[b]: the 8 bits of b as 8 bytes of 0 / 1 (bit i in byte i, little-endian).
constexpr std::array<uint64_t, 256> kSpreadBits = [] {
  std::array<uint64_t, 256> table{};
  for (int b = 0; b < 256; ++b) {
    for (int i = 0; i < 8; ++i) table[b] |= static_cast<uint64_t>((b >> i) & 1) << (8 * i);
  }
  return table;
}();

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

void dispatch_layout(std::span<const RankId> exec_rank, std::span<const RankId> source_rank,
                     int top_k, const Topology& topology, DispatchLayout& out) {
  const int num_ranks = topology.num_ranks();
  check_inputs(exec_rank, source_rank, top_k, num_ranks);
  const int64_t num_tokens = static_cast<int64_t>(source_rank.size());
  size_layout(num_tokens, top_k, topology, out);
  std::vector<NodeId> node_of_rank(num_ranks);
  for (RankId r = 0; r < num_ranks; ++r) node_of_rank[r] = topology.node_of(r);
  // Pass 1: D_t, the counts, and slot as the copy's index within its rank (shared by the tasks of
  // one token on one rank; copy_index holds it per rank for the token). Up to 64 ranks D_t is a bit
  // mask (the OR of the tasks' rank bits): each distinct rank is counted once, every task reads its
  // rank's index, and the token's flag row is written from the mask 8 ranks at a time (no separate
  // zero fill); up to 8 nodes the node counts add a test per node (no data-dependent loop). Above
  // 64 ranks the flag row, zeroed first, is the seen set, and a repeated rank adds 0.
  int64_t* rank_counts = out.rank_counts.data();
  std::vector<int32_t> copy_index(num_ranks, 0);  // [G] this token's copy index per rank
  const bool mask_rows = num_ranks <= 64;
  const int num_nodes = topology.num_nodes();
  const bool node_loop_fixed = mask_rows && num_nodes <= 8;
  std::vector<uint64_t> node_rank_mask(num_nodes, 0);  // [N] the node's ranks as bits (G <= 64)
  if (mask_rows) {
    for (RankId r = 0; r < num_ranks; ++r) node_rank_mask[node_of_rank[r]] |= uint64_t{1} << r;
  }
  int64_t* node_counts = out.node_counts.data();
  for (int64_t t = 0; t < num_tokens; ++t) {
    uint8_t* flags = out.token_in_rank.data() + static_cast<size_t>(t) * num_ranks;
    int64_t* pairs = out.pair_counts.data() + static_cast<size_t>(source_rank[t]) * num_ranks;
    const RankId* row = exec_rank.data() + t * top_k;
    int32_t* slot = out.slot.data() + t * top_k;
    uint64_t seen = 0, nodes = 0;
    if (mask_rows) {
      for (int k = 0; k < top_k; ++k) seen |= uint64_t{1} << row[k];
      for (uint64_t rest = seen; rest; rest &= rest - 1) {
        const int d = std::countr_zero(rest);
        copy_index[d] = static_cast<int32_t>(rank_counts[d]++);
        ++pairs[d];
        if (!node_loop_fixed) nodes |= uint64_t{1} << node_of_rank[d];
      }
      for (int k = 0; k < top_k; ++k) slot[k] = copy_index[row[k]];
      if (node_loop_fixed) {  // N <= 8: a fixed trip count, no data-dependent branch
        for (int n = 0; n < num_nodes; ++n) node_counts[n] += (seen & node_rank_mask[n]) != 0;
        nodes = 0;
      }
      int r = 0;
      for (; r + 8 <= num_ranks; r += 8) {
        const uint64_t bytes = kSpreadBits[(seen >> r) & 0xff];
        std::memcpy(flags + r, &bytes, sizeof bytes);
      }
      for (; r < num_ranks; ++r) flags[r] = static_cast<uint8_t>((seen >> r) & 1);
    } else {
      std::memset(flags, 0, static_cast<size_t>(num_ranks));
      for (int k = 0; k < top_k; ++k) {
        const RankId d = row[k];
        const int64_t is_new = flags[d] ^ 1;
        flags[d] = 1;
        const int64_t count = rank_counts[d];
        copy_index[d] = is_new ? static_cast<int32_t>(count) : copy_index[d];
        rank_counts[d] = count + is_new;
        pairs[d] += is_new;
        nodes |= uint64_t{1} << node_of_rank[d];
        slot[k] = copy_index[d];
      }
    }
    for (; nodes; nodes &= nodes - 1) ++node_counts[std::countr_zero(nodes)];
  }
  finish_offsets(out);
  for (size_t i = 0; i < out.slot.size(); ++i)
    out.slot[i] += static_cast<int32_t>(out.rank_offsets[exec_rank[i]]);
}

DispatchLayout dispatch_layout(std::span<const RankId> exec_rank,
                               std::span<const RankId> source_rank, int top_k,
                               const Topology& topology) {
  DispatchLayout out;
  dispatch_layout(exec_rank, source_rank, top_k, topology, out);
  return out;
}

DispatchLayout dispatch_layout_reference(std::span<const RankId> exec_rank,
                                         std::span<const RankId> source_rank, int top_k,
                                         const Topology& topology) {
  const int num_ranks = topology.num_ranks();
  check_inputs(exec_rank, source_rank, top_k, num_ranks);
  const int64_t num_tokens = static_cast<int64_t>(source_rank.size());
  DispatchLayout out;
  size_layout(num_tokens, top_k, topology, out);
  std::fill(out.token_in_rank.begin(), out.token_in_rank.end(), uint8_t{0});
  std::fill(out.slot.begin(), out.slot.end(), 0);
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
