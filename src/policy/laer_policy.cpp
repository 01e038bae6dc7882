// LAER-MoE (Liu et al., ASPLOS'26) as a policy: every step re-lays out every layer from the summed
// demand of the last five steps (LAER's history_capacity; its planner runs asynchronously, so the
// layout of step s never sees step s's routing), with load-proportional replica counts that fill
// every slot, node-spread greedy placement and a modelled-time choice between candidates
// (plan/laer_planner.hpp). Tokens go to replicas on their own node first, evenly, else evenly to
// all replicas (kSameNodeFirst, LAER's smart routing kernel).
//
// Simplifications (named; docs/peers.md "LAER-MoE"): step 0 runs static EP (LAER starts from its
// own replicated default placement), and re-layouts are charged as replica copies like any
// policy's, although LAER's fully sharded experts are all-gathered every step anyway, so the
// cost model overstates its migration time.
#include "cobalt/core/rng.hpp"
#include "cobalt/plan/laer_planner.hpp"
#include "peer_policy_base.hpp"

namespace cobalt::policy {
namespace {

// LAER's dispatcher keeps the last five iterations of per-rank expert counts.
constexpr int kHistorySteps = 5;

class LaerPolicy final : public LoadBasedPeerPolicy {
 public:
  explicit LaerPolicy(const PolicyConfig& config)
      : LoadBasedPeerPolicy(config, plan::ReplicaScope::kSameNodeFirst, Decides::kPerStep),
        history_(config.num_layers, DemandWindow(kHistorySteps)) {
    options_.cost = cost_params();
  }

  std::string name() const override { return "laer"; }

 protected:
  std::shared_ptr<const ExpertLayout> decide(int64_t step, int layer,
                                             std::span<const int64_t>) override {
    if (history_[layer].empty()) return layout(layer);
    // Perturbations (off by default) draw from a stream keyed by (seed, step, layer), as every
    // random choice here is; LAER's own solver reseeds mt19937(2333) on every call.
    options_.seed =
        counter_prefix(config_.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(layer));
    auto planned = plan::plan_laer(config_.topology, config_.num_experts, config_.slots_per_rank,
                                   history_[layer].sum(), options_);
    return install(layer, std::move(planned.layout));
  }

  void observe(int64_t step, int layer, std::span<const int64_t> counts) override {
    history_[layer].push(step, counts);
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
