// FlexMoE (Nie et al., SIGMOD'23) as a policy: before each step, while the expected balance ratio
// (max / min rank load) exceeds 1 + eps, apply up to 10 Expand / Shrink / Migrate primitives
// (plan/flexmoe_planner.hpp) to the layout in force, planned from the previous step's expert loads
// (FlexMoE reacts to the loads it monitors; the most recent step is the freshest estimate). Tokens
// of an expert split evenly over all its replicas, wherever they are (kAllReplicas).
//
// The threshold is the harness's load tolerance eps (PolicyConfig::eps), a named choice: the
// paper leaves it to the user, and LAER-MoE's port hard-codes a ratio of 1 (schedule while any
// imbalance is left, up to its 10 iterations).
#include <algorithm>

#include "cobalt/plan/flexmoe_planner.hpp"
#include "peer_policy_base.hpp"

namespace cobalt::policy {
namespace {

// Primitives per scheduling call (the port's max_iteration).
constexpr int kMaxOpsPerStep = 10;

class FlexMoePolicy final : public LoadBasedPeerPolicy {
 public:
  explicit FlexMoePolicy(const PolicyConfig& config)
      : LoadBasedPeerPolicy(config, plan::ReplicaScope::kAllReplicas, Decides::kPerStep),
        last_load_(config.num_layers),
        last_load_step_(config.num_layers, -1) {}

  std::string name() const override { return "flexmoe"; }

 protected:
  std::shared_ptr<const ExpertLayout> decide(int64_t, int layer,
                                             std::span<const int64_t>) override {
    if (last_load_[layer].empty()) return layout(layer);
    plan::FlexMoeOptions options;
    options.balance_threshold = 1.0 + config_.eps;
    options.max_ops = kMaxOpsPerStep;
    auto schedule = plan::flexmoe_schedule(*layout(layer), last_load_[layer], options);
    return install(layer, std::move(schedule.layout));
  }

  void observe(int64_t step, int layer, std::span<const int64_t> counts) override {
    // A call without tasks is no observation: keep the last step that had some. Later calls of
    // the step (micro-batches) add to its loads.
    if (std::all_of(counts.begin(), counts.end(), [](int64_t c) { return c == 0; })) return;
    auto& load = last_load_[layer];
    if (last_load_step_[layer] != step) load.assign(config_.num_experts, 0.0);
    last_load_step_[layer] = step;
    for (size_t i = 0; i < counts.size(); ++i) load[i % config_.num_experts] += counts[i];
  }

 private:
  std::vector<std::vector<double>> last_load_;  // [L][E] expert loads of the previous step
  std::vector<int64_t> last_load_step_;         // [L] the step last_load_ holds, -1 before
};

}  // namespace

std::unique_ptr<Policy> make_flexmoe_policy(const PolicyConfig& config) {
  return std::make_unique<FlexMoePolicy>(config);
}

}  // namespace cobalt::policy
