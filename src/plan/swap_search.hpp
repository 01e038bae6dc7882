// Internal: what swap_toward_floor and its reference share (floor_swaps.cpp): the candidates of
// a swap and the exchanges in the order they are tried, the search state (holders and slots as
// they change, an open group), and the upper bounds that rule out changes without their flow
// check (Headroom, SwapSearch::may_close).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <tuple>
#include <vector>

#include "cobalt/assign/balance_cap.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/core/expert_layout.hpp"
#include "cobalt/plan/floor_swaps.hpp"
#include "rank_bound_flow.hpp"

namespace cobalt::plan::swap_search {

struct Candidate {
  double price;
  bool cross_node_copy;  // e has no replica on r's node yet
  int64_t neg_count;     // -count of e: busier experts first
  RankId rank;
  int slot;
  ExpertId expert;
  auto key() const { return std::tie(price, cross_node_copy, neg_count, rank, slot, expert); }
};

// Step 4's exchange: a replica of the tight expert e on rank a (slot sa) and the replica of f on
// rank r outside the tight set's holders (slot s) trade places.
struct Exchange {
  double price;
  int64_t f_count;      // tasks of f, which move into N(X)
  int64_t neg_e_count;  // -count of e: busier experts first
  RankId r;
  int s;
  RankId a;
  int sa;
  ExpertId e;
  ExpertId f;
  auto key() const { return std::tie(price, f_count, neg_e_count, r, s, a, e); }
};

// Whether a > b * k, for a >= 0 and b, k >= 0, without forming the product (it can exceed
// int64 where a floor near 2^52 meets thousands of ranks or a large group).
inline bool exceeds_product(int64_t a, int64_t b, int64_t k) {
  if (a <= 0) return false;
  if (b == 0 || k == 0) return true;
  return (a - 1) / b >= k;
}

inline void remove_rank(std::vector<RankId>& ranks, RankId r) {
  ranks.erase(std::find(ranks.begin(), ranks.end(), r));
}

inline void insert_rank(std::vector<RankId>& ranks, RankId r) {
  ranks.insert(std::upper_bound(ranks.begin(), ranks.end(), r), r);
}

// Upper bounds on what a change that gives a tight expert e a rank r outside N(X) can add to the
// maximum flow at floor - 1 (detail::RankBoundNetwork::room_through, supply_through): a change
// closes a shortfall only if both are at least the shortfall, so candidates and exchanges below
// them are left out untried. Each bound is the growth of the maximum flow when one uncapped edge
// is added, so it does not depend on which maximum flow `below` holds; each is one max flow,
// computed when first asked for. `below` must not change while this is in use.
class Headroom {
 public:
  explicit Headroom(const detail::RankBoundNetwork& below)
      : below_(&below), rank_(below.num_ranks(), -1), expert_(below.num_experts(), -1) {}
  Headroom(const Headroom&) = delete;
  Headroom& operator=(const Headroom&) = delete;

  int64_t rank(RankId r) {  // r outside N(X)
    if (rank_[r] < 0) {
      rank_[r] = below_->room_through(r, scratch());
      ++num_flows_;
    }
    return rank_[r];
  }
  int64_t expert(ExpertId e) {  // e tight
    if (expert_[e] < 0) {
      expert_[e] = below_->supply_through(e, scratch());
      ++num_flows_;
    }
    return expert_[e];
  }

  // Steps 3-4 consult the bounds while they pay: for their first kBoundFlowsOnTrial flows, and
  // then while they rule out at least one change per two flows. (On large steps where swaps fail
  // because of the replica they replace, which the bounds ignore, they rule out nothing.)
  bool worth_consulting() const {
    return num_flows_ < kBoundFlowsOnTrial || 2 * num_ruled_out_ >= num_flows_;
  }
  void note_ruled_out() { ++num_ruled_out_; }

 private:
  static constexpr int kBoundFlowsOnTrial = 4;
  // Each bound's copy of below, made at the first bound (its buffers reused after it).
  detail::RankBoundNetwork& scratch() {
    if (!scratch_) scratch_.emplace(*below_);
    return *scratch_;
  }
  const detail::RankBoundNetwork* below_;
  int num_flows_ = 0, num_ruled_out_ = 0;
  std::optional<detail::RankBoundNetwork> scratch_;
  std::vector<int64_t> rank_, expert_;
};

// Steps 3-4 of swap_toward_floor check this many changes per round before they consult may_close
// (below): on large steps the first candidate usually passes, and bounds computed for it would
// cost more flows than they save (on Qwen's decode steps they save most of the flows).
inline constexpr int kChecksBeforeBounds = 4;

// What both implementations share: the checked input, the holders and slots as they change, the
// target, and the candidates of one swap in the order they are tried.
class SwapSearch {
 public:
  SwapSearch(const ExpertLayout& layout, std::span<const int64_t> expert_counts,
             std::span<const double> removal_cost, const FloorSwapOptions& options)
      : layout_(layout), counts_(expert_counts), removal_cost_(removal_cost), options_(options) {
    const int num_experts = layout.num_experts(), num_nodes = layout.num_nodes();
    COBALT_CHECK_ARG(static_cast<int64_t>(expert_counts.size()) == num_experts,
                     "floor swaps: {} expert counts for a layout of {} experts",
                     expert_counts.size(), num_experts);
    COBALT_CHECK_ARG(removal_cost.size() == static_cast<size_t>(num_nodes) * num_experts,
                     "floor swaps: {} removal costs, expected N x E = {} x {}", removal_cost.size(),
                     num_nodes, num_experts);
    COBALT_CHECK_ARG(std::isfinite(options.tolerance) && options.tolerance >= 0,
                     "floor swaps: tolerance {} must be finite and >= 0", options.tolerance);
    COBALT_CHECK_ARG(options.max_swaps >= 0, "floor swaps: max_swaps {} must be >= 0",
                     options.max_swaps);
    COBALT_CHECK_ARG(options.max_checks >= 1, "floor swaps: max_checks {} must be >= 1",
                     options.max_checks);
    COBALT_CHECK_ARG(options.max_exchange_checks >= 0,
                     "floor swaps: max_exchange_checks {} must be >= 0",
                     options.max_exchange_checks);
    COBALT_CHECK_ARG(options.max_group_swaps >= 0, "floor swaps: max_group_swaps {} must be >= 0",
                     options.max_group_swaps);
    for (ExpertId e = 0; e < num_experts; ++e) {
      COBALT_CHECK_ARG(expert_counts[e] >= 0, "floor swaps: expert {} has {} tasks (must be >= 0)",
                       e, expert_counts[e]);
      COBALT_CHECK_ARG(expert_counts[e] <= (int64_t{1} << 52) - total_,
                       "floor swaps: more than 2^52 tasks in all");
      total_ += expert_counts[e];
    }
    for (size_t i = 0; i < removal_cost.size(); ++i) {
      COBALT_CHECK_ARG(
          std::isfinite(removal_cost[i]) && removal_cost[i] >= 0,
          "floor swaps: removal cost {} of (node {}, expert {}) must be finite and >= 0",
          removal_cost[i], i / num_experts, i % num_experts);
    }
    slots_.assign(layout.slots().begin(), layout.slots().end());
    holders_.resize(num_experts);
    for (ExpertId e = 0; e < num_experts; ++e) {
      holders_[e].assign(layout.ranks_of(e).begin(), layout.ranks_of(e).end());
    }
    // The spill's cap (assign/balance_cap.hpp); a tolerance so large that the cap passes every
    // task leaves no floor above it (no swap).
    target_ = assign::balance_cap(total_, layout.num_ranks(), options.tolerance);
  }

  int64_t total() const { return total_; }
  int64_t target() const { return target_; }
  const std::vector<std::vector<RankId>>& holders() const { return holders_; }
  std::span<const int64_t> counts() const { return counts_; }
  int num_ranks() const { return layout_.num_ranks(); }
  const FloorSwapOptions& options() const { return options_; }

  // No assignment goes below this: the mean, and each expert's even split over its holders.
  int64_t lower_bound() const {
    int64_t lower = (total_ + num_ranks() - 1) / num_ranks();
    for (ExpertId e = 0; e < layout_.num_experts(); ++e) {
      if (counts_[e] == 0) continue;
      const auto n = static_cast<int64_t>(holders_[e].size());
      lower = std::max(lower, (counts_[e] + n - 1) / n);
    }
    return lower;
  }

  // The candidates for one swap given the tight set at floor - 1, in the order they are tried
  // (at most max_checks of them). closing_only: only experts that could close the shortfall
  // alone (steps 2-3); otherwise every tight expert with tasks (step 5's groups).
  const std::vector<Candidate>& candidates(const detail::TightSet& tight, int64_t floor,
                                           bool closing_only = true) {
    const int num_ranks = layout_.num_ranks(), slots = layout_.slots_per_rank();
    const int per_node = layout_.topology().ranks_per_node();
    const int num_experts = layout_.num_experts();
    const int64_t missing = shortfall(tight, floor);
    candidates_.clear();
    for (ExpertId e = 0; e < num_experts; ++e) {
      // Only e's tasks can use its new rank: fewer than the shortfall cannot close it (the cut
      // with e moved to the sink side grows by count(e) only).
      if (!tight.experts[e] || counts_[e] == 0 || (closing_only && counts_[e] < missing)) continue;
      for (RankId r = 0; r < num_ranks; ++r) {
        if (tight.ranks[r]) continue;  // every holder of the tight experts is marked
        const NodeId n = r / per_node;
        const auto on_node = [&](ExpertId x) {
          return std::count_if(holders_[x].begin(), holders_[x].end(),
                               [&](RankId h) { return h / per_node == n; });
        };
        const bool cross_node_copy = on_node(e) == 0;
        bool free_slot_listed = false;
        for (int s = 0; s < slots; ++s) {
          // A slot an open group's earlier swap filled stays (overwriting it wastes that copy).
          if (!in_group_.empty() && in_group_[static_cast<size_t>(r) * slots + s]) continue;
          const ExpertId f = slots_[static_cast<size_t>(r) * slots + s];
          double price = 0;
          if (f == kEmptySlot) {
            // The rank's free slots are one change of the flow: only the first is a candidate.
            if (free_slot_listed) continue;
            free_slot_listed = true;
          } else {
            if (holders_[f].size() < 2) continue;  // its only replica
            if (on_node(f) < 2) price = removal_cost_[static_cast<size_t>(n) * num_experts + f];
          }
          candidates_.push_back({price, cross_node_copy, -counts_[e], r, s, e});
        }
      }
    }
    const auto by_key = [](const Candidate& a, const Candidate& b) { return a.key() < b.key(); };
    const auto num_tried = std::min<size_t>(candidates_.size(), options_.max_checks);
    std::partial_sort(candidates_.begin(), candidates_.begin() + static_cast<ptrdiff_t>(num_tried),
                      candidates_.end(), by_key);
    candidates_.resize(num_tried);
    return candidates_;
  }

  // Whether a candidate of step 2 or an exchange of step 4 may still bring every task under
  // floor - 1, by necessary conditions that are cheaper than its flow check; false only where
  // that check would fail (the reference confirms it for every change it tries, and for every
  // exchange in each round's list). Both: the tight expert's supply and its new rank's room
  // reach the shortfall (see Headroom). An exchange also: (1) Hall's condition for X and f, which
  // moves into N(X): X's and f's tasks fit on N(X) and f's holders outside it, so missing +
  // count(f) <= (floor - 1) x (f's holders outside N(X), r among them); (2) the rank a that e
  // leaves keeps another tight replica: otherwise a leaves N(X) as r joins it, and Hall's
  // condition for X fails as before.
  bool may_close(const Candidate& c, const detail::TightSet&, int64_t missing, int64_t,
                 Headroom& headroom) const {
    return headroom.expert(c.expert) >= missing && headroom.rank(c.rank) >= missing;
  }
  bool may_close(const Exchange& x, const detail::TightSet& tight, int64_t missing, int64_t floor,
                 Headroom& headroom) const {
    const auto f_outside = std::count_if(holders_[x.f].begin(), holders_[x.f].end(),
                                         [&](RankId h) { return !tight.ranks[h]; });
    if (exceeds_product(missing + counts_[x.f], floor - 1, f_outside)) return false;
    const int slots = layout_.slots_per_rank();
    const auto a_slots = std::span(slots_).subspan(static_cast<size_t>(x.a) * slots, slots);
    const auto num_tight_on_a = std::count_if(a_slots.begin(), a_slots.end(), [&](ExpertId y) {
      return y != kEmptySlot && tight.experts[y];
    });
    if (num_tight_on_a < 2) return false;
    return headroom.expert(x.e) >= missing && headroom.rank(x.r) >= missing;
  }

  // Tasks of the tight experts X beyond what their ranks N(X) take under floor - 1: the max flow's
  // shortfall at that bound (X, N(X) the source side of its minimum cut).
  int64_t shortfall(const detail::TightSet& tight, int64_t floor) const {
    int64_t tasks = 0, ranks = 0;
    for (ExpertId e = 0; e < layout_.num_experts(); ++e) tasks += tight.experts[e] ? counts_[e] : 0;
    for (RankId r = 0; r < layout_.num_ranks(); ++r) ranks += tight.ranks[r];
    return tasks - (floor - 1) * ranks;
  }

  // Step 4's exchanges given the tight set at floor - 1, in the order they are tried (at most
  // max_exchange_checks of them). An expert f with one replica that moves into the tight ranks must
  // fit there with the shortfall: tasks(X) + count(f) <= (floor - 1) |N(X) + r| (Hall's condition
  // for X and f), so exchanges of a busier single replica are left out: they cannot pass.
  const std::vector<Exchange>& exchanges(const detail::TightSet& tight, int64_t floor) {
    const int num_ranks = layout_.num_ranks(), slots = layout_.slots_per_rank();
    const int per_node = layout_.topology().ranks_per_node();
    const int num_experts = layout_.num_experts();
    const auto alone_on_node = [&](ExpertId x, RankId rank) {
      const NodeId n = rank / per_node;
      return std::none_of(holders_[x].begin(), holders_[x].end(),
                          [&](RankId h) { return h != rank && h / per_node == n; });
    };
    exchanges_.clear();
    const int64_t missing = shortfall(tight, floor);
    std::vector<ExpertId> tight_experts;  // that could close the shortfall (see candidates())
    for (ExpertId e = 0; e < num_experts; ++e) {
      if (tight.experts[e] && counts_[e] > 0 && counts_[e] >= missing) tight_experts.push_back(e);
    }
    for (RankId r = 0; r < num_ranks; ++r) {
      if (tight.ranks[r]) continue;
      for (int s = 0; s < slots; ++s) {
        const ExpertId f = slots_[static_cast<size_t>(r) * slots + s];
        if (f == kEmptySlot) continue;  // an empty slot is a step-2 candidate
        if (holders_[f].size() == 1 && missing + counts_[f] > floor - 1) continue;
        for (ExpertId e : tight_experts) {
          for (RankId a : holders_[e]) {
            // e is tight and r is not, so e is not on r; f must not be on a already.
            if (std::binary_search(holders_[f].begin(), holders_[f].end(), a)) continue;
            const bool same_node = a / per_node == r / per_node;
            double price = 0;
            if (!same_node) {
              if (alone_on_node(f, r)) {
                price += removal_cost_[static_cast<size_t>(r / per_node) * num_experts + f];
              }
              if (alone_on_node(e, a)) {
                price += removal_cost_[static_cast<size_t>(a / per_node) * num_experts + e];
              }
            }
            int sa = 0;
            while (slots_[static_cast<size_t>(a) * slots + sa] != e) ++sa;
            exchanges_.push_back({price, counts_[f], -counts_[e], r, s, a, sa, e, f});
          }
        }
      }
    }
    const auto by_key = [](const Exchange& x, const Exchange& y) { return x.key() < y.key(); };
    const auto num_tried = std::min<size_t>(exchanges_.size(), options_.max_exchange_checks);
    std::partial_sort(exchanges_.begin(), exchanges_.begin() + static_cast<ptrdiff_t>(num_tried),
                      exchanges_.end(), by_key);
    exchanges_.resize(num_tried);
    return exchanges_;
  }

  // Holders as if the exchange were applied (undo restores them).
  void try_on(const Exchange& x) {
    remove_rank(holders_[x.e], x.a);
    insert_rank(holders_[x.e], x.r);
    remove_rank(holders_[x.f], x.r);
    insert_rank(holders_[x.f], x.a);
  }
  void undo(const Exchange& x) {
    remove_rank(holders_[x.e], x.r);
    insert_rank(holders_[x.e], x.a);
    remove_rank(holders_[x.f], x.a);
    insert_rank(holders_[x.f], x.r);
  }
  // Keeps an exchange tried on: its two slots and the record of the swap.
  void commit(const Exchange& x, FloorSwapResult& result) {
    ReplicaSwap swap{x.r, x.s, x.f, x.e};
    swap.exchange_rank = x.a;
    swap.exchange_slot = x.sa;
    result.swaps.push_back(swap);
    apply_swap(swap, layout_.slots_per_rank(), slots_);
  }

  // A candidate's identity (its slot and expert), for looking up what was measured of it.
  uint64_t key_of(const Candidate& c) const {
    const auto slot = static_cast<uint64_t>(c.rank) * layout_.slots_per_rank() + c.slot;
    return slot * static_cast<uint64_t>(layout_.num_experts()) + static_cast<uint64_t>(c.expert);
  }

  // The replica a candidate replaces (kEmptySlot for a free slot).
  ExpertId replaced(const Candidate& c) const {
    return slots_[static_cast<size_t>(c.rank) * layout_.slots_per_rank() + c.slot];
  }

  // Holders as if the candidate were applied (undo restores them).
  void try_on(const Candidate& c) {
    insert_rank(holders_[c.expert], c.rank);
    if (replaced(c) != kEmptySlot) remove_rank(holders_[replaced(c)], c.rank);
  }
  void undo(const Candidate& c) {
    remove_rank(holders_[c.expert], c.rank);
    if (replaced(c) != kEmptySlot) insert_rank(holders_[replaced(c)], c.rank);
  }
  // Keeps a candidate tried on: its slot and the record of the swap.
  void commit(const Candidate& c, FloorSwapResult& result) {
    result.swaps.push_back({c.rank, c.slot, replaced(c), c.expert});
    const size_t slot = static_cast<size_t>(c.rank) * layout_.slots_per_rank() + c.slot;
    slots_[slot] = c.expert;
    if (!in_group_.empty()) in_group_[slot] = 1;
  }

  // A group (step 5): opened with the slots and holders to go back to, then closed when its last
  // swap lowers the floor, or dropped (its swaps from group_start on, and their slots and
  // holders). While it is open, candidates() leaves out the slots its swaps filled.
  struct Saved {
    std::vector<ExpertId> slots;
    std::vector<std::vector<RankId>> holders;
  };
  Saved open_group() {
    in_group_.assign(slots_.size(), 0);
    return {slots_, holders_};
  }
  void close_group() { in_group_.clear(); }
  void drop_group(Saved saved, size_t group_start, FloorSwapResult& result) {
    result.swaps.resize(group_start);
    slots_ = std::move(saved.slots);
    holders_ = std::move(saved.holders);
    in_group_.clear();
  }

  ExpertLayout layout() {
    return ExpertLayout(layout_.topology(), layout_.num_experts(), layout_.slots_per_rank(),
                        slots_);
  }

 private:
  const ExpertLayout& layout_;
  std::span<const int64_t> counts_;
  std::span<const double> removal_cost_;
  FloorSwapOptions options_;
  int64_t total_ = 0, target_ = 0;
  std::vector<ExpertId> slots_;
  std::vector<std::vector<RankId>> holders_;
  std::vector<Candidate> candidates_;
  std::vector<Exchange> exchanges_;
  std::vector<uint8_t> in_group_;  // [G * S] while a group is open, else empty
};

}  // namespace cobalt::plan::swap_search
