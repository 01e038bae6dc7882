#include "cobalt/assign/node_cover.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/parallel.hpp"
#include "cobalt/core/rng.hpp"

namespace cobalt::assign {
namespace {

constexpr int kMaxTopK = 16;  // the subset DP indexes uncovered experts with 16-bit sets

// All N-bit masks ordered by (popcount, value): the first feasible one is the paper's answer
// (minimum popcount, and among those the first in enumeration order).
std::vector<uint64_t> masks_by_popcount(int num_nodes) {
  std::vector<uint64_t> masks(size_t{1} << num_nodes);
  for (size_t m = 0; m < masks.size(); ++m) masks[m] = m;
  std::stable_sort(masks.begin(), masks.end(),
                   [](uint64_t a, uint64_t b) { return std::popcount(a) < std::popcount(b); });
  return masks;
}

// Picks the i-th set bit of `mask` (0-based).
inline int nth_set_bit(uint64_t mask, uint32_t i) {
  for (; i > 0; --i) mask &= mask - 1;
  return std::countr_zero(mask);
}

// Minimum cover of `full` (a set over uncovered-expert indices) by the node covers `cover[n]`, n in
// `nodes`. Returns the chosen node set as a mask. Exact DP over subsets; among equal-size covers
// the DP keeps the first found in ascending node order.
uint64_t min_cover_dp(uint32_t full, const std::array<uint32_t, kMaxNodes>& cover,
                      uint64_t candidate_nodes, std::vector<uint8_t>& best,
                      std::vector<uint64_t>& choice) {
  // Distinct, non-dominated covers, keeping the lowest node for each distinct cover.
  std::array<uint32_t, kMaxNodes> sets{};
  std::array<int, kMaxNodes> set_node{};
  int num_sets = 0;
  for (uint64_t m = candidate_nodes; m; m &= m - 1) {
    const int n = std::countr_zero(m);
    const uint32_t c = cover[n] & full;
    if (c == 0) continue;
    bool dominated = false;
    for (int i = 0; i < num_sets && !dominated; ++i) dominated = (c | sets[i]) == sets[i];
    if (dominated) continue;
    int kept = 0;
    for (int i = 0; i < num_sets; ++i) {
      if ((sets[i] | c) != c) {
        sets[kept] = sets[i];
        set_node[kept++] = set_node[i];
      }
    }
    num_sets = kept;
    sets[num_sets] = c;
    set_node[num_sets++] = n;
  }
  // A single cover reaching everything is the common case.
  for (int i = 0; i < num_sets; ++i) {
    if (sets[i] == full) return uint64_t{1} << set_node[i];
  }
  const size_t num_states = size_t{1} << std::popcount(full);
  // Work in the compressed index space of `full` (bits of full renumbered 0..|U|-1): full ==
  // num_states-1 by construction of the caller.
  best.assign(num_states, 0xff);
  choice.assign(num_states, 0);
  best[0] = 0;
  for (size_t s = 1; s < num_states; ++s) {
    for (int i = 0; i < num_sets; ++i) {
      if ((sets[i] & s) == 0) continue;
      const size_t rest = s & ~static_cast<size_t>(sets[i]);
      if (best[rest] + 1 < best[s]) {
        best[s] = static_cast<uint8_t>(best[rest] + 1);
        choice[s] = static_cast<uint64_t>(i);
      }
    }
  }
  uint64_t nodes = 0;
  for (size_t s = num_states - 1; s != 0;) {
    const int i = static_cast<int>(choice[s]);
    nodes |= uint64_t{1} << set_node[i];
    s &= ~static_cast<size_t>(sets[i]);
  }
  return nodes;
}

struct TokenScratch {
  std::vector<uint8_t> best;
  std::vector<uint64_t> choice;
};

// Chooses the remote node set for the uncovered experts `uncovered_masks` (node masks, source bit
// cleared). Shared by the assignment and min_remote_cover_size.
uint64_t choose_cover(const uint64_t* uncovered_masks, int num_uncovered, int num_nodes,
                      bool use_masks, const std::vector<uint64_t>& ordered_masks,
                      TokenScratch& scratch) {
  if (use_masks) {
    for (uint64_t b : ordered_masks) {
      bool feasible = true;
      for (int i = 0; i < num_uncovered && feasible; ++i) feasible = (b & uncovered_masks[i]) != 0;
      if (feasible) return b;
    }
    return 0;  // unreachable: every expert has a replica somewhere
  }
  std::array<uint32_t, kMaxNodes> cover{};
  uint64_t candidates = 0;
  for (int i = 0; i < num_uncovered; ++i) {
    for (uint64_t m = uncovered_masks[i]; m; m &= m - 1) {
      const int n = std::countr_zero(m);
      cover[n] |= uint32_t{1} << i;
      candidates |= uint64_t{1} << n;
    }
  }
  (void)num_nodes;
  return min_cover_dp((uint32_t{1} << num_uncovered) - 1, cover, candidates, scratch.best,
                      scratch.choice);
}

}  // namespace

void assign_node_cover(const RoutingBatch& batch, const ExpertLayout& layout, const AssignKey& key,
                       const AssignOptions& options, std::span<RankId> exec_rank) {
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "assignment: output holds {} ranks, batch has {} tasks", exec_rank.size(),
                   batch.num_tasks());
  COBALT_CHECK_ARG(
      layout.num_experts() == batch.num_experts() && layout.num_ranks() == batch.num_ranks(),
      "assignment: layout has E={} G={}, batch has E={} G={}", layout.num_experts(),
      layout.num_ranks(), batch.num_experts(), batch.num_ranks());
  COBALT_CHECK_ARG(batch.top_k() <= kMaxTopK, "assignment: top-k {} out of range [1, {}]",
                   batch.top_k(), kMaxTopK);
  const int num_nodes = layout.num_nodes();
  const int per_node = layout.topology().ranks_per_node();
  const bool use_masks = options.search == CoverSearch::kMaskEnumeration ||
                         (options.search == CoverSearch::kAuto && num_nodes <= 8);
  COBALT_CHECK_ARG(
      !use_masks || num_nodes <= 20,
      "assignment: mask enumeration over {} nodes is infeasible; use the subset DP (N <= 20 "
      "for masks)",
      num_nodes);
  const std::vector<uint64_t> ordered_masks =
      use_masks ? masks_by_popcount(num_nodes) : std::vector<uint64_t>{};
  const int top_k = batch.top_k();
  const ExpertId* ids = batch.topk_ids().data();
  const RankId* src = batch.source_rank().data();

  auto run = [&](int /*chunk*/, int64_t begin, int64_t end) {
    TokenScratch scratch;
    std::array<uint64_t, kMaxTopK> uncovered_masks;
    std::array<int, kMaxTopK> uncovered_k;
    // Masks that contain the source node are infeasible as "remote" covers; filter per token below.
    for (int64_t t = begin; t < end; ++t) {
      const NodeId src_node = src[t] / per_node;
      const uint64_t src_bit = uint64_t{1} << src_node;
      const ExpertId* row = ids + t * top_k;
      RankId* out = exec_rank.data() + t * top_k;
      const uint64_t token = static_cast<uint64_t>(key.token_offset + t);
      int num_uncovered = 0;
      for (int k = 0; k < top_k; ++k) {
        const uint64_t mask = layout.node_mask(row[k]);
        if (mask & src_bit) {
          auto ranks = layout.ranks_of(row[k], src_node);
          const uint64_t h = counter_hash(key.seed, key.step, key.layer, token, k);
          out[k] = ranks[uniform_below(mix64(h), static_cast<uint32_t>(ranks.size()))];
        } else {
          uncovered_masks[num_uncovered] = mask;
          uncovered_k[num_uncovered++] = k;
        }
      }
      if (num_uncovered == 0) continue;
      uint64_t cover;
      if (use_masks) {
        cover = 0;
        for (uint64_t b : ordered_masks) {
          if (b & src_bit) continue;
          bool feasible = true;
          for (int i = 0; i < num_uncovered && feasible; ++i)
            feasible = (b & uncovered_masks[i]) != 0;
          if (feasible) {
            cover = b;
            break;
          }
        }
      } else {
        cover = choose_cover(uncovered_masks.data(), num_uncovered, num_nodes, false, ordered_masks,
                             scratch);
      }
      for (int i = 0; i < num_uncovered; ++i) {
        const int k = uncovered_k[i];
        const uint64_t options_mask = cover & uncovered_masks[i];
        const uint64_t h = counter_hash(key.seed, key.step, key.layer, token, k);
        const NodeId n = nth_set_bit(options_mask, uniform_below(h, std::popcount(options_mask)));
        auto ranks = layout.ranks_of(row[k], n);
        out[k] = ranks[uniform_below(mix64(h), static_cast<uint32_t>(ranks.size()))];
      }
    }
  };
  const int num_threads = resolve_threads(options.num_threads);
  const int num_chunks =
      static_cast<int>(std::clamp<int64_t>(batch.num_tokens() / 8192, 1, 4 * num_threads));
  parallel_chunks(batch.num_tokens(), num_chunks, num_threads, run);
}

int min_remote_cover_size(std::span<const ExpertId> experts, NodeId src_node,
                          const ExpertLayout& layout) {
  std::array<uint64_t, kMaxTopK> masks;
  int num_uncovered = 0;
  COBALT_CHECK_ARG(experts.size() <= kMaxTopK, "cover size: {} experts > {}", experts.size(),
                   kMaxTopK);
  for (ExpertId e : experts) {
    const uint64_t mask = layout.node_mask(e);
    if (!(mask & (uint64_t{1} << src_node))) masks[num_uncovered++] = mask;
  }
  if (num_uncovered == 0) return 0;
  TokenScratch scratch;
  return std::popcount(
      choose_cover(masks.data(), num_uncovered, layout.num_nodes(), false, {}, scratch));
}

}  // namespace cobalt::assign
