#include "cobalt/plan/fastermoe_planner.hpp"

#include <algorithm>
#include <numeric>

#include "cobalt/core/error.hpp"

namespace cobalt::plan {

ShadowModel ShadowModel::from(const PeerCostParams& cost) {
  ShadowModel m;
  m.compute_s_per_token = cost.compute_s_per_token();
  m.feature_s_per_token = cost.token_bytes / cost.net_bytes_per_s;
  m.model_s = cost.expert_param_bytes / cost.net_bytes_per_s;
  return m;
}

std::vector<ExpertId> choose_shadows(std::span<const double> expert_load,
                                     const ShadowModel& model) {
  const int num_experts = static_cast<int>(expert_load.size());
  std::vector<ExpertId> order(num_experts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](ExpertId a, ExpertId b) { return expert_load[a] > expert_load[b]; });
  std::vector<ExpertId> shadows;
  if (num_experts == 0) return shadows;
  double lat_last = model.latency(expert_load[order[0]], 0);
  for (int i = 0; i + 1 < num_experts; ++i) {
    const double lat_new = model.latency(expert_load[order[i + 1]], i + 1);
    if (!(lat_new < lat_last)) break;
    lat_last = lat_new;
    shadows.push_back(order[i]);
  }
  return shadows;
}

namespace {

// Shadows are distinct experts of `base` (kInvalidArgument naming the first that is not).
void check_shadows(const ExpertLayout& base, std::span<const ExpertId> shadows, const char* where) {
  std::vector<char> seen(base.num_experts(), 0);
  for (size_t i = 0; i < shadows.size(); ++i) {
    const ExpertId e = shadows[i];
    COBALT_CHECK_ARG(e >= 0 && e < base.num_experts(),
                     "{}: shadow {} is expert {}, out of range "
                     "[0, {})",
                     where, i, e, base.num_experts());
    COBALT_CHECK_ARG(!seen[e], "{}: expert {} is shadowed twice", where, e);
    seen[e] = 1;
  }
}

}  // namespace

int fitting_shadow_prefix(const ExpertLayout& base, std::span<const ExpertId> shadows) {
  check_shadows(base, shadows, "fitting shadow prefix");
  const int num_ranks = base.num_ranks();
  std::vector<int> free_slots(num_ranks);
  for (RankId r = 0; r < num_ranks; ++r)
    free_slots[r] = base.slots_per_rank() - base.num_used_slots(r);
  int fitted = 0;
  for (ExpertId e : shadows) {
    for (RankId r = 0; r < num_ranks; ++r) {
      if (!base.holds(r, e) && free_slots[r] == 0) return fitted;
    }
    for (RankId r = 0; r < num_ranks; ++r) {
      if (!base.holds(r, e)) --free_slots[r];
    }
    ++fitted;
  }
  return fitted;
}

ExpertLayout shadow_layout(const ExpertLayout& base, std::span<const ExpertId> shadows) {
  check_shadows(base, shadows, "shadow layout");
  COBALT_CHECK(fitting_shadow_prefix(base, shadows) == static_cast<int>(shadows.size()),
               kFailedPrecondition, "shadow layout: {} shadows do not fit {} slots per rank",
               shadows.size(), base.slots_per_rank());
  const int num_ranks = base.num_ranks();
  std::vector<std::vector<ExpertId>> lists(num_ranks);
  for (RankId r = 0; r < num_ranks; ++r) {
    for (ExpertId e : base.slots_of(r)) {
      if (e != kEmptySlot) lists[r].push_back(e);
    }
    for (ExpertId e : shadows) {
      if (!base.holds(r, e)) lists[r].push_back(e);
    }
  }
  return ExpertLayout::from_rank_lists(base.topology(), base.num_experts(), base.slots_per_rank(),
                                       lists);
}

}  // namespace cobalt::plan
