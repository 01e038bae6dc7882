// Internal: the flow behind a layout's balance floor (eval::min_max_rank_load) and the replica
// swaps that lower it (floor_swaps.hpp). Source -> expert e (capacity: its task count) -> every
// rank holding e (uncapped) -> sink (capacity `bound` per rank): every task fits with at most
// `bound` tasks per rank exactly when the maximum flow carries all of them.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <span>
#include <vector>

#include "cobalt/core/ids.hpp"
#include "max_flow.hpp"

namespace cobalt::plan::detail {

// When every task fits under `bound`. `holders_of(e)` gives e's ranks (any range of RankId).
// With `tight` non-null and the answer false, *tight receives the experts [E] and ranks [G] on the
// source side of a minimum cut (1 = on it): a set X of experts whose tasks exceed `bound` times
// the number of ranks holding any of them (those ranks are exactly the ranks marked), so no
// assignment fits until some expert of X gets a holder outside them. Capacities are integers
// below 2^53, so the double-valued flow is exact.
struct TightSet {
  std::vector<uint8_t> experts;  // [E]
  std::vector<uint8_t> ranks;    // [G]
};

// The tasks a maximum flow routes under `bound` (at most the sum of the counts); *tight as in
// fits_under when that is short of `total`.
template <class HoldersOf>
int64_t routed_under(std::span<const int64_t> expert_counts, int num_ranks, HoldersOf&& holders_of,
                     int64_t bound, int64_t total, TightSet* tight = nullptr) {
  const int num_experts = static_cast<int>(expert_counts.size());
  const int source = num_experts + num_ranks, sink = source + 1;
  MaxFlow flow(num_experts + num_ranks + 2);
  for (ExpertId e = 0; e < num_experts; ++e) {
    if (expert_counts[e] == 0) continue;
    const auto count = static_cast<double>(expert_counts[e]);
    flow.add_edge(source, e, count);
    for (RankId r : holders_of(e)) flow.add_edge(e, num_experts + r, count);
  }
  for (RankId r = 0; r < num_ranks; ++r) {
    flow.add_edge(num_experts + r, sink, static_cast<double>(bound));
  }
  const int64_t routed = std::llround(flow.run(source, sink, 0.5));
  if (tight != nullptr && routed < total) {
    tight->experts.assign(num_experts, 0);
    tight->ranks.assign(num_ranks, 0);
    for (ExpertId e = 0; e < num_experts; ++e) tight->experts[e] = flow.on_source_side(e);
    for (RankId r = 0; r < num_ranks; ++r) tight->ranks[r] = flow.on_source_side(num_experts + r);
  }
  return routed;
}

template <class HoldersOf>
bool fits_under(std::span<const int64_t> expert_counts, int num_ranks, HoldersOf&& holders_of,
                int64_t bound, int64_t total, TightSet* tight = nullptr) {
  return routed_under(expert_counts, num_ranks, holders_of, bound, total, tight) == total;
}

// The lowest bound every task fits under, searched in [lower, upper] where upper is known to fit
// and lower is a valid lower bound (a binary search of fits_under checks).
template <class HoldersOf>
int64_t lowest_fitting_bound(std::span<const int64_t> expert_counts, int num_ranks,
                             HoldersOf&& holders_of, int64_t lower, int64_t upper, int64_t total) {
  // The lower bound is often the answer: one flow then settles it.
  if (lower < upper) {
    if (fits_under(expert_counts, num_ranks, holders_of, lower, total)) return lower;
    ++lower;
  }
  while (lower < upper) {
    const int64_t mid = lower + (upper - lower) / 2;
    if (fits_under(expert_counts, num_ranks, holders_of, mid, total)) {
      upper = mid;
    } else {
      lower = mid + 1;
    }
  }
  return upper;
}

// The lowest maximum rank load any assignment reaches (0 without tasks): between the largest of
// the mean and each expert's even split over its holders, and the maximum of that even split
// (an assignment, so it fits). Counts must be >= 0 with every counted expert held somewhere.
template <class HoldersOf>
int64_t min_max_load(std::span<const int64_t> expert_counts, int num_ranks,
                     HoldersOf&& holders_of) {
  int64_t total = 0, lower = 0;
  std::vector<int64_t> even_split(num_ranks, 0);
  for (ExpertId e = 0; e < static_cast<ExpertId>(expert_counts.size()); ++e) {
    const int64_t count = expert_counts[e];
    if (count == 0) continue;
    const auto& ranks = holders_of(e);
    const auto num_holders = static_cast<int64_t>(std::size(ranks));
    total += count;
    lower = std::max(lower, (count + num_holders - 1) / num_holders);
    int64_t i = 0;
    for (RankId r : ranks) even_split[r] += count / num_holders + (i++ < count % num_holders);
  }
  if (total == 0) return 0;
  lower = std::max(lower, (total + num_ranks - 1) / num_ranks);
  const int64_t upper = *std::max_element(even_split.begin(), even_split.end());
  return lowest_fitting_bound(expert_counts, num_ranks, holders_of, lower, upper, total);
}

// The same network kept as a flow that later changes start from (a warm start): holders added
// or removed and the bound lowered or raised cancel only the flow they invalidate, and fits()
// re-augments from there, so a trial change costs a search of the residual graph rather than a
// whole max flow. fits_under (above) is its reference: the tests compare them on random changes.
// Copyable: a trial is a copy changed and discarded. Counts must be integers below 2^52.
class RankBoundNetwork {
 public:
  RankBoundNetwork(std::span<const int64_t> expert_counts, int num_ranks,
                   const std::vector<std::vector<RankId>>& holders, int64_t bound)
      : counts_(expert_counts.begin(), expert_counts.end()),
        num_experts_(static_cast<int>(expert_counts.size())),
        num_ranks_(num_ranks),
        bound_(bound),
        flow_(num_experts_ + num_ranks + 2),
        source_edge_(num_experts_, -1),
        sink_edge_(num_ranks, -1) {
    for (ExpertId e = 0; e < num_experts_; ++e) {
      total_ += expert_counts[e];
      source_edge_[e] = flow_.add_edge(source(), e, static_cast<double>(expert_counts[e]));
      for (RankId r : holders[e]) add_holder(e, r);
    }
    for (RankId r = 0; r < num_ranks; ++r) {
      sink_edge_[r] = flow_.add_edge(num_experts_ + r, sink(), static_cast<double>(bound));
    }
  }

  int num_experts() const { return num_experts_; }
  int num_ranks() const { return num_ranks_; }
  int64_t total() const { return total_; }
  int64_t bound() const { return bound_; }
  int64_t routed() const { return routed_; }  // tasks the flow runs so far

  // Augments to a maximum flow; true when every task is routed under the bound.
  bool fits() {
    routed_ += std::llround(flow_.run(source(), sink(), 0.5));
    return routed_ == total_;
  }

  // After fits() returned false: the source side of a minimum cut (see TightSet).
  TightSet tight_set() const {
    TightSet tight{std::vector<uint8_t>(num_experts_), std::vector<uint8_t>(num_ranks_)};
    for (ExpertId e = 0; e < num_experts_; ++e) tight.experts[e] = flow_.on_source_side(e);
    for (RankId r = 0; r < num_ranks_; ++r) {
      tight.ranks[r] = flow_.on_source_side(num_experts_ + r);
    }
    return tight;
  }

  // Upper bounds on what a change can add to a maximum flow (after fits() returned false), where
  // the change gives a rank r outside the tight ranks a replica of a tight expert e and may also
  // take replicas off ranks or move a replica of an expert off the tight side onto a tight rank.
  // room_through(r): the growth of the maximum flow when an uncapped edge source -> r is added
  // (the tasks the residual graph can carry from r to the sink: r's free bound and the load its
  // experts can shift to other ranks); supply_through(e): the same with an uncapped edge
  // e -> sink (the unrouted tasks of the tight experts the residual graph can bring to e).
  // Why they bound the change: let S be the source side of tight_set() (a minimum cut of this
  // network, value F) and A a minimum cut of the network with the edge source -> r (value
  // F + room_through(r)). Cut capacities are submodular and S is a minimum cut of this network,
  // so A u S is a minimum cut of the network with the extra edge too; it holds r and all of S,
  // so the changed network's new edges (e -> r, and an expert's edge into a rank of S) do not
  // cross it, and removed edges only lower it: a cut of value <= F + room_through(r). Likewise,
  // with A a minimum cut of the network with e -> sink, A n S is one too; it leaves out e and
  // every expert outside S, so the new edges do not leave it: a cut of value <= F +
  // supply_through(e). So the change routes at most min(room_through(r), supply_through(e)) more
  // tasks. Each is one max flow on `scratch`, which becomes a copy of this network (its buffers
  // reused) with one more edge.
  int64_t room_through(RankId r, RankBoundNetwork& scratch) const {
    scratch = *this;
    scratch.flow_.add_edge(source(), num_experts_ + r, kUncapped);
    return std::llround(scratch.flow_.run(source(), sink(), 0.5));
  }
  int64_t supply_through(ExpertId e, RankBoundNetwork& scratch) const {
    scratch = *this;
    scratch.flow_.add_edge(e, sink(), kUncapped);
    return std::llround(scratch.flow_.run(source(), sink(), 0.5));
  }

  // Rank r may now run expert e's tasks (no flow on it until fits()).
  void add_holder(ExpertId e, RankId r) { flow_.add_edge(e, num_experts_ + r, kUncapped); }

  // Rank r no longer holds e: the tasks it ran go back to e's supply.
  void remove_holder(ExpertId e, RankId r) {
    flow_.for_each_edge(e, [&](int edge) {
      // Forward edges have even indices; a removed edge keeps its place with capacity 0.
      if ((edge & 1) != 0 || flow_.head(edge) != num_experts_ + r) return;
      const auto moved = static_cast<int64_t>(flow_.flow(edge));
      flow_.set_edge(edge, 0.0, 0.0);
      cancel(e, r, moved);
    });
  }

  // Every rank's capacity becomes `bound`; flow above it goes back to the experts' supply.
  void set_bound(int64_t bound) {
    bound_ = bound;
    for (RankId r = 0; r < num_ranks_; ++r) {
      auto load = static_cast<int64_t>(flow_.flow(sink_edge_[r]));
      if (load > bound) {
        // Unroute the excess from r's incoming expert edges (the reverse edges at rank r).
        flow_.for_each_edge(num_experts_ + r, [&](int reverse) {
          const int edge = reverse ^ 1;
          if ((reverse & 1) == 0 || load <= bound || flow_.head(reverse) >= num_experts_) return;
          const auto on_edge = static_cast<int64_t>(flow_.flow(edge));
          const int64_t moved = std::min(on_edge, load - bound);
          if (moved == 0) return;
          flow_.set_edge(edge, kUncapped, static_cast<double>(on_edge - moved));
          cancel(flow_.head(reverse), r, moved);
          load -= moved;
        });
      }
      flow_.set_edge(sink_edge_[r], static_cast<double>(bound), static_cast<double>(load));
    }
  }

 private:
  // 2^53, above any count (< 2^52): the expert -> holder edges never limit the flow, and their
  // residuals stay exact integers in double.
  static constexpr double kUncapped = 9007199254740992.0;

  int source() const { return num_experts_ + num_ranks_; }
  int sink() const { return num_experts_ + num_ranks_ + 1; }

  // `moved` tasks of e no longer run on r: less flow on source -> e and r -> sink (the edge
  // e -> r itself is set by the caller).
  void cancel(ExpertId e, RankId r, int64_t moved) {
    if (moved == 0) return;
    const int in = source_edge_[e], out = sink_edge_[r];
    flow_.set_edge(in, static_cast<double>(counts_[e]),
                   flow_.flow(in) - static_cast<double>(moved));
    flow_.set_edge(out, static_cast<double>(bound_), flow_.flow(out) - static_cast<double>(moved));
    routed_ -= moved;
  }

  std::vector<int64_t> counts_;
  int num_experts_, num_ranks_;
  int64_t bound_, total_ = 0, routed_ = 0;
  MaxFlow flow_;
  std::vector<int> source_edge_, sink_edge_;
};

}  // namespace cobalt::plan::detail
