// Assignment: the execution rank of every token-expert task of a RoutingBatch.
#pragma once

#include <span>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/ids.hpp"
#include "cobalt/core/routing_batch.hpp"

namespace cobalt {

struct Assignment {
  int top_k = 0;
  std::vector<RankId> exec_rank;  // [T, K], aligned with RoutingBatch::topk_ids

  TokenIdx num_tokens() const {
    return top_k == 0 ? 0 : static_cast<TokenIdx>(exec_rank.size()) / top_k;
  }
};

// Throws kInternal naming the first task whose execution rank does not hold its expert in `layout`,
// or when the sizes disagree.
void validate_assignment(const RoutingBatch& batch, const ExpertLayout& layout,
                         std::span<const RankId> exec_rank);

}  // namespace cobalt
