#include "peer_policy_base.hpp"

#include <algorithm>

#include "cobalt/core/error.hpp"
#include "wall_timer.hpp"

namespace cobalt::policy {

LoadBasedPeerPolicy::LoadBasedPeerPolicy(const PolicyConfig& config, plan::ReplicaScope scope,
                                         Decides decides)
    : config_(config), scope_(scope), decides_(decides) {
  auto initial = std::make_shared<const ExpertLayout>(
      ExpertLayout::static_ep(config.topology, config.num_experts, config.slots_per_rank));
  layouts_.assign(config.num_layers, initial);
  last_step_.assign(config.num_layers, -1);
}

std::shared_ptr<const ExpertLayout> LoadBasedPeerPolicy::step(int64_t step, int layer,
                                                              std::span<const int64_t> counts) {
  COBALT_CHECK_ARG(layer >= 0 && layer < config_.num_layers,
                   "policy {}: layer {} out of range [0, {})", name(), layer, config_.num_layers);
  // A later call of the step (micro-batch): the layout decided at the step's first call stays.
  if (step == last_step_[layer] && decides_ == Decides::kPerStep) return layout(layer);
  std::shared_ptr<const ExpertLayout> in_force;
  {
    WallTimer timer(counters_.planner_wall_ms);
    in_force = decide(step, layer, counts);
  }
  last_step_[layer] = step;  // after deciding: a decision that threw is made again by a retry
  return in_force;
}

std::shared_ptr<const ExpertLayout> LoadBasedPeerPolicy::do_run(int64_t step, int layer,
                                                                const RoutingBatch& batch,
                                                                std::span<RankId> exec_rank) {
  const auto counts = plan::count_demand(batch);
  auto in_force = this->step(step, layer, counts);
  plan::route_tokens(batch, *in_force, scope_, exec_rank);
  observe(step, layer, counts);
  return in_force;
}

std::shared_ptr<const ExpertLayout> LoadBasedPeerPolicy::do_run_loads(
    int64_t step, int layer, std::span<const int64_t> counts, std::span<int64_t> rank_loads) {
  auto in_force = this->step(step, layer, counts);
  plan::route_counts(counts, *in_force, scope_, rank_loads);
  observe(step, layer, counts);
  return in_force;
}

const std::shared_ptr<const ExpertLayout>& LoadBasedPeerPolicy::install(int layer,
                                                                        ExpertLayout next) {
  auto& current = layouts_[layer];
  if (next == *current) return current;
  const LayoutDiff moves = diff(*current, next);
  // The same replicas in another slot order (FasterMoE and LAER list them by hotness): nothing
  // moves, so the layout in force stays and no re-layout is counted.
  if (moves.moves.empty() && moves.num_removed == 0) return current;
  counters_.cross_node_moves += moves.num_cross_node;
  counters_.intra_node_moves += moves.num_intra_node;
  counters_.num_global_plans += 1;
  current = std::make_shared<const ExpertLayout>(std::move(next));
  return current;
}

void DemandWindow::push(int64_t step, std::span<const int64_t> counts) {
  // A call without tasks is no observation: it would dilute the window's demand.
  if (std::all_of(counts.begin(), counts.end(), [](int64_t c) { return c == 0; })) return;
  if (!steps_.empty() && back_step_ == step) {
    COBALT_CHECK_INTERNAL(steps_.back().size() == counts.size(),
                          "demand window: {} counts for a step of {}", counts.size(),
                          steps_.back().size());
    auto& back = steps_.back();
    for (size_t i = 0; i < counts.size(); ++i) back[i] += counts[i];
    return;
  }
  steps_.emplace_back(counts.begin(), counts.end());
  back_step_ = step;
  while (static_cast<int>(steps_.size()) > capacity_) steps_.pop_front();
}

std::vector<double> DemandWindow::sum() const {
  std::vector<double> out(steps_.empty() ? 0 : steps_.front().size(), 0.0);
  for (const auto& counts : steps_) {
    for (size_t i = 0; i < out.size(); ++i) out[i] += static_cast<double>(counts[i]);
  }
  return out;
}

std::vector<double> DemandWindow::mean() const {
  auto out = sum();
  for (double& v : out) v /= static_cast<double>(steps_.size());
  return out;
}

}  // namespace cobalt::policy
