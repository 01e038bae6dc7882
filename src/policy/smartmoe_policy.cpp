// SmartMoE (Zhai et al., ATC'23) as a policy: periodic greedy re-placement from recent expert
// loads, each expert with one replica or a replica on every rank (plan/smartmoe_planner.hpp).
//
// Schedule: SmartMoE-AE re-places every `dynamic_freq` iterations from the gate history of the
// last two iterations, and keeps the current mapping unless the greedy one lowers the busiest
// rank. Here the period is PolicyConfig::steps_per_global_plan (P, shared with Cobalt) and the
// first re-placement happens as soon as one step of history exists (as Cobalt's does) instead of
// at step P - 1 — a named simplification so that both start adapting at the same step.
// Routing: a fully replicated expert runs on its token's own rank; a single replica is the only
// choice (kSourceRankFirst).
#include "cobalt/plan/smartmoe_planner.hpp"
#include "peer_policy_base.hpp"

namespace cobalt::policy {
namespace {

// SmartMoE-AE accumulates the gate history over the last two iterations before a re-placement.
constexpr int kHistorySteps = 2;

class SmartMoePolicy final : public LoadBasedPeerPolicy {
 public:
  explicit SmartMoePolicy(const PolicyConfig& config)
      : LoadBasedPeerPolicy(config, plan::ReplicaScope::kSourceRankFirst, Decides::kPerStep),
        history_(config.num_layers, DemandWindow(kHistorySteps)),
        last_plan_step_(config.num_layers, -1) {}

  std::string name() const override { return "smartmoe"; }

 protected:
  std::shared_ptr<const ExpertLayout> decide(int64_t step, int layer,
                                             std::span<const int64_t>) override {
    const bool due = !history_[layer].empty() &&
                     (last_plan_step_[layer] < 0 ||
                      step - last_plan_step_[layer] >= config_.steps_per_global_plan);
    if (!due) return layout(layer);
    auto planned = plan::plan_smartmoe(*layout(layer), history_[layer].mean());
    last_plan_step_[layer] = step;
    if (!planned.changed) return layout(layer);
    return install(layer, std::move(planned.placement.layout));
  }

  void observe(int64_t step, int layer, std::span<const int64_t> counts) override {
    history_[layer].push(step, counts);
  }

 private:
  std::vector<DemandWindow> history_;    // [L]
  std::vector<int64_t> last_plan_step_;  // [L]
};

}  // namespace

std::unique_ptr<Policy> make_smartmoe_policy(const PolicyConfig& config) {
  return std::make_unique<SmartMoePolicy>(config);
}

}  // namespace cobalt::policy
