// TopoEP's two-stage per-microbatch solver (see the header for the rules and tie-breaks).
#include "cobalt/plan/topoep_solver.hpp"

#include <algorithm>

#include "cobalt/core/error.hpp"

namespace cobalt::plan {
namespace {

// Cost classes of the parameter copy a candidate target needs (stage 3 ranking).
constexpr int kCostHosted = 0;      // the target already hosts the expert
constexpr int kCostNvlink = 1;      // new replica, main instance on the same node
constexpr int kCostInterNode = 2;   // new replica, main instance on another node

struct Candidate {
  int64_t delta = 0;
  int64_t target_load = 0;
  int cost = 0;
  ExpertId expert = -1;
  RankId target = -1;

  // Lexicographic: larger delta, smaller target load, smaller cost, lower expert, lower target.
  bool better_than(const Candidate& o) const {
    if (o.expert < 0) return true;
    if (delta != o.delta) return delta > o.delta;
    if (target_load != o.target_load) return target_load < o.target_load;
    if (cost != o.cost) return cost < o.cost;
    if (expert != o.expert) return expert < o.expert;
    return target < o.target;
  }
};

}  // namespace

int64_t TopoEpSolver::instance_load(ExpertId e, RankId r) const {
  for (const Instance& inst : instances_[e]) {
    if (inst.rank == r) return inst.load;
  }
  return -1;  // not hosted
}

void TopoEpSolver::solve(const TopoEpInput& in, TopoEpPlan& plan) {
  const int num_ranks = in.topology.num_ranks(), num_experts = in.num_experts;
  COBALT_CHECK_ARG(num_experts >= 1, "topoep: number of experts {} must be >= 1", num_experts);
  COBALT_CHECK_ARG(in.demand.size() == static_cast<size_t>(num_ranks) * num_experts,
                   "topoep: demand has {} entries, expected {} ranks x {} experts",
                   in.demand.size(), num_ranks, num_experts);
  const int mains_per_rank = (num_experts + num_ranks - 1) / num_ranks;
  COBALT_CHECK_ARG(in.slots_per_rank >= mains_per_rank,
                   "topoep: {} slots per rank cannot hold the {} main instances per rank",
                   in.slots_per_rank, mains_per_rank);
  num_ranks_ = num_ranks;
  num_experts_ = num_experts;
  num_nodes_ = in.topology.num_nodes();
  per_node_ = in.topology.ranks_per_node();
  extra_slots_ = in.slots_per_rank - mains_per_rank;
  stats_ = {};

  // D [N, E] and the non-zero demands grouped by expert (two passes over Omega, row order).
  node_demand_.assign(static_cast<size_t>(num_nodes_) * num_experts, 0);
  nnz_offsets_.assign(num_experts + 1, 0);
  for (RankId s = 0; s < num_ranks; ++s) {
    const int64_t* row = in.demand.data() + static_cast<size_t>(s) * num_experts;
    int64_t* node_row = node_demand_.data() + static_cast<size_t>(s / per_node_) * num_experts;
    for (ExpertId e = 0; e < num_experts; ++e) {
      const int64_t w = row[e];
      COBALT_CHECK_ARG(w >= 0, "topoep: demand[{}][{}] = {} is negative", s, e, w);
      node_row[e] += w;
      nnz_offsets_[e + 1] += w > 0;
    }
  }
  for (ExpertId e = 0; e < num_experts; ++e) nnz_offsets_[e + 1] += nnz_offsets_[e];
  nnz_src_.resize(nnz_offsets_[num_experts]);
  nnz_count_.resize(nnz_offsets_[num_experts]);
  candidates_.assign(nnz_offsets_.begin(), nnz_offsets_.end() - 1);  // fill cursors
  for (RankId s = 0; s < num_ranks; ++s) {
    const int64_t* row = in.demand.data() + static_cast<size_t>(s) * num_experts;
    for (ExpertId e = 0; e < num_experts; ++e) {
      if (row[e] > 0) {
        const int64_t i = candidates_[e]++;
        nnz_src_[i] = s;
        nnz_count_[i] = row[e];
      }
    }
  }

  // Main instances (C5).
  instances_.resize(num_experts);
  rank_experts_.resize(num_ranks);
  for (auto& r : rank_experts_) r.clear();
  for (ExpertId e = 0; e < num_experts; ++e) {
    const RankId main = topoep_main_rank(e, num_experts, num_ranks);
    instances_[e].assign(1, Instance{main, 0});
    rank_experts_[main].push_back(e);
  }
  replicas_used_.assign(num_ranks, 0);
  moves_.clear();

  place_inter_node(in);
  route(in);
  for (NodeId n = 0; n < num_nodes_; ++n) refine_node(in, n);
  emit(in, plan);
}

void TopoEpSolver::place_inter_node(const TopoEpInput& in) {
  if (extra_slots_ == 0 || num_nodes_ == 1) return;
  const int64_t capacity = static_cast<int64_t>(per_node_) * extra_slots_;
  for (NodeId d = 0; d < num_nodes_; ++d) {
    const int64_t* demand = node_demand_.data() + static_cast<size_t>(d) * num_experts_;
    candidates_.clear();
    for (ExpertId e = 0; e < num_experts_; ++e) {
      const RankId main = topoep_main_rank(e, num_experts_, num_ranks_);
      if (in.topology.node_of(main) == d) continue;
      const double benefit =
          2.0 * static_cast<double>(demand[e]) * in.token_bytes - in.expert_param_bytes;
      if (benefit > 0) candidates_.push_back(e);
    }
    // Benefit is increasing in D (the same |W| for every expert): descending D, lower id first.
    auto by_benefit = [demand](int64_t a, int64_t b) {
      return demand[a] != demand[b] ? demand[a] > demand[b] : a < b;
    };
    if (static_cast<int64_t>(candidates_.size()) > capacity) {
      std::nth_element(candidates_.begin(), candidates_.begin() + capacity, candidates_.end(),
                       by_benefit);
      candidates_.resize(capacity);
    }
    std::sort(candidates_.begin(), candidates_.end(), by_benefit);
    const RankId first = in.topology.first_rank_of(d);
    for (int64_t e : candidates_) {
      RankId target = -1;
      for (RankId r = first; r < first + per_node_; ++r) {
        if (replicas_used_[r] < extra_slots_ &&
            (target < 0 || replicas_used_[r] < replicas_used_[target])) {
          target = r;
        }
      }
      if (target < 0) break;  // the node is full
      auto& inst = instances_[e];
      inst.insert(std::upper_bound(inst.begin(), inst.end(), target,
                                   [](RankId r, const Instance& i) { return r < i.rank; }),
                  Instance{target, 0});
      rank_experts_[target].push_back(static_cast<ExpertId>(e));
      replicas_used_[target] += 1;
      stats_.num_inter_node_replicas += 1;
    }
  }
}

void TopoEpSolver::route(const TopoEpInput& in) {
  rank_loads_.assign(num_ranks_, 0);
  routed_.clear();
  expert_quota_begin_.assign(num_experts_ + 1, 0);
  // Per node: [first, first + count) range of the expert's instances on that node.
  std::vector<int>& node_first = scratch_first_;
  std::vector<int>& node_count = scratch_count_;
  node_first.assign(num_nodes_, 0);
  node_count.assign(num_nodes_, 0);
  for (ExpertId e = 0; e < num_experts_; ++e) {
    auto& inst = instances_[e];
    const int num_inst = static_cast<int>(inst.size());
    for (int i = 0; i < num_inst; ++i) {
      const NodeId n = in.topology.node_of(inst[i].rank);
      if (node_count[n]++ == 0) node_first[n] = i;
    }
    for (int64_t z = nnz_offsets_[e]; z < nnz_offsets_[e + 1]; ++z) {
      const RankId s = nnz_src_[z];
      const int64_t w = nnz_count_[z];
      const NodeId n = s / per_node_;
      const int begin = node_count[n] > 0 ? node_first[n] : 0;
      const int k = node_count[n] > 0 ? node_count[n] : num_inst;
      const int64_t base = w / k, leftover = w % k;
      for (int i = 0; i < k; ++i) {
        // Position i gets a leftover task when (i - s) mod k < leftover.
        const int64_t c = base + (((i - s % k) + k) % k < leftover ? 1 : 0);
        if (c == 0) continue;
        Instance& target = inst[begin + i];
        routed_.push_back(TopoEpQuota{s, target.rank, c});
        target.load += c;
        rank_loads_[target.rank] += c;
      }
    }
    for (int i = 0; i < num_inst; ++i) node_count[in.topology.node_of(inst[i].rank)] = 0;
    expert_quota_begin_[e + 1] = static_cast<int64_t>(routed_.size());
  }
}

void TopoEpSolver::refine_node(const TopoEpInput& in, NodeId node) {
  const RankId first = in.topology.first_rank_of(node), last = first + per_node_;
  if (per_node_ < 2) return;
  while (true) {
    RankId busiest = first;
    for (RankId r = first + 1; r < last; ++r) {
      if (rank_loads_[r] > rank_loads_[busiest]) busiest = r;
    }
    Candidate best;
    for (ExpertId e : rank_experts_[busiest]) {
      const int64_t from_load = instance_load(e, busiest);
      if (from_load <= 0) continue;
      const bool main_here =
          in.topology.node_of(topoep_main_rank(e, num_experts_, num_ranks_)) == node;
      for (RankId t = first; t < last; ++t) {
        if (t == busiest) continue;
        const int64_t gap = rank_loads_[busiest] - rank_loads_[t];
        if (gap < 2) continue;
        const bool hosted = instance_load(e, t) >= 0;
        if (!hosted && replicas_used_[t] >= extra_slots_) continue;
        Candidate c{std::min(from_load, gap / 2), rank_loads_[t],
                    hosted ? kCostHosted : (main_here ? kCostNvlink : kCostInterNode), e, t};
        if (c.better_than(best)) best = c;
      }
    }
    if (best.expert < 0) return;
    auto& inst = instances_[best.expert];
    auto at = [&inst](RankId r) {
      return std::lower_bound(inst.begin(), inst.end(), r,
                              [](const Instance& i, RankId v) { return i.rank < v; });
    };
    auto to = at(best.target);
    if (to == inst.end() || to->rank != best.target) {
      to = inst.insert(to, Instance{best.target, 0});
      rank_experts_[best.target].push_back(best.expert);
      replicas_used_[best.target] += 1;
      stats_.num_intra_node_replicas += 1;
    }
    to->load += best.delta;
    at(busiest)->load -= best.delta;
    rank_loads_[busiest] -= best.delta;
    rank_loads_[best.target] += best.delta;
    moves_.push_back(Move{best.expert, busiest, best.target, best.delta});
    stats_.num_refinement_moves += 1;
  }
}

void TopoEpSolver::emit(const TopoEpInput& in, TopoEpPlan& plan) {
  plan.num_ranks = num_ranks_;
  plan.num_experts = num_experts_;
  plan.slots_per_rank = in.slots_per_rank;
  plan.quotas.clear();
  plan.quota_offsets.assign(num_experts_ + 1, 0);
  // Moves grouped by expert, in application order.
  std::stable_sort(moves_.begin(), moves_.end(),
                   [](const Move& a, const Move& b) { return a.expert < b.expert; });
  size_t next_move = 0;
  std::vector<TopoEpQuota>& work = scratch_quotas_;
  for (ExpertId e = 0; e < num_experts_; ++e) {
    const auto begin = routed_.begin() + expert_quota_begin_[e];
    const auto end = routed_.begin() + expert_quota_begin_[e + 1];
    if (next_move == moves_.size() || moves_[next_move].expert != e) {
      plan.quotas.insert(plan.quotas.end(), begin, end);
      plan.quota_offsets[e + 1] = static_cast<int64_t>(plan.quotas.size());
      continue;
    }
    work.assign(begin, end);
    for (; next_move < moves_.size() && moves_[next_move].expert == e; ++next_move) {
      const Move& m = moves_[next_move];
      int64_t remaining = m.count;
      // Take from sources: the target itself, then ascending sources, the origin rank last.
      auto take = [&](size_t i) {
        const int64_t t = std::min(work[i].count, remaining);
        if (t == 0) return;
        work[i].count -= t;
        remaining -= t;
        const RankId src = work[i].src;
        for (auto& q : work) {
          if (q.src == src && q.dst == m.to) {
            q.count += t;
            return;
          }
        }
        work.push_back(TopoEpQuota{src, m.to, t});
      };
      const size_t n = work.size();
      for (size_t i = 0; i < n && remaining > 0; ++i) {
        if (work[i].dst == m.from && work[i].src == m.to) take(i);
      }
      for (size_t i = 0; i < n && remaining > 0; ++i) {
        if (work[i].dst == m.from && work[i].src != m.to && work[i].src != m.from) take(i);
      }
      for (size_t i = 0; i < n && remaining > 0; ++i) {
        if (work[i].dst == m.from && work[i].src == m.from) take(i);
      }
      COBALT_CHECK_INTERNAL(remaining == 0, "topoep: move of {} tasks of expert {} from rank {} "
                            "found only {}", m.count, e, m.from, m.count - remaining);
    }
    work.erase(std::remove_if(work.begin(), work.end(),
                              [](const TopoEpQuota& q) { return q.count == 0; }),
               work.end());
    std::sort(work.begin(), work.end(), [](const TopoEpQuota& a, const TopoEpQuota& b) {
      return a.src != b.src ? a.src < b.src : a.dst < b.dst;
    });
    plan.quotas.insert(plan.quotas.end(), work.begin(), work.end());
    plan.quota_offsets[e + 1] = static_cast<int64_t>(plan.quotas.size());
    // A temporary replica that ended without tasks is not materialised.
    const RankId main = topoep_main_rank(e, num_experts_, num_ranks_);
    auto& inst = instances_[e];
    for (size_t i = 0; i < inst.size();) {
      if (inst[i].rank != main && inst[i].load == 0) {
        replicas_used_[inst[i].rank] -= 1;
        stats_.num_dropped_replicas += 1;
        inst.erase(inst.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  }
  // Slots: mains (ascending), then temporary replicas (ascending expert id).
  plan.slots.assign(static_cast<size_t>(num_ranks_) * in.slots_per_rank, kEmptySlot);
  std::vector<int>& fill = scratch_count_;
  fill.assign(num_ranks_, 0);
  for (ExpertId e = 0; e < num_experts_; ++e) {
    const RankId main = topoep_main_rank(e, num_experts_, num_ranks_);
    plan.slots[static_cast<size_t>(main) * in.slots_per_rank + fill[main]++] = e;
  }
  for (ExpertId e = 0; e < num_experts_; ++e) {
    const RankId main = topoep_main_rank(e, num_experts_, num_ranks_);
    for (const Instance& inst : instances_[e]) {
      if (inst.rank == main) continue;
      plan.slots[static_cast<size_t>(inst.rank) * in.slots_per_rank + fill[inst.rank]++] = e;
    }
  }
  plan.rank_loads = rank_loads_;
  plan.stats = stats_;
}

TopoEpPlan solve_topoep(const TopoEpInput& input) {
  TopoEpSolver solver;
  TopoEpPlan plan;
  solver.solve(input, plan);
  return plan;
}

}  // namespace cobalt::plan
