#include "cobalt/plan/flexmoe_planner.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "cobalt/core/error.hpp"

namespace cobalt::plan {
namespace {

// A mutable copy of a layout: per-rank expert lists and replica counts.
struct State {
  int num_experts = 0, num_ranks = 0, slots = 0;
  std::vector<std::vector<ExpertId>> lists;  // [G] experts on each rank
  std::vector<int> replicas;                 // r_e [E]

  bool holds(RankId r, ExpertId e) const {
    return std::find(lists[r].begin(), lists[r].end(), e) != lists[r].end();
  }
  bool has_free_slot(RankId r) const { return static_cast<int>(lists[r].size()) < slots; }
  void add(RankId r, ExpertId e) {
    lists[r].push_back(e);
    ++replicas[e];
  }
  void remove(RankId r, ExpertId e) {
    lists[r].erase(std::find(lists[r].begin(), lists[r].end(), e));
    --replicas[e];
  }
  std::vector<double> loads(std::span<const double> w) const {
    std::vector<double> out(num_ranks, 0.0);
    for (RankId r = 0; r < num_ranks; ++r) {
      for (ExpertId e : lists[r]) out[r] += w[e] / replicas[e];
    }
    return out;
  }
};

struct Edit {
  enum Kind { kExpand, kExpandShrink, kMigrate } kind;
  std::vector<std::pair<RankId, ExpertId>> removes, adds;
};

void apply(State& st, const Edit& edit) {
  for (auto [r, e] : edit.removes) st.remove(r, e);
  for (auto [r, e] : edit.adds) st.add(r, e);
}

struct Score {
  double max_load, min_load;
};

Score score_of(const std::vector<double>& loads) {
  auto [lo, hi] = std::minmax_element(loads.begin(), loads.end());
  return {*hi, *lo};
}

// Strictly better: lighter busiest rank, or equal busiest and heavier least loaded rank (relative
// tolerance so rounding noise never counts as progress).
bool better(const Score& a, const Score& b) {
  const double tol = 1e-9 * std::max(1.0, std::abs(b.max_load));
  if (a.max_load < b.max_load - tol) return true;
  return std::abs(a.max_load - b.max_load) <= tol && a.min_load > b.min_load + tol;
}

RankId argmax(const std::vector<double>& v) {
  return static_cast<RankId>(std::max_element(v.begin(), v.end()) - v.begin());
}
RankId argmin(const std::vector<double>& v) {
  return static_cast<RankId>(std::min_element(v.begin(), v.end()) - v.begin());
}

std::optional<Edit> expand_candidate(const State& st, std::span<const double> w,
                                     const std::vector<double>& loads, RankId busiest) {
  // The hottest expert per replica on the busiest rank that is not already everywhere.
  ExpertId hot = -1;
  for (ExpertId e : st.lists[busiest]) {
    if (st.replicas[e] >= st.num_ranks) continue;
    const double per = w[e] / st.replicas[e];
    if (hot < 0 || per > w[hot] / st.replicas[hot] ||
        (per == w[hot] / st.replicas[hot] && e < hot)) {
      hot = e;
    }
  }
  if (hot < 0) return std::nullopt;
  RankId target = -1;
  for (RankId r = 0; r < st.num_ranks; ++r) {
    if (st.holds(r, hot) || !st.has_free_slot(r)) continue;
    if (target < 0 || loads[r] < loads[target]) target = r;
  }
  if (target >= 0) return Edit{Edit::kExpand, {}, {{target, hot}}};
  // No free slot where h could go: shrink the coldest multi-replica expert on the least loaded
  // rank lacking h that has one.
  RankId shrink_rank = -1;
  ExpertId cold = -1;
  for (RankId r = 0; r < st.num_ranks; ++r) {
    if (st.holds(r, hot)) continue;
    if (shrink_rank >= 0 && !(loads[r] < loads[shrink_rank])) continue;
    ExpertId c_best = -1;
    for (ExpertId c : st.lists[r]) {
      if (st.replicas[c] < 2) continue;
      const double per = w[c] / st.replicas[c];
      if (c_best < 0 || per < w[c_best] / st.replicas[c_best] ||
          (per == w[c_best] / st.replicas[c_best] && c < c_best)) {
        c_best = c;
      }
    }
    if (c_best >= 0) {
      shrink_rank = r;
      cold = c_best;
    }
  }
  if (shrink_rank < 0) return std::nullopt;
  return Edit{Edit::kExpandShrink, {{shrink_rank, cold}}, {{shrink_rank, hot}}};
}

std::optional<Edit> migrate_candidate(const State& st, std::span<const double> w,
                                      const std::vector<double>& loads, RankId busiest,
                                      RankId idlest) {
  if (busiest == idlest) return std::nullopt;
  auto per = [&](ExpertId e) { return w[e] / st.replicas[e]; };
  std::optional<Edit> best;
  double best_peak = std::numeric_limits<double>::infinity();
  if (st.has_free_slot(idlest)) {
    for (ExpertId x : st.lists[busiest]) {
      if (st.holds(idlest, x)) continue;
      const double peak = std::max(loads[busiest] - per(x), loads[idlest] + per(x));
      if (peak < best_peak) {
        best_peak = peak;
        best = Edit{Edit::kMigrate, {{busiest, x}}, {{idlest, x}}};
      }
    }
    return best;
  }
  for (ExpertId x : st.lists[busiest]) {
    if (st.holds(idlest, x)) continue;
    for (ExpertId y : st.lists[idlest]) {
      if (st.holds(busiest, y)) continue;
      const double delta = per(x) - per(y);
      const double peak = std::max(loads[busiest] - delta, loads[idlest] + delta);
      if (peak < best_peak) {
        best_peak = peak;
        best = Edit{Edit::kMigrate, {{busiest, x}, {idlest, y}}, {{idlest, x}, {busiest, y}}};
      }
    }
  }
  return best;
}

}  // namespace

double flexmoe_balance_ratio(std::span<const double> rank_loads) {
  if (rank_loads.empty()) return 1.0;
  auto [lo, hi] = std::minmax_element(rank_loads.begin(), rank_loads.end());
  if (*hi <= 0) return 1.0;
  if (*lo <= 0) return std::numeric_limits<double>::infinity();
  return *hi / *lo;
}

std::vector<double> even_split_rank_loads(const ExpertLayout& layout,
                                          std::span<const double> expert_load) {
  COBALT_CHECK_ARG(static_cast<int>(expert_load.size()) == layout.num_experts(),
                   "even split loads: {} expert loads for E = {}", expert_load.size(),
                   layout.num_experts());
  std::vector<double> loads(layout.num_ranks(), 0.0);
  for (ExpertId e = 0; e < layout.num_experts(); ++e) {
    const double share = expert_load[e] / layout.num_replicas_of(e);
    for (RankId r : layout.ranks_of(e)) loads[r] += share;
  }
  return loads;
}

FlexMoeSchedule flexmoe_schedule(const ExpertLayout& current, std::span<const double> expert_load,
                                 const FlexMoeOptions& options) {
  COBALT_CHECK_ARG(static_cast<int>(expert_load.size()) == current.num_experts(),
                   "flexmoe: {} expert loads for E = {}", expert_load.size(),
                   current.num_experts());
  COBALT_CHECK_ARG(options.balance_threshold >= 1 && options.max_ops >= 0,
                   "flexmoe: threshold {} must be >= 1 and max ops {} >= 0",
                   options.balance_threshold, options.max_ops);
  State st;
  st.num_experts = current.num_experts();
  st.num_ranks = current.num_ranks();
  st.slots = current.slots_per_rank();
  st.lists.resize(st.num_ranks);
  st.replicas.assign(st.num_experts, 0);
  for (RankId r = 0; r < st.num_ranks; ++r) {
    for (ExpertId e : current.slots_of(r)) {
      if (e != kEmptySlot) st.add(r, e);
    }
  }
  FlexMoeSchedule out{current, 0, 0, 0, 1, 1};
  auto loads = st.loads(expert_load);
  out.balance_ratio_before = flexmoe_balance_ratio(loads);
  bool changed = false;
  for (int op = 0; op < options.max_ops; ++op) {
    if (flexmoe_balance_ratio(loads) <= options.balance_threshold) break;
    const RankId busiest = argmax(loads), idlest = argmin(loads);
    const Score now = score_of(loads);
    std::optional<Edit> chosen;
    Score chosen_score = now;
    for (auto& candidate : {expand_candidate(st, expert_load, loads, busiest),
                            migrate_candidate(st, expert_load, loads, busiest, idlest)}) {
      if (!candidate) continue;
      State trial = st;
      apply(trial, *candidate);
      const Score s = score_of(trial.loads(expert_load));
      if (better(s, chosen_score)) {
        chosen = candidate;
        chosen_score = s;
      }
    }
    if (!chosen) break;
    apply(st, *chosen);
    changed = true;
    switch (chosen->kind) {
      case Edit::kExpand:
        ++out.num_expand;
        break;
      case Edit::kExpandShrink:
        ++out.num_expand;
        ++out.num_shrink;
        break;
      case Edit::kMigrate:
        ++out.num_migrate;
        break;
    }
    loads = st.loads(expert_load);
  }
  out.balance_ratio_after = flexmoe_balance_ratio(loads);
  if (changed) {
    out.layout = ExpertLayout::from_rank_lists(current.topology(), current.num_experts(),
                                               current.slots_per_rank(), st.lists);
  }
  return out;
}

}  // namespace cobalt::plan
