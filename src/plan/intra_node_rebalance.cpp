#include "cobalt/plan/intra_node_rebalance.hpp"

#include <algorithm>
#include <cmath>

#include "cobalt/core/error.hpp"
#include "cobalt/core/value_checks.hpp"
#include "cobalt/plan/rank_matching.hpp"

namespace cobalt::plan {

RebalanceResult rebalance_intra_node(const ExpertLayout& layout, std::span<const double> slot_loads,
                                     double min_gain) {
  const Topology& topo = layout.topology();
  const int per_node = topo.ranks_per_node(), slots = layout.slots_per_rank();
  COBALT_CHECK_ARG(slot_loads.size() == layout.slots().size(),
                   "rebalance: {} slot loads for a layout of {} slots", slot_loads.size(),
                   layout.slots().size());
  check_finite_non_negative(slot_loads, "rebalance: slot loads");
  COBALT_CHECK_ARG(std::isfinite(min_gain) && min_gain >= 0,
                   "rebalance: minimum gain {} must be finite and >= 0", min_gain);
  std::vector<ExpertId> new_slots(layout.slots().begin(), layout.slots().end());
  std::vector<double> new_loads(slot_loads.begin(), slot_loads.end());
  int64_t num_moves = 0;
  struct Replica {
    ExpertId expert;
    double load;
    int old_rank;  // index within the node
  };
  for (NodeId n = 0; n < topo.num_nodes(); ++n) {
    const RankId first = topo.first_rank_of(n);
    std::vector<Replica> replicas;
    double old_max = 0;
    for (int i = 0; i < per_node; ++i) {
      double rank_load = 0;
      for (int s = 0; s < slots; ++s) {
        const size_t idx = static_cast<size_t>(first + i) * slots + s;
        if (layout.slots()[idx] == kEmptySlot) continue;
        replicas.push_back({layout.slots()[idx], slot_loads[idx], i});
        rank_load += slot_loads[idx];
      }
      old_max = std::max(old_max, rank_load);
    }
    std::stable_sort(replicas.begin(), replicas.end(), [](const Replica& a, const Replica& b) {
      return a.load > b.load || (a.load == b.load && a.expert < b.expert);
    });
    std::vector<double> load(per_node, 0.0);
    std::vector<std::vector<Replica>> placed(per_node);
    bool ok = true;
    for (const Replica& rep : replicas) {
      int best = -1;
      for (int i = 0; i < per_node; ++i) {
        if (static_cast<int>(placed[i].size()) >= slots) continue;
        if (std::any_of(placed[i].begin(), placed[i].end(),
                        [&](const Replica& p) { return p.expert == rep.expert; })) {
          continue;
        }
        if (best < 0 || load[i] < load[best] - 1e-12 ||
            (load[i] <= load[best] + 1e-12 && i == rep.old_rank && best != rep.old_rank)) {
          best = i;
        }
      }
      if (best < 0) {
        ok = false;  // greedy dead end (slots / duplicates): keep the current placement
        break;
      }
      placed[best].push_back(rep);
      load[best] += rep.load;
    }
    if (!ok) continue;
    const double new_max = *std::max_element(load.begin(), load.end());
    if (new_max >= old_max * (1.0 - min_gain)) continue;
    // The ranks are interchangeable for the loads: put each packed group on the rank that already
    // holds the most of its experts (a maximum-weight matching; ties keep group g on rank g).
    // Replicas of one expert are interchangeable, so a replica lands "in place" on any rank that
    // held its expert, not only on the one it came from.
    const auto held_before = [&](int i, ExpertId e) { return layout.holds(first + i, e); };
    std::vector<int64_t> kept(static_cast<size_t>(per_node) * per_node, 0);
    for (int g = 0; g < per_node; ++g) {
      for (const Replica& rep : placed[g]) {
        for (int i = 0; i < per_node; ++i) {
          kept[static_cast<size_t>(g) * per_node + i] += held_before(i, rep.expert);
        }
      }
    }
    const std::vector<int> group2rank = keep_most_in_place(kept, per_node);
    std::vector<std::vector<Replica>> matched(per_node);
    for (int g = 0; g < per_node; ++g) matched[group2rank[g]] = std::move(placed[g]);
    placed = std::move(matched);
    // Replicas of one expert are interchangeable: a packing that only trades replicas of the same
    // experts between ranks leaves every rank's experts as they were, so it moves nothing (its
    // lower maximum would be a relabelling of the loads, not a gain).
    bool same_experts = true;
    for (int i = 0; i < per_node && same_experts; ++i) {
      const auto held = layout.slots_of(first + i);
      const auto num_held =
          std::count_if(held.begin(), held.end(), [](ExpertId e) { return e != kEmptySlot; });
      same_experts = num_held == static_cast<int64_t>(placed[i].size()) &&
                     std::all_of(placed[i].begin(), placed[i].end(),
                                 [&](const Replica& p) { return held_before(i, p.expert); });
    }
    if (same_experts) continue;
    for (int i = 0; i < per_node; ++i) {
      // Keep replicas that stay on their rank first so their slot indices are stable.
      std::stable_partition(placed[i].begin(), placed[i].end(),
                            [&](const Replica& p) { return held_before(i, p.expert); });
      for (int s = 0; s < slots; ++s) {
        const size_t idx = static_cast<size_t>(first + i) * slots + s;
        if (s < static_cast<int>(placed[i].size())) {
          new_slots[idx] = placed[i][s].expert;
          new_loads[idx] = placed[i][s].load;
          num_moves += !held_before(i, placed[i][s].expert);  // a copy: new on this rank
        } else {
          new_slots[idx] = kEmptySlot;
          new_loads[idx] = 0.0;
        }
      }
    }
  }
  return {ExpertLayout(topo, layout.num_experts(), slots, std::move(new_slots)),
          std::move(new_loads), num_moves};
}

}  // namespace cobalt::plan
