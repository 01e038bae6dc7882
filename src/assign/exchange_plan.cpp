#include "cobalt/assign/exchange_plan.hpp"

#include <algorithm>
#include <bit>
#include <numeric>
#include <utility>

#include "cobalt/core/error.hpp"
#include "exchange_plan_detail.hpp"

namespace cobalt::assign {
namespace {

void check_inputs(std::span<const ExpertId> topk_ids, std::span<const RankId> exec_rank,
                  std::span<const RankId> source_rank, int top_k, const Topology& topology,
                  RankId rank) {
  const int num_ranks = topology.num_ranks();
  COBALT_CHECK_ARG(top_k >= 1, "exchange plan: top_k {} must be >= 1", top_k);
  const auto num_tasks = static_cast<int64_t>(source_rank.size()) * top_k;
  COBALT_CHECK_ARG(static_cast<int64_t>(topk_ids.size()) == num_tasks &&
                       static_cast<int64_t>(exec_rank.size()) == num_tasks,
                   "exchange plan: {} expert ids and {} execution ranks for {} tokens x K = {}",
                   topk_ids.size(), exec_rank.size(), source_rank.size(), top_k);
  COBALT_CHECK_ARG(rank >= 0 && rank < num_ranks, "exchange plan: rank {} out of range [0, {})",
                   rank, num_ranks);
  RankId previous = 0;
  for (size_t t = 0; t < source_rank.size(); ++t) {
    const RankId s = source_rank[t];
    COBALT_CHECK_ARG(s >= 0 && s < num_ranks,
                     "exchange plan: source rank {} of token {} out of range [0, {})", s, t,
                     num_ranks);
    COBALT_CHECK_ARG(s >= previous,
                     "exchange plan: source ranks must be non-decreasing (token {} has {} after "
                     "{})",
                     t, s, previous);
    previous = s;
  }
  for (size_t i = 0; i < exec_rank.size(); ++i) {
    COBALT_CHECK_ARG(exec_rank[i] >= 0 && exec_rank[i] < num_ranks,
                     "exchange plan: execution rank {} of token {} (position {}) out of range "
                     "[0, {})",
                     exec_rank[i], i / top_k, i % top_k, num_ranks);
  }
}

// Exclusive prefix sums of per-peer counts: the first row of each peer's block.
std::vector<int64_t> block_starts(const std::vector<int64_t>& counts) {
  std::vector<int64_t> starts(counts.size(), 0);
  std::exclusive_scan(counts.begin(), counts.end(), starts.begin(), int64_t{0});
  return starts;
}

}  // namespace

namespace detail {

RankExchangePlan exchange_plan_impl(std::span<const ExpertId> topk_ids,
                                    std::span<const RankId> exec_rank,
                                    std::span<const RankId> source_rank, int top_k,
                                    const Topology& topology, std::span<const ExpertId> rank_slots,
                                    RankId rank, bool use_rank_masks) {
  check_inputs(topk_ids, exec_rank, source_rank, top_k, topology, rank);
  COBALT_CHECK_ARG(!use_rank_masks || topology.num_ranks() <= 64,
                   "exchange plan: rank masks need G <= 64 ranks, got {}", topology.num_ranks());
  const int num_ranks = topology.num_ranks(), per_node = topology.ranks_per_node();
  const auto num_tokens = static_cast<int64_t>(source_rank.size());
  const RankId r = rank;
  const auto first_local = static_cast<int64_t>(
      std::lower_bound(source_rank.begin(), source_rank.end(), r) - source_rank.begin());
  const auto end_local = static_cast<int64_t>(
      std::upper_bound(source_rank.begin(), source_rank.end(), r) - source_rank.begin());

  // Distinct execution ranks of every token, ascending (so a node's ranks are adjacent). With
  // G <= 64 a bit mask per token (its set bits in order); otherwise an insertion sort of the K
  // ranks, duplicates dropped.
  std::vector<uint64_t> masks;
  std::vector<RankId> distinct;
  std::vector<int> num_distinct;
  if (use_rank_masks) {
    masks.resize(num_tokens);
    for (int64_t t = 0; t < num_tokens; ++t) {
      uint64_t m = 0;
      for (int k = 0; k < top_k; ++k) m |= uint64_t{1} << exec_rank[t * top_k + k];
      masks[t] = m;
    }
  } else {
    distinct.resize(exec_rank.size());
    num_distinct.resize(num_tokens);
    for (int64_t t = 0; t < num_tokens; ++t) {
      RankId* row = distinct.data() + t * top_k;
      const RankId* in = exec_rank.data() + t * top_k;
      int n = 0;
      for (int k = 0; k < top_k; ++k) {
        const RankId d = in[k];
        int i = n;
        while (i > 0 && row[i - 1] > d) --i;
        if (i > 0 && row[i - 1] == d) continue;
        std::copy_backward(row + i, row + n, row + n + 1);
        row[i] = d;
        ++n;
      }
      num_distinct[t] = n;
    }
  }
  // Calls f(t, s, d, p, new_pair) for every delivery (t, d) of token t, d ascending; p is the
  // rail peer of a remote delivery (-1 otherwise), new_pair marks its first delivery on that node.
  const auto for_each_delivery_of = [&](int64_t t, auto&& f) {
    const RankId s = source_rank[t];
    const int source_node = s / per_node;
    int last_node = -1;
    const auto visit = [&](RankId d) {
      const int node = d / per_node;
      if (node == source_node) {
        f(t, s, d, RankId{-1}, false);
      } else {
        const RankId p = node * per_node + s % per_node;
        f(t, s, d, p, node != last_node);
        last_node = node;
      }
    };
    if (use_rank_masks) {
      for (uint64_t m = masks[t]; m != 0; m &= m - 1) visit(std::countr_zero(m));
    } else {
      const RankId* row = distinct.data() + t * top_k;
      for (int i = 0; i < num_distinct[t]; ++i) visit(row[i]);
    }
  };
  // With masks: the ranks of each node and the ranks of each local index (rail), as bits.
  const int num_nodes = topology.num_nodes();
  std::vector<uint64_t> node_bits, rail_bits;
  if (use_rank_masks) {
    node_bits.assign(num_nodes, 0);
    rail_bits.assign(per_node, 0);
    for (RankId d = 0; d < num_ranks; ++d) {
      node_bits[d / per_node] |= uint64_t{1} << d;
      rail_bits[d % per_node] |= uint64_t{1} << d;
    }
  }

  RankExchangePlan plan;
  plan.num_local_tokens = end_local - first_local;
  for (auto* splits :
       {&plan.s1_send_splits, &plan.s1_recv_splits, &plan.s2_send_splits, &plan.s2_recv_splits,
        &plan.ca_send_splits, &plan.ca_recv_splits, &plan.cb_send_splits, &plan.cb_recv_splits}) {
    splits->assign(num_ranks, 0);
  }
  // Per-token positions at this rank (-1: none): its stage-1 receive row, its token-table row,
  // and its stage-B row as rail peer. A token sends at most one stage-1 row to a rank.
  std::vector<int64_t> stage1_row(num_tokens, -1), table_row(num_tokens, -1),
      rail_row(num_tokens, -1);
  int64_t num_stage1_recv = 0, num_table = 0, num_rail = 0;

  // Pass 1: whole-step totals over every token; per-peer counts and positions in token order
  // over the tokens that touch this rank (source, executor or rail peer), listed for pass 2.
  std::vector<int64_t> touching;
  int64_t num_intra = 0, num_pairs = 0, num_forwards = 0;
  const int r_node = r / per_node, r_lane = r % per_node;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const RankId s = source_rank[t];
    bool touches = s == r;
    if (use_rank_masks) {
      // The same totals by bit counts: intra deliveries are the other ranks of the source's
      // node; remote ones cross once per node touched and are forwarded unless they are the rail
      // peer itself. This rank is touched as an executor, or as the rail peer of a remote node.
      const uint64_t m = masks[t];
      const int source_node = s / per_node;
      const uint64_t others = m & ~(uint64_t{1} << s);
      const uint64_t remote = others & ~node_bits[source_node];
      const uint64_t rail = rail_bits[s % per_node];
      plan.num_deliveries += std::popcount(m);
      num_intra += std::popcount(others & node_bits[source_node]);
      num_forwards += std::popcount(remote & ~rail);
      // One per remote node touched: clear a node's bits at a time.
      for (uint64_t x = remote; x != 0; x &= ~node_bits[std::countr_zero(x) / per_node]) {
        ++num_pairs;
      }
      touches |=
          ((m >> r) & 1) != 0 || (r_lane == s % per_node && (remote & node_bits[r_node]) != 0);
    } else {
      for_each_delivery_of(t, [&](int64_t, RankId s_, RankId d, RankId p, bool new_pair) {
        if (d == s_) return;
        num_intra += p < 0;
        num_pairs += new_pair;
        num_forwards += p >= 0 && d != p;
        touches |= d == r || p == r;
      });
      plan.num_deliveries += num_distinct[t];
    }
    if (!touches) continue;
    touching.push_back(t);
    for_each_delivery_of(t, [&](int64_t, RankId, RankId d, RankId p, bool new_pair) {
      if (d == r) table_row[t] = num_table++;
      if (d == s) return;
      if (p < 0) {  // intra: stage 1 s -> d, stage A d -> s
        if (s == r) {
          ++plan.s1_send_splits[d];
          ++plan.ca_recv_splits[d];
        }
        if (d == r) {
          stage1_row[t] = num_stage1_recv++;
          ++plan.s1_recv_splits[s];
          ++plan.ca_send_splits[s];
        }
        return;
      }
      if (new_pair) {  // stage 1 s -> p, stage B p -> s
        if (s == r) {
          ++plan.s1_send_splits[p];
          ++plan.cb_recv_splits[p];
        }
        if (p == r) {
          stage1_row[t] = num_stage1_recv++;
          ++plan.s1_recv_splits[s];
          rail_row[t] = num_rail++;
          ++plan.cb_send_splits[s];
        }
      }
      if (d != p) {  // stage 2 p -> d, stage A d -> p
        if (p == r) {
          ++plan.s2_send_splits[d];
          ++plan.ca_recv_splits[d];
        }
        if (d == r) {
          ++plan.s2_recv_splits[p];
          ++plan.ca_send_splits[p];
        }
      }
    });
  }
  plan.num_cross_rows = num_pairs;
  plan.num_intra_rows = num_intra + num_forwards;
  plan.num_stage1_rows = num_intra + num_pairs;

  // Pass 2: rows bucketed by peer (each bucket in token order) and receive positions.
  auto s1_next = block_starts(plan.s1_send_splits);
  auto s2_next = block_starts(plan.s2_send_splits);
  auto ca_next = block_starts(plan.ca_send_splits);
  auto stage2_next = block_starts(plan.s2_recv_splits);   // receive rows by (sender p, token)
  auto stage_a_next = block_starts(plan.ca_recv_splits);  // receive rows by (sender d, token)
  auto b_next = block_starts(plan.cb_recv_splits);        // stage-B receive rows by (p, token)
  plan.s1_send_idx.resize(
      std::accumulate(plan.s1_send_splits.begin(), plan.s1_send_splits.end(), int64_t{0}));
  plan.s2_send_idx.resize(
      std::accumulate(plan.s2_send_splits.begin(), plan.s2_send_splits.end(), int64_t{0}));
  plan.ca_send_idx.resize(
      std::accumulate(plan.ca_send_splits.begin(), plan.ca_send_splits.end(), int64_t{0}));
  plan.y_recv_b_dst.resize(
      std::accumulate(plan.cb_recv_splits.begin(), plan.cb_recv_splits.end(), int64_t{0}));
  plan.table_idx.resize(num_table);
  const int64_t local_rows = plan.num_local_tokens;
  const auto fill = [&](int64_t t, RankId s, RankId d, RankId p, bool new_pair) {
    const int64_t local_t = t - first_local;
    if (d == s) {
      if (d == r) {
        plan.table_idx[table_row[t]] = local_t;
        plan.y_own_dst.push_back(local_t);
        plan.y_own_src.push_back(table_row[t]);
      }
      return;
    }
    if (p < 0) {
      if (s == r) {
        plan.s1_send_idx[s1_next[d]++] = local_t;
        plan.y_recv_a_dst.push_back(local_t);
        plan.y_recv_a_src.push_back(stage_a_next[d]++);
      }
      if (d == r) {
        plan.table_idx[table_row[t]] = local_rows + stage1_row[t];
        plan.ca_send_idx[ca_next[s]++] = table_row[t];
      }
      return;
    }
    if (new_pair && s == r) {
      plan.s1_send_idx[s1_next[p]++] = local_t;
      plan.y_recv_b_dst[b_next[p]++] = local_t;
    }
    if (d == p) {
      if (d == r) {
        plan.table_idx[table_row[t]] = local_rows + stage1_row[t];
        plan.q_own_dst.push_back(rail_row[t]);
        plan.q_own_src.push_back(table_row[t]);
      }
      return;
    }
    if (p == r) {
      plan.s2_send_idx[s2_next[d]++] = stage1_row[t];
      plan.q_recv_dst.push_back(rail_row[t]);
      plan.q_recv_src.push_back(stage_a_next[d]++);
    }
    if (d == r) {
      plan.table_idx[table_row[t]] = local_rows + num_stage1_recv + stage2_next[p]++;
      plan.ca_send_idx[ca_next[p]++] = table_row[t];
    }
  };
  for (int64_t t : touching) for_each_delivery_of(t, fill);

  // This rank's tasks per local slot, in (token, k) order. Slots looked up by expert in a sorted
  // list of (expert, slot) pairs (S entries; expert ids are not bounded here).
  std::vector<std::pair<ExpertId, int>> slot_of;
  for (size_t j = 0; j < rank_slots.size(); ++j) {
    const ExpertId e = rank_slots[j];
    if (e == kEmptySlot) continue;
    COBALT_CHECK_ARG(e >= 0, "exchange plan: slot {} of rank {} holds expert {} (not an id)", j, r,
                     e);
    slot_of.emplace_back(e, static_cast<int>(j));
  }
  std::sort(slot_of.begin(), slot_of.end());
  for (size_t i = 1; i < slot_of.size(); ++i) {
    COBALT_CHECK_ARG(slot_of[i].first != slot_of[i - 1].first,
                     "exchange plan: rank {} holds expert {} in slots {} and {}", r,
                     slot_of[i].first, slot_of[i - 1].second, slot_of[i].second);
  }
  const auto slot_of_task = [&](size_t i) {
    const ExpertId e = topk_ids[i];
    const auto it =
        std::lower_bound(slot_of.begin(), slot_of.end(), std::pair<ExpertId, int>{e, -1});
    COBALT_CHECK_ARG(it != slot_of.end() && it->first == e,
                     "exchange plan: rank {} executes expert {} (token {}) but does not hold it "
                     "in the layout",
                     r, e, i / top_k);
    return it->second;
  };
  plan.slot_offsets.assign(rank_slots.size() + 1, 0);
  for (size_t i = 0; i < exec_rank.size(); ++i) {
    if (exec_rank[i] == r) ++plan.slot_offsets[slot_of_task(i) + 1];
  }
  std::partial_sum(plan.slot_offsets.begin(), plan.slot_offsets.end(), plan.slot_offsets.begin());
  std::vector<int64_t> slot_next(plan.slot_offsets.begin(), plan.slot_offsets.end() - 1);
  plan.slot_rows.resize(plan.slot_offsets.back());
  plan.slot_k.resize(plan.slot_offsets.back());
  for (size_t i = 0; i < exec_rank.size(); ++i) {
    if (exec_rank[i] != r) continue;
    const int64_t at = slot_next[slot_of_task(i)]++;
    plan.slot_rows[at] = table_row[i / top_k];
    plan.slot_k[at] = static_cast<int64_t>(i % top_k);
  }
  return plan;
}

}  // namespace detail

RankExchangePlan exchange_plan(std::span<const ExpertId> topk_ids,
                               std::span<const RankId> exec_rank,
                               std::span<const RankId> source_rank, int top_k,
                               const Topology& topology, std::span<const ExpertId> rank_slots,
                               RankId rank) {
  return detail::exchange_plan_impl(topk_ids, exec_rank, source_rank, top_k, topology, rank_slots,
                                    rank, topology.num_ranks() <= 64);
}

}  // namespace cobalt::assign
