// Internal: the driver shared by the load-based peers (SmartMoE, FasterMoE, FlexMoE, LAER-MoE).
// Each (step, layer): count this step's demand [G, E] -> decide() the layout (timed as planner
// time) -> route tasks over replicas by the peer's even-split scope (plan/replica_routing.hpp) ->
// observe() the demand for later plans. The same path serves per-token batches (run) and load-only
// traces (run_loads), so both give identical rank loads. Every layer starts from static EP.
//
// Micro-batches (a step given in several calls, gradient accumulation): a peer that plans from
// history (kPerStep) decides at the step's first call only, so its layout does not move within
// the step, and its observe() folds the later calls into the step's observation (DemandWindow
// does by step); a peer that plans after gating (FasterMoE, kPerCall) decides every call from
// that call's counts, as its shadowing runs per forward pass.
#pragma once

#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "cobalt/plan/peer_cost.hpp"
#include "cobalt/plan/replica_routing.hpp"
#include "policy_registry.hpp"

namespace cobalt::policy {

class LoadBasedPeerPolicy : public Policy {
 public:
  enum class Decides { kPerStep, kPerCall };
  LoadBasedPeerPolicy(const PolicyConfig& config, plan::ReplicaScope scope, Decides decides);

  bool needs_token_ids() const override { return false; }

  std::shared_ptr<const ExpertLayout> do_run(int64_t step, int layer, const RoutingBatch& batch,
                                             std::span<RankId> exec_rank) override;
  std::shared_ptr<const ExpertLayout> do_run_loads(int64_t step, int layer,
                                                   std::span<const int64_t> counts,
                                                   std::span<int64_t> rank_loads) override;

 protected:
  // The layout in force for (step, layer). counts: this step's demand [G, E] after gating; only a
  // policy that plans after gating (FasterMoE) may read it, the others plan from observe()d
  // history. Return layout(layer) to keep the current one, or the result of install().
  virtual std::shared_ptr<const ExpertLayout> decide(int64_t step, int layer,
                                                     std::span<const int64_t> counts) = 0;
  // This call's demand [G, E], after routing; a step's later calls (micro-batches) come with the
  // same step and belong to its observation.
  virtual void observe(int64_t step, int layer, std::span<const int64_t> counts) {}

  const std::shared_ptr<const ExpertLayout>& layout(int layer) const { return layouts_[layer]; }
  // Makes `next` the layout of `layer` when it differs from the current one, counting the replica
  // moves (diff) and one applied re-layout; returns the layout in force.
  const std::shared_ptr<const ExpertLayout>& install(int layer, ExpertLayout next);

  plan::PeerCostParams cost_params() const {
    return plan::PeerCostParams::from(config_.topology, config_.token_bytes,
                                      config_.expert_param_bytes, config_.gemm_flops_per_s);
  }

  const PolicyConfig config_;

 private:
  std::shared_ptr<const ExpertLayout> step(int64_t step, int layer,
                                           std::span<const int64_t> counts);
  plan::ReplicaScope scope_;
  Decides decides_;
  std::vector<std::shared_ptr<const ExpertLayout>> layouts_;  // [L]
  std::vector<int64_t> last_step_;                            // [L] last step run, -1 before
};

// The demand [G, E] of the last `capacity` steps (oldest dropped first). A call without tasks is
// no observation; calls of one step (micro-batches) add up to that step's entry.
class DemandWindow {
 public:
  explicit DemandWindow(int capacity) : capacity_(capacity) {}
  void push(int64_t step, std::span<const int64_t> counts);
  bool empty() const { return steps_.empty(); }
  int size() const { return static_cast<int>(steps_.size()); }
  std::vector<double> sum() const;   // [G, E] summed over the window
  std::vector<double> mean() const;  // [G, E] averaged over the window

 private:
  int capacity_;
  std::deque<std::vector<int64_t>> steps_;
  int64_t back_step_ = -1;  // the step of steps_.back()
};

}  // namespace cobalt::policy
