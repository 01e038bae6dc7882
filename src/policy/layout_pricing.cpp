#include "cobalt/policy/layout_pricing.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/eval/metrics.hpp"

namespace cobalt::policy {
namespace {

eval::LinkBytes scaled(eval::LinkBytes bytes, double scale) {
  for (auto* v : {&bytes.node_out, &bytes.node_in, &bytes.rank_out, &bytes.rank_in}) {
    for (double& x : *v) x *= scale;
  }
  return bytes;
}

}  // namespace

LayoutPrice price_layout(const RoutingBatch& sample, std::span<const RankId> exec_rank,
                         double step_scale, const ExpertLayout& current,
                         std::span<const RankId> current_mains, const ExpertLayout& candidate,
                         const eval::CostParams& params, int amortisation_steps) {
  COBALT_CHECK_ARG(step_scale >= 0 && amortisation_steps >= 1,
                   "price_layout: step_scale {} must be >= 0 and amortisation_steps {} >= 1",
                   step_scale, amortisation_steps);
  const Topology& topology = candidate.topology();
  COBALT_CHECK_ARG(sample.num_ranks() == topology.num_ranks() &&
                       sample.num_experts() == candidate.num_experts() &&
                       static_cast<int64_t>(exec_rank.size()) == sample.num_tasks(),
                   "price_layout: sample of G={} E={} with {} ranks for {} tasks does not match "
                   "the layout's G={} E={}",
                   sample.num_ranks(), sample.num_experts(), exec_rank.size(), sample.num_tasks(),
                   topology.num_ranks(), candidate.num_experts());
  LayoutPrice price;
  const auto volume = eval::exchange_volume(sample, exec_rank, topology);
  const double exchange_s =
      eval::link_time(scaled(eval::exchange_bytes(volume, params.token_bytes()), step_scale),
                      params)
          .time_s();
  std::vector<int64_t> loads = eval::rank_loads(exec_rank, topology.num_ranks());
  for (int64_t& l : loads) l = std::llround(static_cast<double>(l) * step_scale);
  price.layer_s = eval::layer_time(eval::compute_time(loads, params), exchange_s, params);

  COBALT_CHECK_ARG(static_cast<int>(current_mains.size()) == candidate.num_experts(),
                   "price_layout: {} main ranks for {} experts", current_mains.size(),
                   candidate.num_experts());
  const auto& old_mains = current_mains;
  const auto new_mains = eval::next_main_ranks(candidate, old_mains);
  price.grad_sync_s =
      eval::link_time(eval::grad_sync_bytes(candidate, new_mains, params), params).time_s();
  if (!(current == candidate)) {
    price.migration_s = eval::link_time(eval::migration_bytes(diff(current, candidate), old_mains,
                                                              new_mains, topology, params),
                                        params)
                            .time_s();
  }
  price.per_step_s = price.layer_s + price.grad_sync_s + price.migration_s / amortisation_steps;
  return price;
}

ExpertLayout widen_slots(const ExpertLayout& layout, int slots_per_rank) {
  COBALT_CHECK_ARG(slots_per_rank >= layout.slots_per_rank(),
                   "widen_slots: {} slots per rank is fewer than the layout's {}", slots_per_rank,
                   layout.slots_per_rank());
  if (slots_per_rank == layout.slots_per_rank()) return layout;
  // Same slot positions (so per-slot data stays aligned), empty slots appended to every rank.
  std::vector<ExpertId> slots(static_cast<size_t>(layout.num_ranks()) * slots_per_rank, kEmptySlot);
  for (RankId r = 0; r < layout.num_ranks(); ++r) {
    const auto row = layout.slots_of(r);
    std::copy(row.begin(), row.end(), slots.begin() + static_cast<size_t>(r) * slots_per_rank);
  }
  return ExpertLayout(layout.topology(), layout.num_experts(), slots_per_rank, std::move(slots));
}

double change_gain_s(const ExpertLayout& current, std::span<const RankId> current_mains,
                     const ExpertLayout& candidate, double saved_tasks_per_step,
                     int64_t amortisation_steps, const eval::CostParams& params) {
  COBALT_CHECK_ARG(amortisation_steps >= 1, "change_gain_s: amortisation_steps {} must be >= 1",
                   amortisation_steps);
  COBALT_CHECK_ARG(std::isfinite(saved_tasks_per_step),
                   "change_gain_s: saved_tasks_per_step {} must be finite", saved_tasks_per_step);
  const double seconds_per_task = params.flops_per_task() / params.achievable_flops;
  const auto new_mains = eval::next_main_ranks(candidate, current_mains);
  const double added_sync_s =
      eval::link_time(eval::grad_sync_bytes(candidate, new_mains, params), params).time_s() -
      eval::link_time(eval::grad_sync_bytes(current, current_mains, params), params).time_s();
  const double saved_s = saved_tasks_per_step * seconds_per_task - added_sync_s;
  const double copy_s =
      eval::link_time(eval::migration_bytes(diff(current, candidate), current_mains, new_mains,
                                            current.topology(), params),
                      params)
          .time_s();
  return saved_s * static_cast<double>(amortisation_steps) - copy_s;
}

bool change_pays(const ExpertLayout& current, std::span<const RankId> current_mains,
                 const ExpertLayout& candidate, double saved_tasks_per_step,
                 int64_t amortisation_steps, const eval::CostParams& params) {
  return change_gain_s(current, current_mains, candidate, saved_tasks_per_step, amortisation_steps,
                       params) > 0;
}

bool some_change_may_pay(const ExpertLayout& current, std::span<const RankId> current_mains,
                         double max_saved_tasks_per_step, int64_t amortisation_steps,
                         const eval::CostParams& params) {
  COBALT_CHECK_ARG(amortisation_steps >= 1,
                   "some_change_may_pay: amortisation_steps {} must be >= 1", amortisation_steps);
  COBALT_CHECK_ARG(std::isfinite(max_saved_tasks_per_step),
                   "some_change_may_pay: max_saved_tasks_per_step {} must be finite",
                   max_saved_tasks_per_step);
  const double seconds_per_task = params.flops_per_task() / params.achievable_flops;
  const double sync_s =
      eval::link_time(eval::grad_sync_bytes(current, current_mains, params), params).time_s();
  // One parameter copy: within a node over NVLink, across nodes over the node's fabric.
  const double min_copy_s = params.expert_param_bytes() /
                            std::max(params.nvlink_bytes_per_s, params.ib_bytes_per_s_per_node);
  const double max_saved_s = std::max(0.0, max_saved_tasks_per_step) * seconds_per_task + sync_s;
  return max_saved_s * static_cast<double>(amortisation_steps) > min_copy_s;
}

}  // namespace cobalt::policy
