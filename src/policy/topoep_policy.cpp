// TopoEP (TopoEP paper §4.3): per (step, layer), after gating, the two-stage solver turns the
// routing matrix Omega [G, E] of this very batch into a replica placement and per-(source rank,
// expert, destination rank) task quotas (plan/topoep_solver.hpp). The policy then turns quotas into
// a per-task assignment deterministically: the tasks of source rank s on expert e, in token index
// order, fill the quotas q[s, e, r] in ascending destination rank. Nothing carries over between
// steps (every microbatch is planned afresh from its own routing), so it is load-based: on
// load-only traces the quotas give the rank loads directly.
//
// Counters: max_solver_calls counts solver calls; planner_wall_ms is their total wall time (solve
// plus building the ExpertLayout), so planner_wall_ms / max_solver_calls is the time per call.
#include <algorithm>

#include "cobalt/core/error.hpp"
#include "cobalt/plan/topoep_solver.hpp"
#include "demand_matrix.hpp"
#include "policy_registry.hpp"
#include "wall_timer.hpp"

namespace cobalt::policy {
namespace {

class TopoEpPolicy final : public Policy {
 public:
  explicit TopoEpPolicy(const PolicyConfig& config)
      : config_(config),
        demand_(static_cast<size_t>(config.topology.num_ranks()) * config.num_experts, 0) {}

  std::string name() const override { return "topoep"; }
  bool needs_token_ids() const override { return false; }

  std::shared_ptr<const ExpertLayout> do_run(int64_t, int layer, const RoutingBatch& batch,
                                          std::span<RankId> exec_rank) override {
    check_shape(layer, batch.num_experts(), batch.num_ranks());
    COBALT_CHECK_ARG(exec_rank.size() == static_cast<size_t>(batch.num_tasks()),
                     "policy topoep: exec_rank has {} entries, expected {}", exec_rank.size(),
                     batch.num_tasks());
    count_demand(batch, demand_);
    auto layout = plan(demand_);
    assign(batch, exec_rank);
    return layout;
  }

  std::shared_ptr<const ExpertLayout> do_run_loads(int64_t, int layer, std::span<const int64_t> counts,
                                                std::span<int64_t> rank_loads) override {
    const int num_ranks = config_.topology.num_ranks();
    check_shape(layer, config_.num_experts, num_ranks);
    check_counts(counts, num_ranks, config_.num_experts, "topoep");
    COBALT_CHECK_ARG(rank_loads.size() == static_cast<size_t>(num_ranks),
                     "policy topoep: rank_loads has {} entries, expected {}", rank_loads.size(),
                     num_ranks);
    auto layout = plan(counts);
    std::copy(plan_.rank_loads.begin(), plan_.rank_loads.end(), rank_loads.begin());
    return layout;
  }

 private:
  void check_shape(int layer, int num_experts, int num_ranks) const {
    COBALT_CHECK_ARG(layer >= 0 && layer < config_.num_layers,
                     "policy topoep: layer {} out of range [0, {})", layer, config_.num_layers);
    COBALT_CHECK_ARG(
        num_experts == config_.num_experts && num_ranks == config_.topology.num_ranks(),
        "policy topoep: batch has {} experts on {} ranks, configured for {} on {}", num_experts,
        num_ranks, config_.num_experts, config_.topology.num_ranks());
  }

  std::shared_ptr<const ExpertLayout> plan(std::span<const int64_t> demand) {
    WallTimer timer(counters_.planner_wall_ms);
    plan::TopoEpInput input{config_.topology,    config_.num_experts,        config_.slots_per_rank,
                            config_.token_bytes, config_.expert_param_bytes, demand};
    solver_.solve(input, plan_);
    counters_.max_solver_calls += 1;
    counters_.intra_node_moves += plan_.stats.num_intra_node_replicas;
    counters_.cross_node_moves += plan_.stats.num_inter_node_replicas;
    return std::make_shared<const ExpertLayout>(config_.topology, config_.num_experts,
                                                config_.slots_per_rank, plan_.slots);
  }

  // Tokens of (s, e) in index order fill q[s, e, r] in ascending r.
  void assign(const RoutingBatch& batch, std::span<RankId> exec_rank) {
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

  PolicyConfig config_;
  plan::TopoEpSolver solver_;
  plan::TopoEpPlan plan_;
  std::vector<int64_t> demand_;     // Omega [G, E]
  std::vector<int64_t> cursor_;     // [G, E]: current quota index of (s, e)
  std::vector<int64_t> remaining_;  // per quota
};

}  // namespace

std::unique_ptr<Policy> make_topoep_policy(const PolicyConfig& config) {
  return std::make_unique<TopoEpPolicy>(config);
}

}  // namespace cobalt::policy
