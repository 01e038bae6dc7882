// Static EP: expert e on rank floor(e * G / E), one replica, never changes. Tokens travel once per
// destination node (DeepEP-style node dedup; the metric reports the no-dedup count too).
#include <algorithm>

#include "cobalt/assign/node_cover.hpp"
#include "policy_registry.hpp"

namespace cobalt::policy {
namespace {

class StaticPolicy final : public Policy {
 public:
  explicit StaticPolicy(const PolicyConfig& config)
      : config_(config),
        layout_(std::make_shared<const ExpertLayout>(
            ExpertLayout::static_ep(config.topology, config.num_experts, config.slots_per_rank))) {}

  std::string name() const override { return "static"; }
  bool needs_token_ids() const override { return false; }

  std::shared_ptr<const ExpertLayout> do_run(int64_t step, int layer, const RoutingBatch& batch,
                                             std::span<RankId> exec_rank) override {
    // One replica per expert: every task runs on the expert's only rank.
    auto ids = batch.topk_ids();
    for (size_t i = 0; i < ids.size(); ++i) exec_rank[i] = layout_->ranks_of(ids[i])[0];
    return layout_;
  }

  std::shared_ptr<const ExpertLayout> do_run_loads(int64_t, int, std::span<const int64_t> counts,
                                                   std::span<int64_t> rank_loads) override {
    const int num_experts = config_.num_experts, num_ranks = config_.topology.num_ranks();
    std::fill(rank_loads.begin(), rank_loads.end(), 0);
    for (RankId src = 0; src < num_ranks; ++src) {
      for (ExpertId e = 0; e < num_experts; ++e) {
        rank_loads[layout_->ranks_of(e)[0]] += counts[static_cast<size_t>(src) * num_experts + e];
      }
    }
    return layout_;
  }

 private:
  PolicyConfig config_;
  std::shared_ptr<const ExpertLayout> layout_;
};

}  // namespace

std::unique_ptr<Policy> make_static_policy(const PolicyConfig& config) {
  return std::make_unique<StaticPolicy>(config);
}

}  // namespace cobalt::policy
