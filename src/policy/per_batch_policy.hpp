// Internal: the shape shared by the per-microbatch policies (TopoEP, UltraEP). Each (step, layer)
// is planned afresh from this batch's own demand matrix Omega [G, E] (tasks of source rank s on
// expert e), then tasks are turned into execution ranks from the plan. Nothing carries over between
// steps, so the same plan serves load-only traces (the plan's rank loads are the answer there).
// Policy::run / run_loads have already validated E, K, G, the layer and the output sizes.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "cobalt/policy/policy.hpp"
#include "demand_matrix.hpp"

namespace cobalt::policy {

class PerBatchPolicy : public Policy {
 public:
  explicit PerBatchPolicy(const PolicyConfig& config) : config_(config) {}

  bool needs_token_ids() const override { return false; }

 protected:
  std::shared_ptr<const ExpertLayout> do_run(int64_t, int, const RoutingBatch& batch,
                                             std::span<RankId> exec_rank) final {
    // Sized on first use: a policy built only to check its configuration holds no [G, E] table.
    demand_.resize(static_cast<size_t>(config_.topology.num_ranks()) * config_.num_experts);
    count_demand(batch, demand_);
    auto layout = plan(demand_);
    count_replica_copies(*layout);
    assign(batch, exec_rank);
    return layout;
  }

  std::shared_ptr<const ExpertLayout> do_run_loads(int64_t, int, std::span<const int64_t> counts,
                                                   std::span<int64_t> rank_loads) final {
    const std::string policy_name = name();
    check_counts(counts, config_.topology.num_ranks(), config_.num_experts, policy_name.c_str());
    auto layout = plan(counts);
    count_replica_copies(*layout);
    const auto loads = planned_rank_loads();
    std::copy(loads.begin(), loads.end(), rank_loads.begin());
    return layout;
  }

  // Plans from Omega [G, E] and returns the layout in force for this batch.
  virtual std::shared_ptr<const ExpertLayout> plan(std::span<const int64_t> demand) = 0;
  // Writes exec_rank [T, K] for the batch the last plan() was made from.
  virtual void assign(const RoutingBatch& batch, std::span<RankId> exec_rank) = 0;
  // Tasks per rank [G] of the last plan.
  virtual std::span<const int64_t> planned_rank_loads() const = 0;

  PolicyConfig config_;
  std::vector<int64_t> demand_;  // Omega [G, E] of the current batch

 private:
  // The move counters of a per-batch policy: the replica copies this batch's layout needs from
  // static EP (every expert's home, where its weights live between batches), classified as
  // diff() classifies any layout change (one inter-node copy per (expert, node), NVLink copies
  // within a node). Counted from the layout in force, so only replicas it holds count.
  void count_replica_copies(const ExpertLayout& layout) {
    if (!home_) {
      home_ = std::make_unique<const ExpertLayout>(
          ExpertLayout::static_ep(config_.topology, config_.num_experts, config_.slots_per_rank));
    }
    const LayoutDiff copies = diff(*home_, layout);
    counters_.cross_node_moves += copies.num_cross_node;
    counters_.intra_node_moves += copies.num_intra_node;
  }

  std::unique_ptr<const ExpertLayout> home_;  // static EP, made by the first batch
};

}  // namespace cobalt::policy
