#include "cobalt/core/routing_batch.hpp"

#include <cstdint>
#include <vector>

#include "cobalt/core/error.hpp"
#include "topk_rows_check.hpp"

namespace cobalt {

void validate_topk_rows(std::span<const ExpertId> topk_ids, int top_k, int num_experts,
                        const char* what) {
  COBALT_CHECK_ARG(top_k >= 1 && top_k <= num_experts, "{}: top-k {} out of range [1, {}]", what,
                   top_k, num_experts);
  COBALT_CHECK_ARG(topk_ids.size() % static_cast<size_t>(top_k) == 0,
                   "{}: {} expert ids is not a multiple of top-k {}", what, topk_ids.size(), top_k);
  if (detail::topk_rows_valid(topk_ids, top_k, num_experts)) return;
  detail::validate_topk_rows_reference(topk_ids, top_k, num_experts, what);
  COBALT_CHECK_INTERNAL(false, "{}: the fast check refused rows the reference accepts", what);
}

void contiguous_source_ranks(TokenIdx num_tokens, int num_ranks, std::span<RankId> out) {
  COBALT_CHECK_ARG(num_tokens >= 0, "contiguous_source_ranks: number of tokens {} must be >= 0",
                   num_tokens);
  COBALT_CHECK_ARG(num_ranks >= 1, "contiguous_source_ranks: number of ranks {} must be >= 1",
                   num_ranks);
  COBALT_CHECK_ARG(static_cast<TokenIdx>(out.size()) >= num_tokens,
                   "contiguous_source_ranks: output holds {} entries, need {}", out.size(),
                   num_tokens);
  for (TokenIdx i = 0; i < num_tokens; ++i) {
    out[static_cast<size_t>(i)] = static_cast<RankId>((i * num_ranks) / num_tokens);
  }
}

RoutingBatch::RoutingBatch(std::span<const ExpertId> topk_ids, std::span<const RankId> source_rank,
                           int top_k, int num_experts, int num_ranks) {
  COBALT_CHECK_ARG(num_experts >= 1 && num_experts <= kMaxExperts,
                   "routing batch: number of experts {} out of range [1, {}]", num_experts,
                   kMaxExperts);
  COBALT_CHECK_ARG(num_ranks >= 1, "routing batch: number of ranks {} must be >= 1", num_ranks);
  validate_topk_rows(topk_ids, top_k, num_experts, "routing batch");
  const size_t num_tokens = topk_ids.size() / top_k;
  COBALT_CHECK_ARG(source_rank.size() == num_tokens, "routing batch: {} source ranks for {} tokens",
                   source_rank.size(), num_tokens);
  if (!detail::ranks_valid(source_rank, num_ranks)) {
    for (size_t t = 0; t < num_tokens; ++t) {
      COBALT_CHECK_ARG(source_rank[t] >= 0 && source_rank[t] < num_ranks,
                       "routing batch: token {} has source rank {} out of range [0, {})", t,
                       source_rank[t], num_ranks);
    }
    COBALT_CHECK_INTERNAL(false, "routing batch: the fast check refused source ranks in range");
  }
  *this = trusted(topk_ids, source_rank, top_k, num_experts, num_ranks);
}

RoutingBatch RoutingBatch::trusted(std::span<const ExpertId> topk_ids,
                                   std::span<const RankId> source_rank, int top_k, int num_experts,
                                   int num_ranks) {
  RoutingBatch batch;
  batch.topk_ids_ = topk_ids;
  batch.source_rank_ = source_rank;
  batch.top_k_ = top_k;
  batch.num_experts_ = num_experts;
  batch.num_ranks_ = num_ranks;
  batch.num_tokens_ = static_cast<TokenIdx>(source_rank.size());
  COBALT_CHECK_INTERNAL(topk_ids.size() == source_rank.size() * static_cast<size_t>(top_k),
                        "routing batch: {} ids for {} tokens x top-k {}", topk_ids.size(),
                        source_rank.size(), top_k);
  return batch;
}

RoutingBatch RoutingBatch::slice(TokenIdx begin, TokenIdx end) const {
  COBALT_CHECK_ARG(0 <= begin && begin <= end && end <= num_tokens_,
                   "routing batch slice [{}, {}) out of range [0, {}]", begin, end, num_tokens_);
  return trusted(topk_ids_.subspan(static_cast<size_t>(begin) * top_k_,
                                   static_cast<size_t>(end - begin) * top_k_),
                 source_rank_.subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin)),
                 top_k_, num_experts_, num_ranks_);
}

}  // namespace cobalt
