// FasterMoE (He et al., PPoPP'22) as a policy: experts stay where static EP puts them; after
// gating, every (step, layer) shadows the hot experts its cost model selects on every rank
// (plan/fastermoe_planner.hpp), within the free slots of the replica budget. A shadowed expert runs
// on its token's own rank; any other expert on its only rank (kSourceRankFirst).
//
// The shadow broadcast happens every iteration in FasterMoE; the move counters here count only
// replicas that differ from the previous step's layout of the layer (the same accounting as every
// other policy; the simulator charges replica synchronisation separately).
#include "cobalt/plan/fastermoe_planner.hpp"
#include "peer_policy_base.hpp"

namespace cobalt::policy {
namespace {

class FasterMoePolicy final : public LoadBasedPeerPolicy {
 public:
  explicit FasterMoePolicy(const PolicyConfig& config)
      : LoadBasedPeerPolicy(config, plan::ReplicaScope::kSourceRankFirst, Decides::kPerCall),
        base_(ExpertLayout::static_ep(config.topology, config.num_experts, config.slots_per_rank)),
        model_(plan::ShadowModel::from(cost_params())) {}

  std::string name() const override { return "fastermoe"; }

 protected:
  std::shared_ptr<const ExpertLayout> decide(int64_t, int layer,
                                             std::span<const int64_t> counts) override {
    std::vector<double> load(config_.num_experts, 0.0);
    for (size_t i = 0; i < counts.size(); ++i) load[i % config_.num_experts] += counts[i];
    auto shadows = plan::choose_shadows(load, model_);
    shadows.resize(plan::fitting_shadow_prefix(base_, shadows));
    auto shadowed = plan::shadow_layout(base_, shadows);
    counters_.max_solver_calls += 1;
    return install(layer, std::move(shadowed));
  }

 private:
  ExpertLayout base_;
  plan::ShadowModel model_;
};

}  // namespace

std::unique_ptr<Policy> make_fastermoe_policy(const PolicyConfig& config) {
  return std::make_unique<FasterMoePolicy>(config);
}

}  // namespace cobalt::policy
