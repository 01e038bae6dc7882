// TopoEP's two-stage per-microbatch solver (see the header for the rules and tie-breaks).
#include "cobalt/plan/topoep_solver.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"

namespace cobalt::plan {
namespace {

// Cost classes of the parameter copy a candidate target needs (stage 3 ranking).
constexpr int kCostHosted = 0;     // the target already hosts the expert
constexpr int kCostNvlink = 1;     // new replica, main instance on the same node
constexpr int kCostInterNode = 2;  // new replica, main instance on another node

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

// Stage (2)'s even split of w tasks from source s over k instances: calls fn(i, c) for each
// position i with c > 0 tasks, ascending. Each gets floor(w / k); position i gets one leftover
// task when (i - s) mod k < w mod k.
template <typename Fn>
inline void for_each_split(int64_t w, int k, RankId s, Fn&& fn) {
  if (k == 1) {
    fn(0, w);
    return;
  }
  const int64_t base = w / k, leftover = w % k;
  int rotated = (k - s % k) % k;  // (i - s) mod k at i = 0
  for (int i = 0; i < k; ++i) {
    const int64_t c = base + (rotated < leftover ? 1 : 0);
    rotated = rotated + 1 == k ? 0 : rotated + 1;
    if (c != 0) fn(i, c);
  }
}

}  // namespace

void check_topoep_input(const TopoEpInput& in) {
  const int num_ranks = in.topology.num_ranks(), num_experts = in.num_experts;
  COBALT_CHECK_ARG(num_experts >= 1 && num_experts <= kMaxExperts,
                   "topoep: number of experts {} out of range [1, {}]", num_experts, kMaxExperts);
  COBALT_CHECK_ARG(in.demand.size() == static_cast<size_t>(num_ranks) * num_experts,
                   "topoep: demand has {} entries, expected {} ranks x {} experts",
                   in.demand.size(), num_ranks, num_experts);
  // The benefit rule 2 D S_tok - |W| needs real sizes: a negative |W| would replicate experts
  // nobody routes to.
  COBALT_CHECK_ARG(std::isfinite(in.token_bytes) && in.token_bytes >= 0 &&
                       std::isfinite(in.expert_param_bytes) && in.expert_param_bytes >= 0,
                   "topoep: token bytes {} and expert parameter bytes {} must be finite and >= 0",
                   in.token_bytes, in.expert_param_bytes);
  const int mains_per_rank = (num_experts + num_ranks - 1) / num_ranks;
  COBALT_CHECK_ARG(in.slots_per_rank >= mains_per_rank,
                   "topoep: {} slots per rank cannot hold the {} main instances per rank",
                   in.slots_per_rank, mains_per_rank);
  COBALT_CHECK_ARG(in.slots_per_rank <= kMaxExperts,
                   "topoep: slots per rank {} out of range [{}, {}]", in.slots_per_rank,
                   mains_per_rank, kMaxExperts);
}

void fail_negative_demand(const TopoEpInput& in, RankId source) {
  const int64_t* row = in.demand.data() + static_cast<size_t>(source) * in.num_experts;
  const auto e = static_cast<ExpertId>(
      std::find_if(row, row + in.num_experts, [](int64_t w) { return w < 0; }) - row);
  fail(ErrorCode::kInvalidArgument, "topoep: demand[{}][{}] = {} is negative", source, e, row[e]);
}

void TopoEpSolver::solve(const TopoEpInput& in, TopoEpPlan& plan) {
  check_topoep_input(in);
  const int num_ranks = in.topology.num_ranks(), num_experts = in.num_experts;
  num_ranks_ = num_ranks;
  num_experts_ = num_experts;
  num_nodes_ = in.topology.num_nodes();
  per_node_ = in.topology.ranks_per_node();
  slots_per_rank_ = in.slots_per_rank;
  stats_ = {};

  // D [N, E] (one pass over Omega, row order, vectorisable).
  // Sums in unsigned arithmetic (a huge entry wraps instead of overflowing) until the row is
  // checked: entries at most 2^40 tasks and at most 2^52 in all, so every later sum fits.
  node_demand_.assign(static_cast<size_t>(num_nodes_) * num_experts, 0);
  constexpr int64_t kMaxEntry = int64_t{1} << 40, kMaxTotal = int64_t{1} << 52;
  int64_t total = 0;
  for (RankId s = 0; s < num_ranks; ++s) {
    const int64_t* row = in.demand.data() + static_cast<size_t>(s) * num_experts;
    int64_t* node_row = node_demand_.data() + static_cast<size_t>(s / per_node_) * num_experts;
    int64_t smallest = 0, largest = 0;
    uint64_t row_total = 0;
    for (ExpertId e = 0; e < num_experts; ++e) {
      smallest = std::min(smallest, row[e]);
      largest = std::max(largest, row[e]);
      node_row[e] =
          static_cast<int64_t>(static_cast<uint64_t>(node_row[e]) + static_cast<uint64_t>(row[e]));
      row_total += static_cast<uint64_t>(row[e]);
    }
    if (smallest < 0) fail_negative_demand(in, s);
    COBALT_CHECK_ARG(largest <= kMaxEntry, "topoep: demand row {} holds {} tasks, above 2^40", s,
                     largest);
    total += static_cast<int64_t>(row_total);  // <= 2^16 experts x 2^40: no wrap
    COBALT_CHECK_ARG(total <= kMaxTotal, "topoep: the demand sums past 2^52 tasks (at row {})", s);
  }

  // Main instances (C5).
  instances_.resize(num_experts);
  rank_experts_.resize(num_ranks);
  for (auto& r : rank_experts_) r.clear();
  main_rank_.resize(num_experts);
  main_node_.resize(num_experts);
  for (ExpertId e = 0; e < num_experts; ++e) {
    const RankId main = topoep_main_rank(e, num_experts, num_ranks);
    main_rank_[e] = main;
    main_node_[e] = in.topology.node_of(main);
    instances_[e].assign(1, Instance{main, 0});
    rank_experts_[main].push_back(e);
  }
  slots_used_.assign(num_ranks, 0);
  for (RankId r = 0; r < num_ranks; ++r) {
    slots_used_[r] = static_cast<int>(rank_experts_[r].size());
  }
  moves_.clear();

  place_inter_node(in);
  route(in);
  for (NodeId n = 0; n < num_nodes_; ++n) refine_node(in, n);
  emit(in, plan);
}

void TopoEpSolver::place_inter_node(const TopoEpInput& in) {
  if (num_nodes_ == 1) return;
  for (NodeId d = 0; d < num_nodes_; ++d) {
    const RankId first = in.topology.first_rank_of(d);
    int64_t capacity = 0;  // the node's free slots
    for (RankId r = first; r < first + per_node_; ++r) capacity += slots_per_rank_ - slots_used_[r];
    if (capacity == 0) continue;
    const int64_t* demand = node_demand_.data() + static_cast<size_t>(d) * num_experts_;
    candidates_.clear();
    for (ExpertId e = 0; e < num_experts_; ++e) {
      if (main_node_[e] == d) continue;
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
    for (int64_t e : candidates_) {
      RankId target = -1;
      for (RankId r = first; r < first + per_node_; ++r) {
        if (slots_used_[r] < slots_per_rank_ &&
            (target < 0 || slots_used_[r] < slots_used_[target])) {
          target = r;
        }
      }
      if (target < 0) break;  // the node is full
      auto& inst = instances_[e];
      inst.insert(std::upper_bound(inst.begin(), inst.end(), target,
                                   [](RankId r, const Instance& i) { return r < i.rank; }),
                  Instance{target, 0});
      rank_experts_[target].push_back(static_cast<ExpertId>(e));
      slots_used_[target] += 1;
      stats_.num_inter_node_replicas += 1;
    }
  }
}

void TopoEpSolver::route(const TopoEpInput& in) {
  // The instances of every expert as they are now, flattened (route_ranks_, by expert, ascending
  // rank); route_first_ / route_count_ [N, E]: the run of them a source on node n splits over —
  // the instances on n if any (contiguous: nodes hold contiguous ranks), else all of them.
  // Refinement inserts instances later; emit() recomputes the routed quotas from these tables
  // instead of storing them.
  const size_t table = static_cast<size_t>(num_experts_) * num_nodes_;
  route_first_.assign(table, -1);
  route_count_.assign(table, 0);
  route_ranks_.clear();
  for (ExpertId e = 0; e < num_experts_; ++e) {
    const auto& inst = instances_[e];
    const auto expert_first = static_cast<int32_t>(route_ranks_.size());
    for (const Instance& i : inst) {
      const size_t at = static_cast<size_t>(in.topology.node_of(i.rank)) * num_experts_ + e;
      if (route_count_[at]++ == 0) route_first_[at] = static_cast<int32_t>(route_ranks_.size());
      route_ranks_.push_back(i.rank);
    }
    for (NodeId n = 0; n < num_nodes_; ++n) {
      const size_t at = static_cast<size_t>(n) * num_experts_ + e;
      if (route_count_[at] == 0) {
        route_first_[at] = expert_first;
        route_count_[at] = static_cast<int32_t>(inst.size());
      }
    }
  }
  // One pass over Omega: the tasks of every instance (U), one add per quota.
  route_loads_.assign(route_ranks_.size(), 0);
  int64_t* loads = route_loads_.data();
  int64_t num_quotas = 0;
  for (RankId s = 0; s < num_ranks_; ++s) {
    const int64_t* row = in.demand.data() + static_cast<size_t>(s) * num_experts_;
    const size_t node_base = static_cast<size_t>(s / per_node_) * num_experts_;
    const int32_t* first = route_first_.data() + node_base;
    const int32_t* count = route_count_.data() + node_base;
    for (ExpertId e = 0; e < num_experts_; ++e) {
      const int64_t w = row[e];
      if (w == 0) continue;
      int64_t* at = loads + first[e];
      const int k = count[e];
      if (k == 1) {
        *at += w;
        num_quotas += 1;
        continue;
      }
      for_each_split(w, k, s, [&](int i, int64_t c) {
        at[i] += c;
        num_quotas += 1;
      });
    }
  }
  num_routed_quotas_ = num_quotas;
  rank_loads_.assign(num_ranks_, 0);
  for (ExpertId e = 0, i = 0; e < num_experts_; ++e) {
    for (Instance& inst : instances_[e]) {
      inst.load = route_loads_[i++];
      rank_loads_[inst.rank] += inst.load;
    }
  }
}

void TopoEpSolver::refine_node(const TopoEpInput& in, NodeId node) {
  const RankId first = in.topology.first_rank_of(node), last = first + per_node_;
  if (per_node_ < 2) return;
  // Per target rank of the node (index t - first): the half gap to the busiest rank, 0 when the
  // target cannot take tasks.
  half_gap_.resize(per_node_);
  while (true) {
    RankId busiest = first;
    for (RankId r = first + 1; r < last; ++r) {
      if (rank_loads_[r] > rank_loads_[busiest]) busiest = r;
    }
    int64_t max_half_gap = 0;
    for (RankId t = first; t < last; ++t) {
      const int64_t gap = rank_loads_[busiest] - rank_loads_[t];
      half_gap_[t - first] = t == busiest || gap < 2 ? 0 : gap / 2;
      max_half_gap = std::max(max_half_gap, half_gap_[t - first]);
    }
    if (max_half_gap == 0) return;  // no target: every delta would be 0
    Candidate best;
    for (ExpertId e : rank_experts_[busiest]) {
      // The instances of e on this node: a contiguous run of the rank-sorted list.
      const auto& inst = instances_[e];
      auto it = std::lower_bound(inst.begin(), inst.end(), first,
                                 [](const Instance& i, RankId r) { return i.rank < r; });
      const auto node_end = std::lower_bound(
          it, inst.end(), last, [](const Instance& i, RankId r) { return i.rank < r; });
      int64_t from_load = 0;
      for (auto j = it; j != node_end; ++j) {
        if (j->rank == busiest) from_load = j->load;
      }
      if (from_load <= 0) continue;
      // Every candidate of e has delta <= min(from_load, max_half_gap): skip e when that cannot
      // reach the best delta so far (a tie is still decided by the later keys).
      if (best.expert >= 0 && std::min(from_load, max_half_gap) < best.delta) continue;
      const bool main_here = main_node_[e] == node;
      for (RankId t = first; t < last; ++t) {
        const int64_t half_gap = half_gap_[t - first];
        while (it != node_end && it->rank < t) ++it;
        if (half_gap == 0) continue;
        const bool hosted = it != node_end && it->rank == t;
        if (!hosted && slots_used_[t] >= slots_per_rank_) continue;
        Candidate c{std::min(from_load, half_gap), rank_loads_[t],
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
      slots_used_[best.target] += 1;
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

void TopoEpSolver::apply_moves(ExpertId e, size_t& next_move) {
  std::vector<SourcedQuota>& work = final_[e];
  const size_t num_routed = work.size();  // sorted by (src, dst); moves append after them
  // A move stays inside one node and touches only quotas on two of its ranks. The moves of one
  // expert come node by node (refinement visits the nodes in order), so per node the work list
  // is indexed once: dst_entries_[dst - first] = the entries on dst in list order, quota_slots_
  // = a hash table (open addressing) from (src, dst) to the entry. Both are O(entries on the
  // node), whatever the node's width.
  if (dst_entries_.size() < static_cast<size_t>(per_node_)) dst_entries_.resize(per_node_);
  auto slot_of = [&](RankId src, RankId dst) -> int64_t& {  // the entry, or an empty (-1) slot
    const size_t mask = quota_slots_.size() - 1;
    const uint64_t key =
        (static_cast<uint64_t>(static_cast<uint32_t>(src)) << 32) | static_cast<uint32_t>(dst);
    for (size_t h = mix64(key) & mask;; h = (h + 1) & mask) {
      int64_t& slot = quota_slots_[h];
      if (slot < 0 || (work[slot].src == src && work[slot].dst == dst)) return slot;
    }
  };
  auto index_node = [&](size_t capacity) {  // every entry of the node's lists into the table
    quota_slots_.assign(capacity, -1);
    num_slotted_ = 0;
    for (const int d : touched_dsts_) {
      for (const int64_t i : dst_entries_[d]) slot_of(work[i].src, work[i].dst) = i;
      num_slotted_ += static_cast<int64_t>(dst_entries_[d].size());
    }
  };
  RankId first = 0;
  auto add_entry = [&](int64_t i) {  // an entry appended to `work` on a rank of the node
    const int d = work[i].dst - first;
    if (dst_entries_[d].empty()) touched_dsts_.push_back(d);
    dst_entries_[d].push_back(i);
    if (2 * static_cast<size_t>(num_slotted_ + 1) > quota_slots_.size()) {
      index_node(2 * quota_slots_.size());  // load factor <= 1/2
    } else {
      slot_of(work[i].src, work[i].dst) = i;
      ++num_slotted_;
    }
  };
  NodeId node = -1;
  for (; next_move < moves_.size() && moves_[next_move].expert == e; ++next_move) {
    const Move& m = moves_[next_move];
    if (m.from / per_node_ != node) {
      node = m.from / per_node_;
      first = node * per_node_;
      for (const int d : touched_dsts_) dst_entries_[d].clear();
      touched_dsts_.clear();
      size_t on_node = 0;
      for (size_t i = 0; i < work.size(); ++i) {
        if (work[i].dst / per_node_ != node) continue;
        const int d = work[i].dst - first;
        if (dst_entries_[d].empty()) touched_dsts_.push_back(d);
        dst_entries_[d].push_back(static_cast<int64_t>(i));
        ++on_node;
      }
      index_node(std::bit_ceil(4 * on_node + 16));
    }
    int64_t remaining = m.count;
    auto take = [&](int64_t i) {
      if (i < 0) return;
      const int64_t t = std::min(work[i].count, remaining);
      if (t == 0) return;
      work[i].count -= t;
      remaining -= t;
      const RankId src = work[i].src;
      const int64_t into = slot_of(src, m.to);
      if (into >= 0) {
        work[into].count += t;
      } else {
        work.push_back(SourcedQuota{src, m.to, t});
        add_entry(static_cast<int64_t>(work.size()) - 1);
      }
    };
    // Sources: the target rank itself, then the others in list order, the origin rank last.
    take(slot_of(m.to, m.from));
    const std::vector<int64_t>& on_origin = dst_entries_[m.from - first];
    for (size_t j = 0; j < on_origin.size() && remaining > 0; ++j) {
      const RankId src = work[on_origin[j]].src;
      if (src != m.to && src != m.from) take(on_origin[j]);
    }
    if (remaining > 0) take(slot_of(m.from, m.from));
    COBALT_CHECK_INTERNAL(remaining == 0,
                          "topoep: move of {} tasks of expert {} from rank {} found only {}",
                          m.count, e, m.from, m.count - remaining);
  }
  // Sorted by (src, dst): the routed prefix already is; sort the appended tail and merge.
  auto by_source = [](const SourcedQuota& a, const SourcedQuota& b) {
    return a.src != b.src ? a.src < b.src : a.dst < b.dst;
  };
  const auto routed_end = work.begin() + static_cast<std::ptrdiff_t>(num_routed);
  std::sort(routed_end, work.end(), by_source);
  std::inplace_merge(work.begin(), routed_end, work.end(), by_source);
  work.erase(
      std::remove_if(work.begin(), work.end(), [](const SourcedQuota& q) { return q.count == 0; }),
      work.end());
  // A temporary replica that ended without tasks is not materialised. Only moved experts can have
  // one: a stage-(1) replica exists only where its node's demand D > 0 (a positive benefit), is
  // the only instance of e on that node, so routing gives it all of D.
  const RankId main = main_rank_[e];
  auto& inst = instances_[e];
  for (size_t i = 0; i < inst.size();) {
    if (inst[i].rank != main && inst[i].load == 0) {
      slots_used_[inst[i].rank] -= 1;
      stats_.num_dropped_replicas += 1;
      inst.erase(inst.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

void TopoEpSolver::emit(const TopoEpInput& in, TopoEpPlan& plan) {
  plan.num_ranks = num_ranks_;
  plan.num_experts = num_experts_;
  plan.slots_per_rank = in.slots_per_rank;
  // Moved experts: their routed quotas by source (recomputed from the routing tables, one column
  // of Omega each), then their moves in order.
  moved_.assign(num_experts_, 0);
  for (const Move& m : moves_) moved_[m.expert] = 1;
  final_.resize(num_experts_);
  int64_t total = num_routed_quotas_;
  for (ExpertId e = 0; e < num_experts_; ++e) {
    if (!moved_[e]) continue;
    std::vector<SourcedQuota>& work = final_[e];
    work.clear();
    for (RankId s = 0; s < num_ranks_; ++s) {
      const int64_t w = in.demand[static_cast<size_t>(s) * num_experts_ + e];
      if (w == 0) continue;
      const size_t at = static_cast<size_t>(s / per_node_) * num_experts_ + e;
      const RankId* chosen = route_ranks_.data() + route_first_[at];
      for_each_split(w, route_count_[at], s, [&](int i, int64_t c) {
        work.push_back(SourcedQuota{s, chosen[i], c});
      });
    }
    total -= static_cast<int64_t>(work.size());
  }
  std::stable_sort(moves_.begin(), moves_.end(),
                   [](const Move& a, const Move& b) { return a.expert < b.expert; });
  for (size_t next = 0; next < moves_.size();) apply_moves(moves_[next].expert, next);
  for (ExpertId e = 0; e < num_experts_; ++e) {
    if (moved_[e]) total += static_cast<int64_t>(final_[e].size());
  }

  // Quotas by source: the routed split of every unmoved expert, the final quotas of moved ones.
  plan.quotas.resize(total);
  plan.source_offsets.assign(num_ranks_ + 1, 0);
  to_entry_.assign(num_experts_, 0);  // cursor into final_[e]
  TopoEpQuota* out = plan.quotas.data();
  const uint8_t* moved = moved_.data();
  const RankId* route_ranks = route_ranks_.data();
  for (RankId s = 0; s < num_ranks_; ++s) {
    const int64_t* row = in.demand.data() + static_cast<size_t>(s) * num_experts_;
    const size_t node_base = static_cast<size_t>(s / per_node_) * num_experts_;
    const int32_t* first = route_first_.data() + node_base;
    const int32_t* count = route_count_.data() + node_base;
    for (ExpertId e = 0; e < num_experts_; ++e) {
      const int64_t w = row[e];
      if (w == 0) continue;
      if (moved[e]) {
        const auto& fin = final_[e];
        int64_t& c = to_entry_[e];
        for (; c < static_cast<int64_t>(fin.size()) && fin[c].src == s; ++c) {
          *out++ = TopoEpQuota{e, fin[c].dst, fin[c].count};
        }
        continue;
      }
      const RankId* chosen = route_ranks + first[e];
      const int k = count[e];
      if (k == 1) {
        *out++ = TopoEpQuota{e, chosen[0], w};
        continue;
      }
      for_each_split(w, k, s, [&](int i, int64_t c) { *out++ = TopoEpQuota{e, chosen[i], c}; });
    }
    plan.source_offsets[s + 1] = out - plan.quotas.data();
  }
  COBALT_CHECK_INTERNAL(out == plan.quotas.data() + total, "topoep: wrote {} of {} quotas",
                        out - plan.quotas.data(), total);
  // Slots: mains (ascending), then temporary replicas (ascending expert id).
  plan.slots.assign(static_cast<size_t>(num_ranks_) * in.slots_per_rank, kEmptySlot);
  std::vector<int32_t>& fill = num_fill_;
  fill.assign(num_ranks_, 0);
  for (ExpertId e = 0; e < num_experts_; ++e) {
    const RankId main = main_rank_[e];
    plan.slots[static_cast<size_t>(main) * in.slots_per_rank + fill[main]++] = e;
  }
  for (ExpertId e = 0; e < num_experts_; ++e) {
    const RankId main = main_rank_[e];
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
