// One rank's node-deduplicated dispatch/combine plan: the index arrays the PyTorch runtime's
// two-stage exchange (python/cobalt/torch/exchange_plan.py, which documents the routes) needs for
// one layer's step. The numpy build_exchange_plan_reference there is the reference this equals
// field for field (python/tests/test_exchange_plan.py compares them on random routings).
//
// Routes, for a token t from source rank s (node ns = s / M, M ranks per node) and each distinct
// execution rank d of its K tasks (a *delivery* (t, d)):
//   d == s             local: nothing moves;
//   node(d) == ns      intra: dispatch stage 1 s -> d; combine stage A d -> s;
//   node(d) != ns      remote: the token crosses once per (token, node) to the rail peer
//                      p = node(d) * M + s % M (stage 1 s -> p), which forwards it to d when d != p
//                      (stage 2); combine stage A d -> p when d != p, stage B p -> s (one row per
//                      (token, remote node), the partials of the node summed at p).
// Every message list is ordered by token within one (sender, receiver) pair; a receive buffer
// holds the senders' rows by sender rank (all_to_all_single), so a row's position is fixed by
// (sender, token). Cost: for G <= 64, O(T K) to build one rank mask per token, whole-step totals
// by bit counts, and a walk over the deliveries of only the tokens that touch `rank` (its own,
// those it executes for, those it relays as rail peer); for G > 64, O(T K^2) (an insertion sort
// of each token's K ranks) and every token walked. O(T K) memory.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/ids.hpp"
#include "cobalt/core/topology.hpp"

namespace cobalt::assign {

// Row indices are int64; splits are per-peer row counts [G]. T_r: this rank's tokens; R: rows of
// its token table (the tokens it runs tasks for, by token).
struct RankExchangePlan {
  int64_t num_local_tokens = 0;  // T_r
  // Dispatch.
  std::vector<int64_t> s1_send_idx;  // local token of each stage-1 row, by (receiver, token)
  std::vector<int64_t> s1_send_splits, s1_recv_splits;
  std::vector<int64_t> s2_send_idx;  // stage-1 receive row forwarded, by (receiver, token)
  std::vector<int64_t> s2_send_splits, s2_recv_splits;
  std::vector<int64_t> table_idx;  // [R] row of cat(local tokens, stage-1 recv, stage-2 recv)
  // Tasks of this rank per local slot j: table rows and top-k positions, in (token, k) order,
  // CSR: slot j's tasks are [slot_offsets[j], slot_offsets[j + 1]).
  std::vector<int64_t> slot_offsets;  // [S + 1]
  std::vector<int64_t> slot_rows, slot_k;
  // Combine.
  std::vector<int64_t> ca_send_idx;  // table row of each stage-A row, by (receiver, token)
  std::vector<int64_t> ca_send_splits, ca_recv_splits;
  std::vector<int64_t> q_own_dst, q_own_src;    // stage-B row <- own table row (as rail peer)
  std::vector<int64_t> q_recv_dst, q_recv_src;  // stage-B row <- stage-A receive row
  std::vector<int64_t> cb_send_splits, cb_recv_splits;
  std::vector<int64_t> y_own_dst, y_own_src;        // local token <- own table row
  std::vector<int64_t> y_recv_a_dst, y_recv_a_src;  // local token <- stage-A receive row
  std::vector<int64_t> y_recv_b_dst;                // local token of each stage-B receive row
  // Whole-step message counts (the same on every rank).
  int64_t num_deliveries = 0;
  int64_t num_cross_rows = 0;  // stage-1 (and stage-B) rows across nodes: Cobalt's V
  int64_t num_intra_rows = 0;  // intra deliveries + stage-2 forwards (= stage-A rows)
  int64_t num_stage1_rows = 0;

  friend bool operator==(const RankExchangePlan&, const RankExchangePlan&) = default;
};

// topk_ids, exec_rank [T, K]; source_rank [T] non-decreasing (tokens of rank 0 first, then rank 1,
// ...), every rank in [0, G); rank_slots [S]: the expert of each slot of `rank` (kEmptySlot for an
// empty one). Throws kInvalidArgument naming the first bad entry when sizes disagree, a rank is
// out of range, source ranks decrease, or `rank` runs a task whose expert none of its slots holds.
RankExchangePlan exchange_plan(std::span<const ExpertId> topk_ids,
                               std::span<const RankId> exec_rank,
                               std::span<const RankId> source_rank, int top_k,
                               const Topology& topology, std::span<const ExpertId> rank_slots,
                               RankId rank);

}  // namespace cobalt::assign
