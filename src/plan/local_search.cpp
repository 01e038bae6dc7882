#include "local_search.hpp"

#include <algorithm>
#include <optional>

namespace cobalt::plan::detail {
namespace {

// Upper bounds on the candidates of local_search_pass, so that it skips scans none of whose
// candidates can beat the best found (the chosen move is the same as without them). With
// g_fa = [f not on a], l_fb = [f has one replica on b] and every c >= 0, a swap of e (a -> b) with
// f (b -> a) changes the objective by
//   g_eb (G_eb - l_fb c_ef) + g_fa (G_fa - l_ea c_ef) - l_ea G_ea - l_fb G_fb
//     <= (g_eb G_eb - l_ea G_ea) + T_b(f, a),   T_b(f, a) = g_fa G_fa - l_fb G_fb,
// and a replace of e on a by f by at most max(0, g_fa G_fa) - l_ea G_ea. So
//   swap(a, b) >= max over f on b of T_b(f, a),   replace(a) >= max(0, max_f g_fa G_fa).
// They are exact at the start of a pass, loosened by every change (a presence change of e' on n
// adds c_e'j <= row_max[e'] to the gains G_jn: row n of swap and replace(n) grow by row_max[e']
// when e' arrives, column n of swap when it leaves; e' itself is re-maxed in exactly), and
// tightened to the exact maximum by every scan that runs.
class CandidateBounds {
 public:
  CandidateBounds(const PlanState& s, const GainScale& scale)
      : num_nodes_(s.num_nodes()), scale_(scale) {
    const int num_nodes = num_nodes_;
    swap_.assign(static_cast<size_t>(num_nodes) * num_nodes, kNone);
    replace_.assign(num_nodes, 0.0);
    for (int f = 0; f < s.num_experts(); ++f) include(s, f);
  }

  double swap(int a, int b) const { return swap_[static_cast<size_t>(a) * num_nodes_ + b]; }
  double replace(int a) const { return replace_[a]; }
  double slack() const { return scale_.slack; }
  // The exact maxima, found by a scan that ran.
  void set_swap(int a, int b, double value) {
    swap_[static_cast<size_t>(a) * num_nodes_ + b] = value;
  }
  void set_replace(int a, double value) { replace_[a] = value; }

  // After s.add(e, n) / s.remove(e, n); `presence` is +1 when e arrived on n, -1 when it left, 0
  // when only its replica count there changed.
  void after_change(const PlanState& s, int e, int n, int presence) {
    const double grow = scale_.row_max[e];
    if (presence > 0) {
      for (int b = 0; b < num_nodes_; ++b) swap_[static_cast<size_t>(n) * num_nodes_ + b] += grow;
      replace_[n] += grow;
    } else if (presence < 0) {
      for (int a = 0; a < num_nodes_; ++a) swap_[static_cast<size_t>(a) * num_nodes_ + n] += grow;
    }
    include(s, e);
  }

  static constexpr double kNone = -1e300;  // no expert on the node

 private:
  // Maxes expert f's own terms into the bounds.
  void include(const PlanState& s, int f) {
    for (int a = 0; a < num_nodes_; ++a) {
      const double in = s.present(f, a) ? 0.0 : s.gain(f, a);
      replace_[a] = std::max(replace_[a], in);
    }
    for (int b = 0; b < num_nodes_; ++b) {
      if (!s.present(f, b)) continue;
      const double out = s.x(f, b) == 1 ? s.gain(f, b) : 0.0;
      for (int a = 0; a < num_nodes_; ++a) {
        const double t = (s.present(f, a) ? 0.0 : s.gain(f, a)) - out;
        double& bound = swap_[static_cast<size_t>(a) * num_nodes_ + b];
        bound = std::max(bound, t);
      }
    }
  }

  int num_nodes_;
  const GainScale& scale_;
  std::vector<double> swap_;     // [N, N] (a, b)
  std::vector<double> replace_;  // [N]
};

// Applies s.add / s.remove and keeps the bounds (when there are any) valid.
void change_tracked(PlanState& s, CandidateBounds* bounds, int e, int n, int delta) {
  const bool was_present = s.present(e, n);
  if (delta > 0) {
    s.add(e, n);
  } else {
    s.remove(e, n);
  }
  if (bounds) bounds->after_change(s, e, n, s.present(e, n) == was_present ? 0 : delta);
}

}  // namespace

void fill_spare_slots(PlanState& s) {
  // Adds, one replica at a time, the (expert, node) of highest score among the eligible ones whose
  // replica fits (a free slot on the node, every node within its load cap) while that score
  // exceeds the best so far (starting at `floor`) by more than `margin`.
  const auto add_best_while = [&s](double floor, double margin, auto eligible, auto score) {
    for (;;) {
      int best_e = -1, best_n = -1;
      double best = floor;
      for (int n = 0; n < s.num_nodes(); ++n) {
        if (s.node_used(n) >= s.node_slots()) continue;
        for (int e = 0; e < s.num_experts(); ++e) {
          if (!eligible(e, n)) continue;
          const double value = score(e, n);
          if (value > best + margin && s.own_excess_after_add(e, n) <= 0 &&
              s.excess_after_change(e, n, +1) <= 0) {
            best = value;
            best_e = e;
            best_n = n;
          }
        }
      }
      if (best_e < 0) return;
      s.add(best_e, best_n);
    }
  };
  // Replicas that add co-activation, the largest gain first.
  add_best_while(
      kImprovement, 0.0, [&s](int e, int n) { return !s.present(e, n); },
      [&s](int e, int n) { return s.gain(e, n); });
  // Extra replicas of the experts with the largest per-replica load.
  add_best_while(
      0.0, kImprovement, [&s](int e, int n) { return s.x(e, n) < s.per_node(); },
      [&s](int e, int) { return s.share(e); });
}

bool local_search_pass(PlanState& s, const GainScale* scale) {
  bool improved = false;
  const int num_experts = s.num_experts(), num_nodes = s.num_nodes();
  std::optional<CandidateBounds> bounds;
  if (scale) bounds.emplace(s, *scale);
  CandidateBounds* tracked = bounds ? &*bounds : nullptr;
  for (int e = 0; e < num_experts; ++e) {
    for (int a = 0; a < num_nodes; ++a) {
      if (!s.present(e, a)) continue;
      const bool lose_e_a = s.x(e, a) == 1;
      const double loss_e = lose_e_a ? s.gain(e, a) : 0.0;
      // Best move / swap of one replica of e from a to b.
      double best_delta = kImprovement;
      int best_b = -1, best_f = -1;  // best_f < 0: plain move into a free slot
      for (int b = 0; b < num_nodes; ++b) {
        if (b == a || s.x(e, b) >= s.per_node()) continue;
        const bool gain_e_b = !s.present(e, b);
        if (s.node_used(b) < s.node_slots()) {
          const double delta = (gain_e_b ? s.gain(e, b) : 0.0) - loss_e;
          if (delta > best_delta && s.node_load(b) + s.share(e) <= s.node_cap() + kImprovement) {
            best_delta = delta;
            best_b = b;
            best_f = -1;
          }
        }
        const double head = (gain_e_b ? s.gain(e, b) : 0.0) - loss_e;
        if (bounds && head + bounds->swap(a, b) + bounds->slack() <= best_delta) continue;
        // members(b) changes only when a move is applied, after this scan.
        double max_term = CandidateBounds::kNone;  // max over f on b of T_b(f, a)
        for (int f : s.members(b)) {
          const bool lose_f_b = s.x(f, b) == 1;
          const bool gain_f_a = !s.present(f, a);
          const double gain_f_a_value = gain_f_a ? s.gain(f, a) : 0.0;
          const double loss_f_b = lose_f_b ? s.gain(f, b) : 0.0;
          max_term = std::max(max_term, gain_f_a_value - loss_f_b);
          if (f == e || s.x(f, a) >= s.per_node()) continue;
          const double c_ef = s.c(e, f);
          const double delta = (gain_e_b ? s.gain(e, b) - (lose_f_b ? c_ef : 0.0) : 0.0) +
                               (gain_f_a ? gain_f_a_value - (lose_e_a ? c_ef : 0.0) : 0.0) -
                               loss_e - loss_f_b;
          if (delta <= best_delta) continue;
          const double shift = s.share(f) - s.share(e);  // load change of node a
          if (s.node_load(a) + shift > s.node_cap() + kImprovement ||
              s.node_load(b) - shift > s.node_cap() + kImprovement) {
            continue;
          }
          best_delta = delta;
          best_b = b;
          best_f = f;
        }
        if (bounds) bounds->set_swap(a, b, max_term);
      }
      // Replace: drop this replica of e (when e keeps enough replicas) and add another expert on a.
      if (s.total(e) > s.min_replicas(e) &&
          !(bounds && bounds->replace(a) - loss_e + bounds->slack() <= best_delta)) {
        double max_in = 0;  // max(0, max over f not on a of G_fa)
        for (int f = 0; f < num_experts; ++f) {
          const bool gain_f_a = !s.present(f, a);
          if (gain_f_a) max_in = std::max(max_in, s.gain(f, a));
          if (f == e || s.x(f, a) >= s.per_node()) continue;
          const double delta =
              (gain_f_a ? s.gain(f, a) - (lose_e_a ? s.c(e, f) : 0.0) : 0.0) - loss_e;
          if (delta <= best_delta) continue;
          // Feasibility: e loses a replica (its share grows elsewhere), f gains one on a.
          if (!s.replace_feasible(e, a, f)) continue;
          best_delta = delta;
          best_b = a;
          best_f = f;
        }
        if (bounds) bounds->set_replace(a, max_in);
      }
      if (best_b < 0) continue;
      if (best_b == a) {  // replace
        change_tracked(s, tracked, e, a, -1);
        change_tracked(s, tracked, best_f, a, +1);
      } else if (best_f < 0) {  // move
        change_tracked(s, tracked, e, a, -1);
        change_tracked(s, tracked, e, best_b, +1);
      } else {  // swap
        change_tracked(s, tracked, e, a, -1);
        change_tracked(s, tracked, best_f, best_b, -1);
        change_tracked(s, tracked, e, best_b, +1);
        change_tracked(s, tracked, best_f, a, +1);
      }
      improved = true;
      if (!s.present(e, a)) break;  // e left a; continue with the next expert
    }
  }
  return improved;
}

}  // namespace cobalt::plan::detail
