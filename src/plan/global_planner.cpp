#include "cobalt/plan/global_planner.hpp"

#include <metis.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <optional>

#include "cobalt/core/error.hpp"
#include "cobalt/core/parallel.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/plan/rank_matching.hpp"

namespace cobalt::plan {
namespace {

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

// Best node for one more replica of e: largest co-activation gain (0 if already present), then
// lowest load excess, then least loaded, then lowest id. `noise` perturbs gains for restarts.
int best_node_for(const PlanState& s, int e, const std::vector<double>& noise) {
  int best = -1;
  double best_gain = 0, best_excess = 0, best_load = 0;
  for (int n = 0; n < s.num_nodes(); ++n) {
    if (s.node_used(n) >= s.node_slots() || s.x(e, n) >= s.per_node()) continue;
    const double g = (s.present(e, n) ? 0.0 : s.gain(e, n)) * (1.0 + noise[n]);
    const double excess = std::max(0.0, s.excess_after_change(e, n, +1));
    const double load = s.node_load(n);
    const bool better = best < 0 || excess < best_excess - kImprovement ||
                        (excess <= best_excess + kImprovement &&
                         (g > best_gain + kImprovement ||
                          (g >= best_gain - kImprovement && load < best_load - kImprovement)));
    if (better) {
      best = n;
      best_gain = g;
      best_excess = excess;
      best_load = load;
    }
  }
  return best;
}

std::vector<int> metis_partition(const GlobalPlanInput& in) {
  const int num_experts = in.num_experts;
  const int num_nodes = in.topology.num_nodes();
  std::vector<int> part(num_experts, 0);
  if (num_nodes == 1 || num_experts < num_nodes) {
    for (int e = 0; e < num_experts; ++e) part[e] = e % num_nodes;
    return part;
  }
  double max_c = 0, total_c = 0, total_w = 0;
  for (double c : in.coactivation) {
    max_c = std::max(max_c, c);
    total_c += std::max(c, 0.0);
  }
  for (double w : in.expert_load) total_w += w;
  // METIS works in 32-bit integers (IDXTYPEWIDTH 32 on Debian) and adds edge weights up while it
  // coarsens the graph and computes cuts: the heaviest edge maps to at most 1e6 and all of them
  // together to at most 2^28 (E = 640 with dense co-activation would otherwise reach ~4e11).
  const double c_scale = max_c > 0 ? std::min(1e6 / max_c, std::ldexp(1.0, 28) / total_c) : 1.0;
  const double w_scale = total_w > 0 ? 1e6 / total_w : 1.0;
  std::vector<idx_t> xadj(num_experts + 1, 0), adjncy, adjwgt,
      vwgt(static_cast<size_t>(num_experts));
  for (int i = 0; i < num_experts; ++i) {
    for (int j = 0; j < num_experts; ++j) {
      const double c = in.coactivation[static_cast<size_t>(i) * num_experts + j];
      if (i == j || c <= 0) continue;
      adjncy.push_back(j);
      adjwgt.push_back(std::max<idx_t>(1, static_cast<idx_t>(std::llround(c * c_scale))));
    }
    xadj[i + 1] = static_cast<idx_t>(adjncy.size());
    vwgt[i] = std::max<idx_t>(1, static_cast<idx_t>(std::llround(in.expert_load[i] * w_scale)));
  }
  if (adjncy.empty()) {
    for (int e = 0; e < num_experts; ++e) part[e] = e % num_nodes;
    return part;
  }
  idx_t nvtxs = num_experts, ncon = 1, nparts = num_nodes, objval = 0;
  std::vector<real_t> ubvec = {static_cast<real_t>(1.0 + in.eps)};
  idx_t metis_options[METIS_NOPTIONS];
  METIS_SetDefaultOptions(metis_options);
  metis_options[METIS_OPTION_SEED] = 1;
  metis_options[METIS_OPTION_NUMBERING] = 0;
  std::vector<idx_t> metis_part(num_experts, 0);
  // METIS keeps its random-number state in globals (seeded per call from METIS_OPTION_SEED), so
  // concurrent calls, e.g. two layers planning on background threads, would interleave the draws
  // and make partitions depend on timing: one call at a time.
  static std::mutex metis_mutex;
  std::lock_guard<std::mutex> metis_lock(metis_mutex);
  const int status = METIS_PartGraphKway(&nvtxs, &ncon, xadj.data(), adjncy.data(), vwgt.data(),
                                         nullptr, adjwgt.data(), &nparts, nullptr, ubvec.data(),
                                         metis_options, &objval, metis_part.data());
  if (status != METIS_OK) {
    for (int e = 0; e < num_experts; ++e) part[e] = e % num_nodes;
    return part;
  }
  for (int e = 0; e < num_experts; ++e) part[e] = static_cast<int>(metis_part[e]);
  return part;
}

void initial_placement(PlanState& s, const GlobalPlanInput& in, int restart, uint64_t seed,
                       bool use_metis) {
  const int num_experts = s.num_experts();
  SplitMix64 rng(mix64(seed ^ (0x51ed2701ULL * (restart + 1))));
  std::vector<int> order(num_experts);
  std::iota(order.begin(), order.end(), 0);
  std::vector<double> key(num_experts);
  for (int e = 0; e < num_experts; ++e)
    key[e] = s.w(e) * (restart == 0 ? 1.0 : (0.7 + 0.6 * rng.unit()));
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return key[a] > key[b]; });
  std::vector<double> noise(s.num_nodes(), 0.0);
  std::vector<int> part;
  if (use_metis && restart == 0) part = metis_partition(in);
  for (int e : order) {
    for (int copy = 0; copy < s.min_replicas(e); ++copy) {
      int n = -1;
      if (copy == 0 && !part.empty()) {
        const int p = part[e];
        if (s.node_used(p) < s.node_slots() && s.excess_after_change(e, p, +1) <= 0) n = p;
      }
      if (n < 0) {
        if (restart > 0) {
          for (double& v : noise) v = 0.2 * (rng.unit() - 0.5);
        }
        n = best_node_for(s, e, noise);
      }
      COBALT_CHECK(n >= 0, kFailedPrecondition,
                   "global plan: no slot left for expert {} ({} of {} replicas placed); raise rho",
                   e, copy, s.min_replicas(e));
      s.add(e, n);
    }
  }
}

// Fills spare slots: first with replicas that add co-activation (largest gain first), then with
// extra replicas of the experts with the largest per-replica load (they help stage 2 balance).
void fill_spare_slots(PlanState& s) {
  for (;;) {
    int best_e = -1, best_n = -1;
    double best_gain = kImprovement;
    for (int n = 0; n < s.num_nodes(); ++n) {
      if (s.node_used(n) >= s.node_slots()) continue;
      for (int e = 0; e < s.num_experts(); ++e) {
        if (s.present(e, n)) continue;
        const double g = s.gain(e, n);
        if (g > best_gain && s.own_excess_after_add(e, n) <= 0 &&
            s.excess_after_change(e, n, +1) <= 0) {
          best_gain = g;
          best_e = e;
          best_n = n;
        }
      }
    }
    if (best_e < 0) break;
    s.add(best_e, best_n);
  }
  for (;;) {
    int best_e = -1, best_n = -1;
    double best_share = 0;
    for (int n = 0; n < s.num_nodes(); ++n) {
      if (s.node_used(n) >= s.node_slots()) continue;
      for (int e = 0; e < s.num_experts(); ++e) {
        if (s.x(e, n) >= s.per_node()) continue;
        const double sh = s.share(e);
        if (sh > best_share + kImprovement && s.own_excess_after_add(e, n) <= 0 &&
            s.excess_after_change(e, n, +1) <= 0) {
          best_share = sh;
          best_e = e;
          best_n = n;
        }
      }
    }
    if (best_e < 0) break;
    s.add(best_e, best_n);
  }
}

// Facts about the co-activation the candidate bounds below need, computed once per plan call.
struct GainScale {
  std::vector<double> row_max;  // [E] max_{j != e} c_ej: what one presence change adds to a gain
  double slack = 0;             // rounding allowance of a bound test: 1e-9 x (1 + the largest gain)

  explicit GainScale(const GlobalPlanInput& in) : row_max(in.num_experts, 0.0) {
    const int num_experts = in.num_experts;
    double largest_gain = 0;
    // (The co-activation is symmetric, validated: row e's sum is also what G_e. can reach.)
    for (int e = 0; e < num_experts; ++e) {
      double row_sum = 0;
      for (int j = 0; j < num_experts; ++j) {
        if (j == e) continue;
        const double c = in.coactivation[static_cast<size_t>(e) * num_experts + j];
        row_max[e] = std::max(row_max[e], c);
        row_sum += c;
      }
      double source = 0;
      for (int n = 0; n < in.topology.num_nodes() && !in.source_demand.empty(); ++n) {
        source = std::max(
            source, in.source_weight * in.source_demand[static_cast<size_t>(n) * num_experts + e]);
      }
      largest_gain = std::max(largest_gain, row_sum + source);
    }
    slack = 1e-9 * (1.0 + largest_gain);
  }
};

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

// One pass of local search; returns true when something improved. With `scale`, candidate scans
// that provably cannot beat the best move found so far are skipped (CandidateBounds): the moves
// made, and so the result, are those of the plain scan (scale == nullptr).
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

}  // namespace

HeuristicResult plan_global_heuristic(const GlobalPlanInput& input,
                                      const HeuristicOptions& options) {
  input.validate();
  COBALT_CHECK_ARG(options.num_restarts >= 1, "global plan: restarts {} must be >= 1",
                   options.num_restarts);
  const int num_runs = options.num_restarts + (options.initial ? 1 : 0);
  std::vector<double> objectives(num_runs, 0.0);
  std::vector<NodePlan> plans(num_runs);
  // Restarts are independent; they run in parallel and the best is picked in restart order, so the
  // result does not depend on the thread count.
  std::optional<GainScale> scale;
  if (options.bound_pruning) scale.emplace(input);
  const GainScale* scale_ptr = scale ? &*scale : nullptr;
  parallel_chunks(num_runs, num_runs, options.num_threads, [&](int restart, int64_t, int64_t) {
    PlanState state(input);
    if (restart == options.num_restarts) {
      // Incremental start from the given plan: its replicas (capped at M per node and the node's
      // slots), then anything missing placed greedily.
      const NodePlan& init = *options.initial;
      COBALT_CHECK_ARG(
          init.num_experts == input.num_experts && init.num_nodes == input.topology.num_nodes(),
          "global plan: initial plan is {}x{}, need {}x{}", init.num_experts, init.num_nodes,
          input.num_experts, input.topology.num_nodes());
      for (int e = 0; e < input.num_experts; ++e) {
        for (int n = 0; n < init.num_nodes; ++n) {
          for (int i = 0; i < init.x(e, n); ++i) {
            if (state.node_used(n) < state.node_slots() && state.x(e, n) < state.per_node()) {
              state.add(e, n);
            }
          }
        }
      }
      const std::vector<double> no_noise(input.topology.num_nodes(), 0.0);
      for (int e = 0; e < input.num_experts; ++e) {
        while (state.total(e) < 1) {
          const int n = best_node_for(state, e, no_noise);
          COBALT_CHECK(n >= 0, kFailedPrecondition, "global plan: no slot left for expert {}", e);
          state.add(e, n);
        }
      }
    } else {
      initial_placement(state, input, restart, options.seed, options.use_metis);
    }
    fill_spare_slots(state);
    for (int pass = 0;
         pass < options.max_local_search_passes && local_search_pass(state, scale_ptr); ++pass) {
      fill_spare_slots(state);
    }
    objectives[restart] = state.objective();
    plans[restart] = state.finish();
  });
  HeuristicResult result;
  for (int restart = 0; restart < num_runs; ++restart) {
    if (restart == 0 || objectives[restart] > result.objective + kImprovement) {
      result.objective = objectives[restart];
      result.plan = plans[restart];
      result.best_restart = restart;
    }
  }
  result.restart_objectives = objectives;
  result.restart_plans = std::move(plans);
  return result;
}

NodePlan node_plan_of(const ExpertLayout& layout, std::span<const double> expert_load) {
  NodePlan plan(layout.num_experts(), layout.num_nodes());
  for (ExpertId e = 0; e < layout.num_experts(); ++e) {
    const double per_replica =
        expert_load.empty() ? 0.0 : expert_load[e] / layout.num_replicas_of(e);
    for (NodeId n = 0; n < layout.num_nodes(); ++n) {
      plan.x(e, n) = static_cast<int>(layout.ranks_of(e, n).size());
      plan.u(e, n) = plan.x(e, n) * per_replica;
    }
  }
  return plan;
}

ExpertLayout pack_ranks(const GlobalPlanInput& input, const NodePlan& plan,
                        const ExpertLayout* previous, std::vector<double>* slot_loads) {
  const Topology& topo = input.topology;
  const int per_node = topo.ranks_per_node(), slots = input.slots_per_rank;
  COBALT_CHECK_ARG(previous == nullptr || (previous->topology() == topo &&
                                           previous->num_experts() == input.num_experts),
                   "pack: the previous layout is for {} and E={}, the plan for {} and E={}",
                   previous ? previous->topology().to_string() : "",
                   previous ? previous->num_experts() : 0, topo.to_string(), input.num_experts);
  std::vector<std::vector<ExpertId>> lists(topo.num_ranks());
  std::vector<std::vector<double>> list_loads(topo.num_ranks());
  struct Replica {
    ExpertId expert;
    double load;
  };
  for (NodeId n = 0; n < topo.num_nodes(); ++n) {
    std::vector<Replica> replicas;
    for (ExpertId e = 0; e < input.num_experts; ++e) {
      const int x = plan.x(e, n);
      COBALT_CHECK_INTERNAL(x >= 0 && x <= per_node, "pack: expert {} has {} replicas on node {}",
                            e, x, n);
      for (int i = 0; i < x; ++i) replicas.push_back({e, plan.u(e, n) / x});
    }
    COBALT_CHECK_INTERNAL(static_cast<int>(replicas.size()) <= per_node * slots,
                          "pack: node {} has {} replicas for {} slots", n, replicas.size(),
                          per_node * slots);
    std::stable_sort(replicas.begin(), replicas.end(),
                     [](const Replica& a, const Replica& b) { return a.load > b.load; });
    const RankId first = topo.first_rank_of(n);
    std::vector<double> load(per_node, 0.0);
    std::vector<std::vector<ExpertId>> node_lists(per_node);
    std::vector<std::vector<double>> node_loads(per_node);
    bool ok = true;
    for (const Replica& rep : replicas) {
      int best = -1;
      for (int i = 0; i < per_node; ++i) {
        auto& l = node_lists[i];
        if (static_cast<int>(l.size()) >= slots ||
            std::find(l.begin(), l.end(), rep.expert) != l.end()) {
          continue;
        }
        const bool stays = previous && previous->holds(first + i, rep.expert);
        const bool best_stays = best >= 0 && previous && previous->holds(first + best, rep.expert);
        if (best < 0 || load[i] < load[best] - 1e-9 ||
            (load[i] <= load[best] + 1e-9 && stays && !best_stays)) {
          best = i;
        }
      }
      if (best < 0) {
        ok = false;
        break;
      }
      node_lists[best].push_back(rep.expert);
      node_loads[best].push_back(rep.load);
      load[best] += rep.load;
    }
    if (!ok) {
      // Round-robin over replicas grouped by expert: copies of one expert (<= M) land on distinct
      // ranks and every rank receives at most ceil(total / M) <= S replicas.
      std::stable_sort(replicas.begin(), replicas.end(),
                       [](const Replica& a, const Replica& b) { return a.expert < b.expert; });
      for (auto& l : node_lists) l.clear();
      for (auto& l : node_loads) l.clear();
      for (size_t i = 0; i < replicas.size(); ++i) {
        node_lists[i % per_node].push_back(replicas[i].expert);
        node_loads[i % per_node].push_back(replicas[i].load);
      }
    }
    // The node's ranks are interchangeable: put each packed group on the rank that keeps the most
    // of its replicas where they are.
    std::vector<int> group2rank(per_node);
    std::iota(group2rank.begin(), group2rank.end(), 0);
    if (previous) group2rank = keep_replicas_in_place(*previous, n, node_lists);
    for (int g = 0; g < per_node; ++g) {
      lists[first + group2rank[g]] = std::move(node_lists[g]);
      list_loads[first + group2rank[g]] = std::move(node_loads[g]);
    }
  }
  ExpertLayout layout = ExpertLayout::from_rank_lists(topo, input.num_experts, slots, lists);
  if (slot_loads) {
    slot_loads->assign(static_cast<size_t>(topo.num_ranks()) * slots, 0.0);
    for (RankId r = 0; r < topo.num_ranks(); ++r) {
      for (size_t i = 0; i < list_loads[r].size(); ++i)
        (*slot_loads)[static_cast<size_t>(r) * slots + i] = list_loads[r][i];
    }
  }
  return layout;
}

}  // namespace cobalt::plan
