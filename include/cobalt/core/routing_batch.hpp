// RoutingBatch: a non-owning view of one step of one MoE layer's routing — T tokens, each with K
// distinct expert ids in [0, E), and the rank each token comes from. It holds spans, not copies:
// the arrays must outlive the batch and every call it is passed to (policies and planners read it
// during the call and keep nothing of it). T = 0 is a valid, empty batch. Routers that drop tokens
// over an expert's capacity or pad rows with -1 must pass only the kept (token, expert) rows: a
// -1 id is refused like any other id out of range.
#pragma once

#include <cstdint>
#include <span>

#include "cobalt/core/ids.hpp"

namespace cobalt {

class RoutingBatch {
 public:
  // topk_ids: [T, K] row-major; source_rank: [T], each in [0, num_ranks).
  // Validates once: num_experts in [1, 65536], sizes agree, K >= 1, every id in [0, num_experts),
  // ids distinct within a row, every source rank in range. Throws kInvalidArgument naming the
  // first token with a bad id or, when every id is good, the first with a bad source rank.
  RoutingBatch(std::span<const ExpertId> topk_ids, std::span<const RankId> source_rank, int top_k,
               int num_experts, int num_ranks);

  // Same view without validation, for data that was validated on load (e.g. a Trace).
  static RoutingBatch trusted(std::span<const ExpertId> topk_ids,
                              std::span<const RankId> source_rank, int top_k, int num_experts,
                              int num_ranks);

  TokenIdx num_tokens() const { return num_tokens_; }
  int top_k() const { return top_k_; }
  int num_experts() const { return num_experts_; }
  int num_ranks() const { return num_ranks_; }
  int64_t num_tasks() const { return num_tokens_ * top_k_; }

  std::span<const ExpertId> topk_ids() const { return topk_ids_; }
  std::span<const RankId> source_rank() const { return source_rank_; }
  // The K expert ids of token t: [K].
  std::span<const ExpertId> experts_of(TokenIdx t) const {
    return topk_ids_.subspan(static_cast<size_t>(t) * top_k_, top_k_);
  }
  RankId source_of(TokenIdx t) const { return source_rank_[static_cast<size_t>(t)]; }

  // A view of tokens [begin, end).
  RoutingBatch slice(TokenIdx begin, TokenIdx end) const;

 private:
  RoutingBatch() = default;
  std::span<const ExpertId> topk_ids_;
  std::span<const RankId> source_rank_;
  TokenIdx num_tokens_ = 0;
  int top_k_ = 0;
  int num_experts_ = 0;
  int num_ranks_ = 0;
};

// Checks that every row of topk_ids [T, K] holds K distinct ids in [0, num_experts); throws
// kInvalidArgument naming `what`, the token and the value otherwise.
void validate_topk_rows(std::span<const ExpertId> topk_ids, int top_k, int num_experts,
                        const char* what);

// Default source ranks when a trace has none: token i of a step of T_s tokens comes from rank
// floor(i * G / T_s) (contiguous blocks, as under data parallelism). Writes [T_s] entries to out.
// Throws kInvalidArgument unless T_s >= 0, G >= 1 and out holds T_s entries or more.
void contiguous_source_ranks(TokenIdx num_tokens, int num_ranks, std::span<RankId> out);

}  // namespace cobalt
