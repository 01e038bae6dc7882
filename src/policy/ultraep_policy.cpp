// UltraEP (Dots-Infra/UltraEP): per (step, layer), after gating, the quota placement of
// plan/ultraep_solver.hpp replicates hot experts inside their NVLink domain (node) from this
// batch's exact loads, then every task is rerouted to an instance by UltraEP's locality-aware
// per-source split and interleaved reroute. Nothing carries over between steps; on load-only traces
// the per-source splits give the rank loads directly.
//
// One adaptation (docs/peers.md): UltraEP's fixed per-replica floor of 1024 tokens
// (ULTRA_EP_QUOTA_MIN_TOKENS_PER_REPLICA, used when its fast oracle fails) is sized for production
// microbatches — 1/64 of a rank's mean load at 8192 tokens per rank and top-8. Simulated steps are
// much smaller, so the floor is that same fraction of this batch's mean rank load (at least 1).
// All other knobs keep UltraEP's defaults. Weight sync, relays and gradient reduction are not
// modelled beyond the move counters (each batch's replica copies from static EP).
#include <algorithm>

#include "cobalt/core/error.hpp"
#include "cobalt/plan/ultraep_solver.hpp"
#include "per_batch_policy.hpp"
#include "policy_registry.hpp"
#include "wall_timer.hpp"

namespace cobalt::policy {
namespace {

constexpr int64_t kMeanLoadPerFloor = 64;  // floor = mean rank load / 64 (1024 at 65536 tasks)

class UltraEpPolicy final : public PerBatchPolicy {
 public:
  explicit UltraEpPolicy(const PolicyConfig& config) : PerBatchPolicy(config) {}

  std::string name() const override { return "ultraep"; }

 private:
  std::span<const int64_t> planned_rank_loads() const override { return plan_.rank_loads; }

  std::shared_ptr<const ExpertLayout> plan(std::span<const int64_t> demand) override {
    WallTimer timer(counters_.planner_wall_ms);
    int64_t total = 0;
    for (int64_t c : demand) total += c;
    plan::UltraEpInput input;
    input.topology = config_.topology;
    input.num_experts = config_.num_experts;
    input.slots_per_rank = config_.slots_per_rank;
    input.demand = demand;
    input.options.min_tokens_per_replica =
        std::max<int64_t>(1, total / config_.topology.num_ranks() / kMeanLoadPerFloor);
    plan_ = plan::solve_ultraep(input);
    counters_.max_solver_calls += 1;
    return std::make_shared<const ExpertLayout>(config_.topology, config_.num_experts,
                                                config_.slots_per_rank, plan_.slots);
  }

  // UltraEP's reroute: the k-th task of (s, e) takes interleaved slot k of its allocations.
  void assign(const RoutingBatch& batch, std::span<RankId> exec_rank) override {
    const int num_experts = config_.num_experts, top_k = batch.top_k();
    ordinal_.assign(demand_.size(), 0);
    for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
      const size_t row = static_cast<size_t>(batch.source_of(t)) * num_experts;
      auto experts = batch.experts_of(t);
      for (int k = 0; k < top_k; ++k) {
        const ExpertId e = experts[k];
        const plan::UltraEpInstance* inst = plan_.instances.data() + plan_.instance_offsets[e];
        const int64_t at = plan_.alloc_index[row + e];
        RankId rank = inst[0].rank;
        if (at >= 0) {
          const int num_inst = plan_.instance_offsets[e + 1] - plan_.instance_offsets[e];
          const auto il = plan::ultraep_interleave(e, demand_[row + e]);
          const int64_t slot = il.slot(ordinal_[row + e]++);
          int64_t prefix = 0;
          int j = 0;
          for (; j < num_inst - 1; ++j) {
            prefix += plan_.alloc[at + j];
            if (slot < prefix) break;
          }
          rank = inst[j].rank;
        }
        exec_rank[static_cast<size_t>(t) * top_k + k] = rank;
      }
    }
  }

  plan::UltraEpPlan plan_;
  std::vector<int64_t> ordinal_;  // [G, E]: tasks of (s, e) rerouted so far
};

}  // namespace

std::unique_ptr<Policy> make_ultraep_policy(const PolicyConfig& config) {
  return std::make_unique<UltraEpPolicy>(config);
}

}  // namespace cobalt::policy
