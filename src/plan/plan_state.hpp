// Internal to src/plan/: the global heuristic's mutable node-level plan (replica counts, loads,
// incremental co-activation gains), shared by the placement (global_planner.cpp) and the local
// search (local_search.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cobalt/plan/node_plan.hpp"

namespace cobalt::plan::detail {

// Ties and improvements below this are ignored.
constexpr double kImprovement = 1e-9;

// Mutable node-level state with incremental co-activation gains:
//   gain[e][n] = sum over j != e present on n of c_ej.
class PlanState {
 public:
  explicit PlanState(const GlobalPlanInput& input)
      : in_(input),
        num_experts_(input.num_experts),
        num_nodes_(input.topology.num_nodes()),
        per_node_(input.topology.ranks_per_node()),
        node_slots_(per_node_ * input.slots_per_rank),
        rank_cap_(input.rank_load_cap()),
        node_cap_(per_node_ * rank_cap_),
        plan_(num_experts_, num_nodes_),
        total_(num_experts_, 0),
        share_(input.expert_load.begin(), input.expert_load.end()),
        gain_(static_cast<size_t>(num_experts_) * num_nodes_, 0.0),
        node_load_(num_nodes_, 0.0),
        node_used_(num_nodes_, 0),
        min_replicas_(num_experts_, 1) {
    members_.assign(num_nodes_, {});
    member_pos_.assign(static_cast<size_t>(num_experts_) * num_nodes_, -1);
    if (!input.source_demand.empty()) {
      for (int e = 0; e < num_experts_; ++e) {
        for (int n = 0; n < num_nodes_; ++n) {
          gain_[static_cast<size_t>(e) * num_nodes_ + n] =
              input.source_weight * input.source_demand[static_cast<size_t>(n) * num_experts_ + e];
        }
      }
    }
    for (int e = 0; e < num_experts_; ++e) {
      const double w = input.expert_load[e];
      if (rank_cap_ > 0)
        min_replicas_[e] = std::max(1, static_cast<int>(std::ceil(w / rank_cap_ - 1e-9)));
      min_replicas_[e] = std::min(min_replicas_[e], num_nodes_ * per_node_);
    }
    // When the slots cannot hold the replicas the load cap asks for, relax the cap: take replicas
    // away from the experts with the most (ties: lowest id) until everything fits. Their replicas
    // then carry more than one rank's cap; stage 2 and the assignment still spread them as well as
    // they can.
    int64_t needed = 0;
    for (int r : min_replicas_) needed += r;
    const int64_t available = static_cast<int64_t>(num_nodes_) * node_slots_;
    while (needed > available) {
      const auto it = std::max_element(min_replicas_.begin(), min_replicas_.end());
      if (*it <= 1) break;
      --*it;
      --needed;
    }
  }

  int x(int e, int n) const { return plan_.x(e, n); }
  bool present(int e, int n) const { return plan_.x(e, n) > 0; }
  int total(int e) const { return total_[e]; }
  double gain(int e, int n) const { return gain_[static_cast<size_t>(e) * num_nodes_ + n]; }
  double c(int i, int j) const {
    return in_.coactivation[static_cast<size_t>(i) * num_experts_ + j];
  }
  double w(int e) const { return in_.expert_load[e]; }
  // w_e / total_e, kept per expert (the swap scan reads it for every candidate that gains).
  double share(int e) const { return share_[e]; }
  double node_load(int n) const { return node_load_[n]; }
  int node_used(int n) const { return node_used_[n]; }
  int node_slots() const { return node_slots_; }
  double node_cap() const { return node_cap_; }
  int per_node() const { return per_node_; }
  int min_replicas(int e) const { return min_replicas_[e]; }
  int num_experts() const { return num_experts_; }
  int num_nodes() const { return num_nodes_; }
  double objective() const { return objective_; }
  const std::vector<int>& members(int n) const { return members_[n]; }
  const GlobalPlanInput& input() const { return in_; }

  // Node loads after giving expert e `new_total` replicas (counts per node unchanged otherwise) and
  // adding `delta_n` replicas of e on node n. Returns the largest load excess over the cap among
  // affected nodes (<= 0 when feasible).
  double excess_after_change(int e, int n, int delta_n) const {
    const int new_total = total_[e] + delta_n;
    if (new_total <= 0) return 1e300;
    const double old_share = share(e), new_share = w(e) / new_total;
    double worst = -1e300;
    for (int m = 0; m < num_nodes_; ++m) {
      const int old_x = plan_.x(e, m);
      const int new_x = old_x + (m == n ? delta_n : 0);
      if (old_x == 0 && new_x == 0) continue;
      const double load = node_load_[m] - old_x * old_share + new_x * new_share;
      worst = std::max(worst, load - node_cap_);
    }
    return worst;
  }

  // The term of excess_after_change(e, n, +1) for node n itself, computed the same way: when it is
  // > 0 so is that call's result, which is then not needed (an O(1) pre-check of the O(N) call).
  double own_excess_after_add(int e, int n) const {
    const double old_share = share(e), new_share = w(e) / (total_[e] + 1);
    const int old_x = plan_.x(e, n), new_x = old_x + 1;
    return node_load_[n] - old_x * old_share + new_x * new_share - node_cap_;
  }

  // Whether dropping one replica of e on node a and adding one of f on a keeps every node within
  // its load cap (even split over replicas). O(N), no mutation.
  bool replace_feasible(int e, int a, int f) const {
    const int total_e = total_[e], total_f = total_[f];
    if (total_e <= 1) return false;
    const double old_se = w(e) / total_e, new_se = w(e) / (total_e - 1);
    const double old_sf = total_f > 0 ? w(f) / total_f : 0.0, new_sf = w(f) / (total_f + 1);
    for (int m = 0; m < num_nodes_; ++m) {
      const int xe = plan_.x(e, m), xf = plan_.x(f, m);
      const int xe_new = xe - (m == a ? 1 : 0), xf_new = xf + (m == a ? 1 : 0);
      if (xe == 0 && xf_new == 0) continue;
      const double delta = xe_new * new_se - xe * old_se + xf_new * new_sf - xf * old_sf;
      if (delta > 0 && node_load_[m] + delta > node_cap_ + kImprovement) return false;
    }
    return true;
  }

  void add(int e, int n) { change(e, n, +1); }
  void remove(int e, int n) { change(e, n, -1); }

  NodePlan finish() const {
    NodePlan out = plan_;
    for (int e = 0; e < num_experts_; ++e) {
      for (int n = 0; n < num_nodes_; ++n) out.u(e, n) = plan_.x(e, n) * share(e);
    }
    return out;
  }

 private:
  void change(int e, int n, int delta) {
    const double old_share = share(e);
    const bool was_present = plan_.x(e, n) > 0;
    plan_.x(e, n) += delta;
    total_[e] += delta;
    node_used_[n] += delta;
    share_[e] = total_[e] > 0 ? w(e) / total_[e] : w(e);
    const double new_share = share(e);
    for (int m = 0; m < num_nodes_; ++m) {
      const int xm = plan_.x(e, m);
      const int old_xm = xm - (m == n ? delta : 0);
      node_load_[m] += xm * new_share - old_xm * old_share;
    }
    const bool is_present = plan_.x(e, n) > 0;
    if (was_present != is_present) {
      auto& list = members_[n];
      int& pos = member_pos_[static_cast<size_t>(e) * num_nodes_ + n];
      if (is_present) {
        pos = static_cast<int>(list.size());
        list.push_back(e);
      } else {
        const int last = list.back();
        list[pos] = last;
        member_pos_[static_cast<size_t>(last) * num_nodes_ + n] = pos;
        list.pop_back();
        pos = -1;
      }
      const double sign = is_present ? 1.0 : -1.0;
      objective_ += sign * gain(e, n);
      const double* row = in_.coactivation.data() + static_cast<size_t>(e) * num_experts_;
      for (int j = 0; j < num_experts_; ++j) {
        if (j != e) gain_[static_cast<size_t>(j) * num_nodes_ + n] += sign * row[j];
      }
    }
  }

  const GlobalPlanInput& in_;
  std::vector<std::vector<int>> members_;  // experts present on each node (unordered)
  std::vector<int> member_pos_;            // [E, N] index in members_[n], -1 when absent
  int num_experts_, num_nodes_, per_node_, node_slots_;
  double rank_cap_, node_cap_;
  NodePlan plan_;
  std::vector<int> total_;
  std::vector<double> share_;  // [E]
  std::vector<double> gain_;
  std::vector<double> node_load_;
  std::vector<int> node_used_;
  std::vector<int> min_replicas_;
  double objective_ = 0;
};

}  // namespace cobalt::plan::detail
