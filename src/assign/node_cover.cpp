#include "cobalt/assign/node_cover.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

#include "assign_inputs.hpp"
#include "cobalt/core/environment.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/core/parallel.hpp"
#include "cobalt/core/rng.hpp"
#include "node_cover_avx512.hpp"
#include "ordered_mask_table.hpp"
#include "set_cover.hpp"

namespace cobalt::assign {
namespace {

constexpr int kMaxTopK =
    kMaxNodeCoverTopK;  // the subset DP indexes uncovered experts with 16-bit sets

// The node masks of >= 2 nodes in (popcount, value) order: the mask search's list above 8 nodes
// (the ordered mask table serves N <= 8; single-node covers are found directly). One list for every
// source node (8 MiB at N = 20), each token skipping the masks with its source node.
std::vector<uint64_t> multi_node_masks(int num_nodes) {
  std::vector<uint64_t> ordered;
  ordered.reserve((size_t{1} << num_nodes) - num_nodes - 1);
  for (uint64_t m = 0; m < (uint64_t{1} << num_nodes); ++m) {
    if (std::popcount(m) >= 2) ordered.push_back(m);
  }
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](uint64_t a, uint64_t b) { return std::popcount(a) < std::popcount(b); });
  return ordered;
}

// Picks the i-th set bit of `mask` (0-based).
inline int nth_set_bit(uint64_t mask, uint32_t i) {
  for (; i > 0; --i) mask &= mask - 1;
  return std::countr_zero(mask);
}

// A single remote node holding every uncovered expert (`common`, nonzero), drawn uniformly among
// them: the mask search's first popcount class, and the subset search's answer too.
inline uint64_t drawn_single_node(uint64_t common, uint64_t token_h) {
  const uint32_t count = static_cast<uint32_t>(std::popcount(common));
  if (count == 1) return common;
  return uint64_t{1} << nth_set_bit(common, uniform_below(cover_hash_from_token(token_h), count));
}

// The mask search above 8 nodes: among `masks` (multi_node_masks' list) without the source node
// `src_bit`, the feasible ones (meeting every uncovered expert's node mask) of the fewest nodes,
// one drawn uniformly in list order. 0 when none is feasible (never: every expert has a replica).
uint64_t drawn_multi_node_mask(const std::vector<uint64_t>& masks, uint64_t src_bit,
                               const uint64_t* uncovered_masks, int num_uncovered,
                               uint64_t token_h) {
  const auto feasible = [&](uint64_t b) {
    if (b & src_bit) return false;
    for (int i = 0; i < num_uncovered; ++i) {
      if ((b & uncovered_masks[i]) == 0) return false;
    }
    return true;
  };
  size_t first = 0;
  while (first < masks.size() && !feasible(masks[first])) ++first;
  if (first == masks.size()) return 0;
  const int size = std::popcount(masks[first]);
  uint32_t count = 1;
  for (size_t i = first + 1; i < masks.size() && std::popcount(masks[i]) == size; ++i)
    count += feasible(masks[i]) ? 1 : 0;
  if (count == 1) return masks[first];
  uint32_t r = uniform_below(cover_hash_from_token(token_h), count);
  for (size_t i = first;; ++i) {
    if (feasible(masks[i]) && r-- == 0) return masks[i];
  }
}

using TokenScratch = detail::SetCoverScratch;

// The subset search: a minimum remote node set for the uncovered experts `uncovered_masks` (node
// masks, source bit cleared; 1 <= num_uncovered <= 16). Shared by the assignment, the covers and
// min_remote_cover_size. `avx512` builds the set list in byte lanes when at most 8 experts are
// uncovered (the same list as the portable construction, so the same cover).
uint64_t choose_cover(const uint64_t* uncovered_masks, int num_uncovered, bool avx512,
                      TokenScratch& scratch) {
  const uint32_t full = (uint32_t{1} << num_uncovered) - 1;
  if (avx512 && num_uncovered <= detail::kSetListAvx512MaxElements) {
    detail::SetList list;
    detail::make_set_list_avx512(uncovered_masks, num_uncovered, list);
    return detail::min_cover_of_list(list, full, scratch);
  }
  // Only the candidate nodes' entries are read: zero those (this runs once per token).
  std::array<uint32_t, kMaxNodes> cover;
  uint64_t candidates = 0;
  for (int i = 0; i < num_uncovered; ++i) candidates |= uncovered_masks[i];
  for (uint64_t m = candidates; m; m &= m - 1) cover[std::countr_zero(m)] = 0;
  for (int i = 0; i < num_uncovered; ++i) {
    for (uint64_t m = uncovered_masks[i]; m; m &= m - 1)
      cover[std::countr_zero(m)] |= uint32_t{1} << i;
  }
  return detail::min_node_cover(full, cover, candidates, scratch);
}

// Node n relabelled as (n - shift) mod num_nodes, 0 <= shift < num_nodes <= 64.
inline uint64_t rotate_nodes(uint64_t mask, int shift, int num_nodes) {
  if (shift == 0) return mask;
  const uint64_t all = num_nodes == 64 ? ~uint64_t{0} : (uint64_t{1} << num_nodes) - 1;
  return ((mask >> shift) | (mask << (num_nodes - shift))) & all;
}

// The subset search's cover of a token that no single node covers, its ties broken without
// favouring low node ids: the nodes are relabelled cyclically from a remote node drawn uniformly
// (start = src + 1 + uniform_below(cover_hash_from_token(token_h), N - 1)), the search runs on the
// relabelled masks (its own order: the first minimum combination of the distinct, non-dominated
// node sets), and the cover is mapped back. Not uniform among the minimum covers as the mask search
// is, but every remote node is equally likely to come first. N >= 3 here (a token with two nodes
// is always covered by its one remote node).
uint64_t rotated_subset_cover(const uint64_t* uncovered_masks, int num_uncovered, int num_nodes,
                              int src_node, uint64_t token_h, bool avx512, TokenScratch& scratch) {
  const int start = static_cast<int>(
      (static_cast<uint32_t>(src_node) + 1 +
       uniform_below(cover_hash_from_token(token_h), static_cast<uint32_t>(num_nodes - 1))) %
      static_cast<uint32_t>(num_nodes));
  std::array<uint64_t, kMaxTopK> rotated;
  for (int i = 0; i < num_uncovered; ++i)
    rotated[i] = rotate_nodes(uncovered_masks[i], start, num_nodes);
  const uint64_t cover = choose_cover(rotated.data(), num_uncovered, avx512, scratch);
  return rotate_nodes(cover, (num_nodes - start) % num_nodes, num_nodes);
}

}  // namespace

namespace {

// The mask search enumerates 2^N masks per source node: refused above 20 nodes.
void check_mask_search(bool use_masks, int num_nodes) {
  COBALT_CHECK_ARG(
      !use_masks || num_nodes <= 20,
      "assignment: mask enumeration over {} nodes is infeasible; use the subset DP (N <= 20 "
      "for masks)",
      num_nodes);
}

void check_inputs(const RoutingBatch& batch, const ExpertLayout& layout,
                  std::span<const RankId> exec_rank) {
  COBALT_CHECK_ARG(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                   "assignment: output holds {} ranks, batch has {} tasks", exec_rank.size(),
                   batch.num_tasks());
  COBALT_CHECK_ARG(
      layout.num_experts() == batch.num_experts() && layout.num_ranks() == batch.num_ranks(),
      "assignment: layout has E={} G={}, batch has E={} G={}", layout.num_experts(),
      layout.num_ranks(), batch.num_experts(), batch.num_ranks());
  COBALT_CHECK_ARG(batch.top_k() <= kMaxTopK, "assignment: top-k {} out of range [1, {}]",
                   batch.top_k(), kMaxTopK);
}

}  // namespace

namespace {

using detail::AssignInputs;

// Algorithm 1 for tokens [begin, end) on N <= 8 nodes, with few data-dependent branches: the
// cover is drawn among the minimum feasible positions of the ordered mask table, and a task's node
// is a table lookup (the i-th set bit of its option byte). Draws the same numbers as the reference.
template <int kWords>
void assign_range_with_table(const AssignInputs& in, const detail::OrderedMaskTable& table,
                             const detail::SelectTable& select, int64_t begin, int64_t end) {
  const int top_k = in.top_k;
  std::array<uint64_t, kMaxTopK> masks;
  for (int64_t t = begin; t < end; ++t) {
    const ExpertId* row = in.ids + t * top_k;
    RankId* out = in.exec_rank + t * top_k;
    const int src_node = in.node_of_rank[in.src[t]];
    for (int k = 0; k < top_k; ++k) masks[k] = in.node_mask[row[k]];
    const uint64_t token_h =
        token_hash(in.prefix, static_cast<uint64_t>(in.token_offset) + static_cast<uint64_t>(t));
    const uint64_t cover = table.drawn_cover<kWords>(masks.data(), top_k, src_node, token_h);
    const uint64_t src_bit = uint64_t{1} << src_node;
    for (int k = 0; k < top_k; ++k) {
      // Its source node when local, else uniform within cover & mask; uniform_below(h, 1) == 0,
      // so single choices need no branch.
      const uint64_t options_mask = (masks[k] & src_bit) ? src_bit : (cover & masks[k]);
      const uint64_t h = task_hash_from_token(token_h, static_cast<uint64_t>(k));
      const int n = select.nth_set_bit(
          options_mask, uniform_below(h, static_cast<uint32_t>(std::popcount(options_mask))));
      const size_t idx = static_cast<size_t>(row[k]) * in.num_nodes + n;
      const int32_t first = in.node_offsets[idx];
      const uint32_t count = static_cast<uint32_t>(in.node_offsets[idx + 1] - first);
      out[k] = in.replica_ranks[first + uniform_below(mix64(h), count)];
    }
  }
}

}  // namespace

bool avx512_kernel_available() { return detail::avx512_kernel_supported(); }

CpuKernel resolve_kernel(const AssignOptions& options, int num_nodes, int top_k) {
  COBALT_CHECK_ARG(num_nodes >= 1 && num_nodes <= kMaxNodes && top_k >= 1 && top_k <= kMaxTopK,
                   "assignment: N = {} nodes and top-k {} out of range [1, {}] and [1, {}]",
                   num_nodes, top_k, kMaxNodes, kMaxTopK);
  // The kernel serves K <= 8 with the ordered mask table (the mask search on N <= 8) or with the
  // subset search (its set list in byte lanes, any N). kAuto takes it where it applies; an
  // explicit kAvx512 that cannot run is an error, never a silent fallback.
  const bool use_masks = options.search == CoverSearch::kMaskEnumeration ||
                         (options.search == CoverSearch::kAuto && num_nodes <= 8);
  static_assert(detail::kSetListAvx512MaxElements >= detail::kAvx512MaxTopK);
  const bool applies = (!use_masks || num_nodes <= detail::OrderedMaskTable::kMaxNodes) &&
                       top_k <= detail::kAvx512MaxTopK;
  switch (options.kernel) {
    case CpuKernel::kPortable:
      return CpuKernel::kPortable;
    case CpuKernel::kAuto: {
      // From the snapshot (core/environment.hpp): this may run on a worker or planning thread.
      const std::optional<std::string> env = environment_settings().cpu_kernel;
      const std::string_view choice = env ? std::string_view(*env) : std::string_view();
      COBALT_CHECK_ARG(choice.empty() || choice == "auto" || choice == "portable",
                       "assignment: COBALT_CPU_KERNEL={} is not a kernel choice; use auto or "
                       "portable (or leave it unset)",
                       choice);
      if (choice == "portable") return CpuKernel::kPortable;
      return applies && detail::avx512_kernel_supported() ? CpuKernel::kAvx512
                                                          : CpuKernel::kPortable;
    }
    case CpuKernel::kAvx512:
      COBALT_CHECK_ARG(applies,
                       "assignment: the AVX-512 kernel takes top-k in [1, {}], with the subset "
                       "search or with the mask search on 1 to {} nodes (here N = {}, K = {}); use "
                       "CpuKernel::kAuto or kPortable",
                       detail::kAvx512MaxTopK, detail::OrderedMaskTable::kMaxNodes, num_nodes,
                       top_k);
      COBALT_CHECK(detail::avx512_kernel_supported(), kFailedPrecondition,
                   "assignment: the AVX-512 kernel needs AVX-512 F, DQ, VL and BW and BMI2, "
                   "which this CPU or build lacks; use CpuKernel::kAuto or kPortable");
      return CpuKernel::kAvx512;
  }
  COBALT_CHECK_INTERNAL(false, "assignment: unknown CpuKernel {}",
                        static_cast<int>(options.kernel));
  return CpuKernel::kPortable;
}

void assign_node_cover(const RoutingBatch& batch, const ExpertLayout& layout, const AssignKey& key,
                       const AssignOptions& options, std::span<RankId> exec_rank) {
  check_inputs(batch, layout, exec_rank);
  check_threads(options.num_threads, "assignment");
  const int num_nodes = layout.num_nodes();
  const int per_node = layout.topology().ranks_per_node();
  const bool use_masks = options.search == CoverSearch::kMaskEnumeration ||
                         (options.search == CoverSearch::kAuto && num_nodes <= 8);
  check_mask_search(use_masks, num_nodes);
  const bool use_table = use_masks && num_nodes <= detail::OrderedMaskTable::kMaxNodes;
  const bool use_avx512 = resolve_kernel(options, num_nodes, batch.top_k()) == CpuKernel::kAvx512;
  const auto multi_masks =
      use_masks && !use_table ? multi_node_masks(num_nodes) : std::vector<uint64_t>{};
  const int top_k = batch.top_k();
  const ExpertId* ids = batch.topk_ids().data();
  const RankId* src = batch.source_rank().data();
  const uint64_t* node_mask = layout.node_masks().data();
  const int32_t* node_offsets = layout.node_offsets().data();
  const RankId* replica_ranks = layout.replica_ranks().data();
  const uint64_t prefix =
      counter_prefix(key.seed, static_cast<uint64_t>(key.step), static_cast<uint64_t>(key.layer));
  std::vector<NodeId> node_of_rank(layout.num_ranks());
  for (RankId r = 0; r < layout.num_ranks(); ++r) node_of_rank[r] = r / per_node;

  const int num_threads = resolve_threads(options.num_threads);
  const int num_chunks =
      static_cast<int>(std::clamp<int64_t>(batch.num_tokens() / 8192, 1, 4 * num_threads));
  if (use_table) {
    const detail::OrderedMaskTable table(num_nodes);
    const detail::SelectTable select;
    const AssignInputs in{
        ids,       src,    node_of_rank.data(), node_mask,       node_offsets, replica_ranks, top_k,
        num_nodes, prefix, key.token_offset,    exec_rank.data()};
    parallel_chunks(batch.num_tokens(), num_chunks, num_threads,
                    [&](int /*chunk*/, int64_t begin, int64_t end) {
                      if (use_avx512) return detail::assign_range_avx512(in, table, begin, end);
                      switch (table.num_words()) {
                        case 1:
                          return assign_range_with_table<1>(in, table, select, begin, end);
                        case 2:
                          return assign_range_with_table<2>(in, table, select, begin, end);
                        default:
                          return assign_range_with_table<4>(in, table, select, begin, end);
                      }
                    });
    return;
  }

  // N > 8 (or an explicit search): the enumeration over multi-node masks, or the subset DP.
  auto run = [&](int /*chunk*/, int64_t begin, int64_t end) {
    TokenScratch scratch;
    std::array<uint64_t, kMaxTopK> uncovered_masks;
    for (int64_t t = begin; t < end; ++t) {
      const NodeId src_node = node_of_rank[src[t]];
      const uint64_t src_bit = uint64_t{1} << src_node;
      const ExpertId* row = ids + t * top_k;
      RankId* out = exec_rank.data() + t * top_k;
      const uint64_t token_h =
          token_hash(prefix, static_cast<uint64_t>(key.token_offset) + static_cast<uint64_t>(t));
      // Pass 1 (branch-free): node masks, the uncovered experts, their common nodes.
      std::array<uint64_t, kMaxTopK> masks;
      int num_uncovered = 0;
      uint64_t common = ~uint64_t{0};
      for (int k = 0; k < top_k; ++k) {
        const uint64_t mask = node_mask[row[k]];
        const bool local = (mask & src_bit) != 0;
        masks[k] = mask;
        uncovered_masks[num_uncovered] = mask;
        num_uncovered += local ? 0 : 1;
        common &= local ? ~uint64_t{0} : mask;
      }
      uint64_t cover = 0;
      if (num_uncovered == 0) {
        cover = 0;
      } else if (common != 0) {
        cover = drawn_single_node(common, token_h);
      } else if (use_masks) {
        cover = drawn_multi_node_mask(multi_masks, src_bit, uncovered_masks.data(), num_uncovered,
                                      token_h);
      } else {
        cover = rotated_subset_cover(uncovered_masks.data(), num_uncovered, num_nodes, src_node,
                                     token_h, use_avx512, scratch);
      }
      // Pass 2: every task's node (its source node when local, else uniform within cover & mask)
      // and replica. uniform_below(h, 1) == 0, so single choices need no branch and draw the same
      // values as the reference.
      for (int k = 0; k < top_k; ++k) {
        const uint64_t options_mask = (masks[k] & src_bit) ? src_bit : (cover & masks[k]);
        const uint64_t h = task_hash_from_token(token_h, k);
        const NodeId n = nth_set_bit(
            options_mask, uniform_below(h, static_cast<uint32_t>(std::popcount(options_mask))));
        const size_t idx = static_cast<size_t>(row[k]) * num_nodes + n;
        const int32_t first = node_offsets[idx];
        const uint32_t count = static_cast<uint32_t>(node_offsets[idx + 1] - first);
        out[k] = replica_ranks[first + uniform_below(mix64(h), count)];
      }
    }
  };
  parallel_chunks(batch.num_tokens(), num_chunks, num_threads, run);
}

void remote_node_covers(const RoutingBatch& batch, const ExpertLayout& layout, const AssignKey& key,
                        const AssignOptions& options, std::span<uint64_t> covers) {
  COBALT_CHECK_ARG(
      layout.num_experts() == batch.num_experts() && layout.num_ranks() == batch.num_ranks(),
      "covers: layout has E={} G={}, batch has E={} G={}", layout.num_experts(), layout.num_ranks(),
      batch.num_experts(), batch.num_ranks());
  COBALT_CHECK_ARG(static_cast<int64_t>(covers.size()) == batch.num_tokens(),
                   "covers: output holds {} entries, batch has {} tokens", covers.size(),
                   batch.num_tokens());
  COBALT_CHECK_ARG(batch.top_k() <= kMaxTopK, "covers: top-k {} out of range [1, {}]",
                   batch.top_k(), kMaxTopK);
  check_threads(options.num_threads, "covers");
  const int num_nodes = layout.num_nodes();
  const int per_node = layout.topology().ranks_per_node();
  const bool use_masks = options.search == CoverSearch::kMaskEnumeration ||
                         (options.search == CoverSearch::kAuto && num_nodes <= 8);
  check_mask_search(use_masks, num_nodes);
  const bool use_table = use_masks && num_nodes <= detail::OrderedMaskTable::kMaxNodes;
  const bool use_avx512 = resolve_kernel(options, num_nodes, batch.top_k()) == CpuKernel::kAvx512;
  std::optional<detail::OrderedMaskTable> table;
  if (use_table) table.emplace(num_nodes);
  const auto multi_masks =
      use_masks && !use_table ? multi_node_masks(num_nodes) : std::vector<uint64_t>{};
  const uint64_t prefix =
      counter_prefix(key.seed, static_cast<uint64_t>(key.step), static_cast<uint64_t>(key.layer));
  const auto token_hash_of = [&](int64_t t) {
    return token_hash(prefix, static_cast<uint64_t>(key.token_offset) + static_cast<uint64_t>(t));
  };
  const int top_k = batch.top_k();
  const int num_threads = resolve_threads(options.num_threads);
  const int num_chunks =
      static_cast<int>(std::clamp<int64_t>(batch.num_tokens() / 8192, 1, 4 * num_threads));
  if (use_table) {
    // Branch-free, as in assign_range_with_table: local experts contribute all-ones words.
    const ExpertId* ids = batch.topk_ids().data();
    const RankId* src = batch.source_rank().data();
    const uint64_t* node_mask = layout.node_masks().data();
    std::vector<NodeId> node_of_rank(layout.num_ranks());
    for (RankId r = 0; r < layout.num_ranks(); ++r) node_of_rank[r] = r / per_node;
    const auto run = [&]<int kWords>(int64_t begin, int64_t end) {
      std::array<uint64_t, kMaxTopK> masks;
      uint64_t* out = covers.data();
      for (int64_t t = begin; t < end; ++t) {
        const ExpertId* row = ids + t * top_k;
        for (int k = 0; k < top_k; ++k) masks[k] = node_mask[row[k]];
        out[t] =
            table->drawn_cover<kWords>(masks.data(), top_k, node_of_rank[src[t]], token_hash_of(t));
      }
    };
    parallel_chunks(batch.num_tokens(), num_chunks, num_threads,
                    [&](int, int64_t begin, int64_t end) {
                      switch (table->num_words()) {
                        case 1:
                          return run.template operator()<1>(begin, end);
                        case 2:
                          return run.template operator()<2>(begin, end);
                        default:
                          return run.template operator()<4>(begin, end);
                      }
                    });
    return;
  }
  auto run = [&](int, int64_t begin, int64_t end) {
    TokenScratch scratch;
    std::array<uint64_t, kMaxTopK> masks;
    for (int64_t t = begin; t < end; ++t) {
      const NodeId src_node = batch.source_of(t) / per_node;
      const uint64_t src_bit = uint64_t{1} << src_node;
      int num_uncovered = 0;
      uint64_t common = ~uint64_t{0};
      for (ExpertId e : batch.experts_of(t)) {
        const uint64_t m = layout.node_mask(e);
        if (!(m & src_bit)) {
          masks[num_uncovered++] = m;
          common &= m;
        }
      }
      uint64_t cover = 0;
      if (num_uncovered == 0) {
        cover = 0;
      } else if (common != 0) {
        cover = drawn_single_node(common, token_hash_of(t));
      } else if (use_masks) {
        cover = drawn_multi_node_mask(multi_masks, src_bit, masks.data(), num_uncovered,
                                      token_hash_of(t));
      } else {
        cover = rotated_subset_cover(masks.data(), num_uncovered, num_nodes, src_node,
                                     token_hash_of(t), use_avx512, scratch);
      }
      covers[t] = cover;
    }
  };
  parallel_chunks(batch.num_tokens(), num_chunks, num_threads, run);
}

void assign_node_cover_reference(const RoutingBatch& batch, const ExpertLayout& layout,
                                 const AssignKey& key, std::span<RankId> exec_rank) {
  check_inputs(batch, layout, exec_rank);
  const int num_nodes = layout.num_nodes();
  COBALT_CHECK_ARG(num_nodes <= 20, "assignment reference: {} nodes > 20 (enumerates 2^N masks)",
                   num_nodes);
  const uint64_t prefix =
      counter_prefix(key.seed, static_cast<uint64_t>(key.step), static_cast<uint64_t>(key.layer));
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    const NodeId src_node = layout.topology().node_of(batch.source_of(t));
    auto row = batch.experts_of(t);
    const uint64_t token = static_cast<uint64_t>(key.token_offset) + static_cast<uint64_t>(t);
    // Step 1: the feasible remote-node masks with the fewest nodes, in enumeration order; one
    // drawn uniformly when several tie.
    std::vector<uint64_t> minimum;
    int best_count = num_nodes + 1;
    for (uint64_t b = 0; b < (uint64_t{1} << num_nodes); ++b) {
      if (b & (uint64_t{1} << src_node)) continue;
      bool feasible = true;
      for (ExpertId e : row) {
        const uint64_t m = layout.node_mask(e);
        if (!(m & (uint64_t{1} << src_node)) && !(m & b)) feasible = false;
      }
      if (!feasible || std::popcount(b) > best_count) continue;
      if (std::popcount(b) < best_count) minimum.clear();
      best_count = std::popcount(b);
      minimum.push_back(b);
    }
    const uint64_t best = minimum[uniform_below(cover_hash_from_token(token_hash(prefix, token)),
                                                static_cast<uint32_t>(minimum.size()))];
    // Step 2: node (uniform within the mask), then rank (uniform within the node).
    for (int k = 0; k < batch.top_k(); ++k) {
      const ExpertId e = row[k];
      const uint64_t h = task_hash(prefix, token, k);
      NodeId n = src_node;
      if (!(layout.node_mask(e) & (uint64_t{1} << src_node))) {
        const uint64_t options_mask = best & layout.node_mask(e);
        n = nth_set_bit(options_mask, uniform_below(h, std::popcount(options_mask)));
      }
      auto ranks = layout.ranks_of(e, n);
      exec_rank[t * batch.top_k() + k] =
          ranks[uniform_below(mix64(h), static_cast<uint32_t>(ranks.size()))];
    }
  }
}

int min_remote_cover_size(std::span<const ExpertId> experts, NodeId src_node,
                          const ExpertLayout& layout) {
  std::array<uint64_t, kMaxTopK> masks;
  int num_uncovered = 0;
  COBALT_CHECK_ARG(experts.size() <= kMaxTopK, "cover size: {} experts > {}", experts.size(),
                   kMaxTopK);
  COBALT_CHECK_ARG(src_node >= 0 && src_node < layout.num_nodes(),
                   "cover size: source node {} out of range [0, {})", src_node, layout.num_nodes());
  for (ExpertId e : experts) {
    COBALT_CHECK_ARG(e >= 0 && e < layout.num_experts(),
                     "cover size: expert {} out of range [0, {})", e, layout.num_experts());
  }
  for (ExpertId e : experts) {
    const uint64_t mask = layout.node_mask(e);
    if (!(mask & (uint64_t{1} << src_node))) masks[num_uncovered++] = mask;
  }
  if (num_uncovered == 0) return 0;
  const bool use_avx512 = resolve_kernel({CoverSearch::kSubsetDp}, layout.num_nodes(),
                                         num_uncovered) == CpuKernel::kAvx512;
  TokenScratch scratch;
  return std::popcount(choose_cover(masks.data(), num_uncovered, use_avx512, scratch));
}

}  // namespace cobalt::assign
