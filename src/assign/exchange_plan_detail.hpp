// Internal: the two ways exchange_plan (include/cobalt/assign/exchange_plan.hpp) finds each
// token's distinct execution ranks, exposed for the test that compares them.
#pragma once

#include <span>

#include "cobalt/assign/exchange_plan.hpp"

namespace cobalt::assign::detail {

// use_rank_masks: one 64-bit mask per token (needs G <= 64; the step's whole-step totals come
// from bit counts, and only the tokens that touch `rank` are walked delivery by delivery, in the
// masks' bit order); otherwise an insertion sort of every token's K ranks. The same plan either
// way; exchange_plan uses masks whenever G <= 64.
RankExchangePlan exchange_plan_impl(std::span<const ExpertId> topk_ids,
                                    std::span<const RankId> exec_rank,
                                    std::span<const RankId> source_rank, int top_k,
                                    const Topology& topology, std::span<const ExpertId> rank_slots,
                                    RankId rank, bool use_rank_masks);

}  // namespace cobalt::assign::detail
