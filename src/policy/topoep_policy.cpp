// TopoEP (TopoEP paper §4.3): per (step, layer), after gating, the two-stage solver turns the
// routing matrix Omega [G, E] of this very batch into a replica placement and per-(source rank,
// expert, destination rank) task quotas (plan/topoep_solver.hpp). The policy then turns quotas into
// a per-task assignment deterministically: the tasks of source rank s on expert e, in token index
// order, fill the quotas q[s, e, r] in ascending destination rank. Nothing carries over between
// steps (every microbatch is planned afresh from its own routing), so it is load-based: on
// load-only traces the quotas give the rank loads directly.
//
// Counters: max_solver_calls counts solver calls; planner_wall_ms is their total wall time (solve
// plus building the ExpertLayout), so planner_wall_ms / max_solver_calls is the time per call;
// the move counters are each batch's replica copies from static EP (per_batch_policy.hpp).
#include <algorithm>

#include "cobalt/core/error.hpp"
#include "cobalt/plan/topoep_solver.hpp"
#include "per_batch_policy.hpp"
#include "policy_registry.hpp"
#include "wall_timer.hpp"

namespace cobalt::policy {
namespace {

class TopoEpPolicy final : public PerBatchPolicy {
 public:
  explicit TopoEpPolicy(const PolicyConfig& config) : PerBatchPolicy(config) {}

  std::string name() const override { return "topoep"; }

 private:
  std::span<const int64_t> planned_rank_loads() const override { return plan_.rank_loads; }

  std::shared_ptr<const ExpertLayout> plan(std::span<const int64_t> demand) override {
    WallTimer timer(counters_.planner_wall_ms);
    plan::TopoEpInput input{config_.topology,    config_.num_experts,        config_.slots_per_rank,
                            config_.token_bytes, config_.expert_param_bytes, demand};
    solver_.solve(input, plan_);
    counters_.max_solver_calls += 1;
    return std::make_shared<const ExpertLayout>(config_.topology, config_.num_experts,
                                                config_.slots_per_rank, plan_.slots);
  }

  // Tokens of (s, e) in index order fill q[s, e, r] in ascending r.
  void assign(const RoutingBatch& batch, std::span<RankId> exec_rank) override {
    const int num_experts = config_.num_experts;
    cursor_.assign(demand_.size(), -1);
    remaining_.resize(plan_.quotas.size());
    for (RankId s = 0; s < config_.topology.num_ranks(); ++s) {
      for (int64_t i = plan_.source_offsets[s]; i < plan_.source_offsets[s + 1]; ++i) {
        const auto& q = plan_.quotas[i];
        remaining_[i] = q.count;
        int64_t& c = cursor_[static_cast<size_t>(s) * num_experts + q.expert];
        if (c < 0) c = i;
      }
    }
    const int top_k = batch.top_k();
    for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
      const size_t row = static_cast<size_t>(batch.source_of(t)) * num_experts;
      auto experts = batch.experts_of(t);
      for (int k = 0; k < top_k; ++k) {
        int64_t& c = cursor_[row + experts[k]];
        while (remaining_[c] == 0) ++c;  // quotas of (s, e) are contiguous, sum to its tasks
        remaining_[c] -= 1;
        exec_rank[static_cast<size_t>(t) * top_k + k] = plan_.quotas[c].dst;
      }
    }
  }

  plan::TopoEpSolver solver_;
  plan::TopoEpPlan plan_;
  std::vector<int64_t> cursor_;     // [G, E]: current quota index of (s, e)
  std::vector<int64_t> remaining_;  // per quota
};

}  // namespace

std::unique_ptr<Policy> make_topoep_policy(const PolicyConfig& config) {
  return std::make_unique<TopoEpPolicy>(config);
}

}  // namespace cobalt::policy
