// LAER-MoE (Liu et al., ASPLOS'26) as a policy: every step re-lays out every layer from the summed
// demand of the last five steps (LAER's history_capacity; its planner runs asynchronously, so the
// layout of step s never sees step s's routing), with load-proportional replica counts that fill
// every slot, node-spread greedy placement and a modelled-time choice between candidates
// (plan/laer_planner.hpp). Tokens go to replicas on their own node first, evenly, else evenly to
// all replicas (kSameNodeFirst, LAER's smart routing kernel).
#include "cobalt/plan/laer_planner.hpp"
#include "peer_policy_base.hpp"

namespace cobalt::policy {
namespace {

// LAER's dispatcher keeps the last five iterations of per-rank expert counts.
constexpr int kHistorySteps = 5;

class LaerPolicy final : public LoadBasedPeerPolicy {
 public:
  explicit LaerPolicy(const PolicyConfig& config)
      : LoadBasedPeerPolicy(config, plan::ReplicaScope::kSameNodeFirst),
        history_(config.num_layers, DemandWindow(kHistorySteps)) {
    options_.cost = cost_params();
    options_.seed = config.seed;
  }

  std::string name() const override { return "laer"; }

 protected:
  std::shared_ptr<const ExpertLayout> decide(int64_t, int layer,
                                             std::span<const int64_t>) override {
    if (history_[layer].empty()) return layout(layer);
    auto planned = plan::plan_laer(config_.topology, config_.num_experts, config_.slots_per_rank,
                                   history_[layer].sum(), options_);
    return install(layer, std::move(planned.layout));
  }

  void observe(int64_t, int layer, std::span<const int64_t> counts) override {
    history_[layer].push(counts);
  }

 private:
  std::vector<DemandWindow> history_;  // [L]
  plan::LaerOptions options_;
};

}  // namespace

std::unique_ptr<Policy> make_laer_policy(const PolicyConfig& config) {
  return std::make_unique<LaerPolicy>(config);
}

}  // namespace cobalt::policy
