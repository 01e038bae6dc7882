#include "cobalt/core/assignment.hpp"

#include "cobalt/core/error.hpp"

namespace cobalt {

void validate_assignment(const RoutingBatch& batch, const ExpertLayout& layout,
                         std::span<const RankId> exec_rank) {
  COBALT_CHECK_INTERNAL(static_cast<int64_t>(exec_rank.size()) == batch.num_tasks(),
                        "assignment has {} tasks, batch has {}", exec_rank.size(),
                        batch.num_tasks());
  COBALT_CHECK_INTERNAL(batch.num_experts() == layout.num_experts(),
                        "assignment of a batch with E = {} checked against a layout with E = {}",
                        batch.num_experts(), layout.num_experts());
  auto ids = batch.topk_ids();
  for (size_t i = 0; i < ids.size(); ++i) {
    const RankId r = exec_rank[i];
    COBALT_CHECK_INTERNAL(r >= 0 && r < layout.num_ranks(),
                          "task {} (token {}, expert {}) assigned to rank {} out of range [0, {})",
                          i, i / batch.top_k(), ids[i], r, layout.num_ranks());
    COBALT_CHECK_INTERNAL(
        layout.holds(r, ids[i]),
        "task {} (token {}, expert {}) assigned to rank {} which does not hold it", i,
        i / batch.top_k(), ids[i], r);
  }
}

}  // namespace cobalt
