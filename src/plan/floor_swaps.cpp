#include "cobalt/plan/floor_swaps.hpp"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "lazy_order.hpp"
#include "rank_bound_flow.hpp"
#include "swap_search.hpp"

namespace cobalt::plan {

using namespace swap_search;

namespace {

// The lowest bound every task fits under, from a network that fits at its bound: warm-started
// probes of a binary search down to `lower` (a valid lower bound). Leaves `feasible` at the
// result.
int64_t lowest_bound(detail::RankBoundNetwork& feasible, int64_t lower) {
  int64_t upper = feasible.bound();
  if (lower >= upper) return upper;
  const auto fits_at = [&](int64_t bound) {
    detail::RankBoundNetwork probe = feasible;
    probe.set_bound(bound);
    if (!probe.fits()) return false;
    feasible = std::move(probe);
    return true;
  };
  // The lower bound is often the answer: one probe then settles it.
  if (fits_at(lower)) return lower;
  ++lower;
  while (lower < upper) {
    const int64_t mid = lower + (upper - lower) / 2;
    if (fits_at(mid)) {
      upper = mid;
    } else {
      lower = mid + 1;
    }
  }
  return upper;
}

}  // namespace

void apply_swap(const ReplicaSwap& swap, int slots_per_rank, std::span<ExpertId> slots) {
  slots[static_cast<size_t>(swap.rank) * slots_per_rank + swap.slot] = swap.added;
  if (swap.is_exchange()) {
    slots[static_cast<size_t>(swap.exchange_rank) * slots_per_rank + swap.exchange_slot] =
        swap.removed;
  }
}

FloorSwapResult swap_toward_floor(const ExpertLayout& layout,
                                  std::span<const int64_t> expert_counts,
                                  std::span<const double> removal_cost,
                                  const FloorSwapOptions& options) {
  SwapSearch search(layout, expert_counts, removal_cost, options);
  FloorSwapResult result{layout, {}, 0, 0};
  if (search.total() == 0) return result;
  const int num_ranks = search.num_ranks();
  // A feasible start: every expert's tasks split evenly over its holders.
  std::vector<int64_t> even_split(num_ranks, 0);
  for (ExpertId e = 0; e < static_cast<ExpertId>(expert_counts.size()); ++e) {
    const auto& ranks = search.holders()[e];
    const auto n = static_cast<int64_t>(ranks.size());
    for (int64_t i = 0; i < n; ++i) {
      even_split[ranks[i]] += expert_counts[e] / n + (i < expert_counts[e] % n);
    }
  }
  detail::RankBoundNetwork feasible(expert_counts, num_ranks, search.holders(),
                                    *std::max_element(even_split.begin(), even_split.end()));
  COBALT_CHECK_INTERNAL(feasible.fits(), "floor swaps: the even split does not fit");
  int64_t floor = lowest_bound(feasible, search.lower_bound());
  result.floor_before = floor;
  const auto swaps_left = [&] { return options.max_swaps - static_cast<int>(result.swaps.size()); };
  while (swaps_left() > 0 && floor > search.target()) {
    detail::RankBoundNetwork below = feasible;
    // The round's trial changes are made on this network, assigned from the one they change (its
    // buffers are reused: most trials allocate nothing).
    detail::RankBoundNetwork trial = below;
    below.set_bound(floor - 1);
    COBALT_CHECK_INTERNAL(!below.fits(), "floor swaps: the floor {} is not the lowest bound",
                          floor);
    const detail::TightSet tight = below.tight_set();
    COBALT_CHECK_INTERNAL(search.shortfall(tight, floor) == below.total() - below.routed(),
                          "floor swaps: the tight set's shortfall {} differs from the flow's {}",
                          search.shortfall(tight, floor), below.total() - below.routed());
    bool applied = false;
    // Step 3's shortfalls at floor - 1 by candidate, which a group's first swap reuses.
    std::vector<std::pair<uint64_t, int64_t>> measured;
    // Steps 3-4 check their first kChecksBeforeBounds changes as they are, the rest only where
    // may_close while the bounds pay. Either way the same change is applied: may_close is false
    // only where the check fails. (Step 5 reuses the bounds on the same network.)
    std::optional<Headroom> headroom;
    int num_failed = 0;
    const auto ruled_out = [&](const auto& change, int64_t missing) {
      if (num_failed < kChecksBeforeBounds || !headroom->worth_consulting()) return false;
      if (search.may_close(change, tight, missing, floor, *headroom)) return false;
      headroom->note_ruled_out();
      return true;
    };
    // One more holder adds at most floor - 1 of capacity to any cut: a larger shortfall needs
    // more than one swap, so none of steps 3-4's candidates can pass.
    if (below.total() - below.routed() <= floor - 1) {
      headroom.emplace(below);
      const int64_t missing = below.total() - below.routed();
      for (const Candidate& c : search.candidates(tight, floor)) {
        if (ruled_out(c, missing)) continue;
        trial = below;
        trial.add_holder(c.expert, c.rank);
        if (search.replaced(c) != kEmptySlot) trial.remove_holder(search.replaced(c), c.rank);
        if (!trial.fits()) {
          measured.emplace_back(search.key_of(c), trial.total() - trial.routed());
          ++num_failed;
          continue;
        }
        search.try_on(c);
        search.commit(c, result);
        std::swap(feasible, trial);
        floor = lowest_bound(feasible, search.lower_bound());
        result.swaps.back().floor_after = floor;
        applied = true;
        break;
      }
    }
    if (!applied && headroom) {
      const int64_t missing = below.total() - below.routed();
      for (const Exchange& x : search.exchanges(tight, floor)) {
        if (ruled_out(x, missing)) continue;
        trial = below;
        trial.add_holder(x.e, x.r);
        trial.remove_holder(x.f, x.r);
        trial.add_holder(x.f, x.a);
        trial.remove_holder(x.e, x.a);
        if (!trial.fits()) {
          ++num_failed;
          continue;
        }
        search.try_on(x);
        search.commit(x, result);
        std::swap(feasible, trial);
        floor = lowest_bound(feasible, search.lower_bound());
        result.swaps.back().floor_after = floor;
        applied = true;
        break;
      }
    }
    if (!applied && std::min(options.max_group_swaps, swaps_left()) >= 2) {
      // Step 5: `below` and `at_floor` follow the group's swaps (at floor - 1 and at floor).
      auto saved = search.open_group();
      const size_t group_start = result.swaps.size();
      detail::RankBoundNetwork at_floor = feasible;
      const int group_size = std::min(options.max_group_swaps, swaps_left());
      std::sort(measured.begin(), measured.end());
      // Each swap lowers the shortfall at floor - 1 by at most floor - 1 (one more holder's
      // capacity; see step 3), so `reachable(k)`: k more swaps can still close a shortfall.
      const auto reachable = [&](int64_t left, int num_swaps) {
        return !exceeds_product(left, floor - 1, num_swaps);
      };
      for (int depth = 0; depth < group_size && !applied; ++depth) {
        const int64_t missing = below.total() - below.routed();
        // A group that cannot close the shortfall fails whatever its swaps (the reference tries
        // them anyway: the same result, later).
        if (!reachable(missing, group_size - depth)) break;
        const detail::TightSet group_tight = below.tight_set();
        // A candidate lowers the shortfall by at most its Headroom bound (step 3's, on the same
        // network, for the first swap): one that cannot lower it, or not far enough for the rest
        // of the group, is not measured (it would be dropped below).
        if (depth > 0 || !headroom) headroom.emplace(below);
        const auto& candidates = search.candidates(group_tight, floor, false);
        // The swap taken is the first, in order of (shortfall left, index), that leaves less
        // than `missing`, little enough for the rest of the group, and keeps every task under
        // the floor (not checked where it closes the shortfall). The reference measures every
        // candidate (up to the first that closes it) and sorts; here detail::LazyOrder measures
        // them in order of their lower bound missing - min(supply, room), which is exact for
        // most candidates, and only while one could still come before the best measured.
        const auto lowers_enough = [&](int64_t most) {
          return most > 0 && reachable(missing - most, group_size - depth - 1);
        };
        std::vector<std::pair<int64_t, size_t>> by_bound;  // (lower bound, index)
        for (size_t i = 0; i < candidates.size(); ++i) {
          const int64_t most =
              std::min(headroom->expert(candidates[i].expert), headroom->rank(candidates[i].rank));
          if (lowers_enough(most)) by_bound.emplace_back(std::max<int64_t>(0, missing - most), i);
        }
        // A candidate's shortfall left, if it qualifies: below `missing`, and little enough for
        // the rest of the group to close (the last swap: all of it).
        const auto shortfall_left = [&](size_t i) -> std::optional<int64_t> {
          const Candidate& c = candidates[i];
          // The first swap's shortfall as step 3 measured it, on the same layout, if it did.
          const auto known = depth > 0 ? measured.end()
                                       : std::lower_bound(measured.begin(), measured.end(),
                                                          std::pair{search.key_of(c), int64_t{-1}});
          int64_t left = 0;
          if (known != measured.end() && known->first == search.key_of(c)) {
            left = known->second;
          } else {
            trial = below;
            trial.add_holder(c.expert, c.rank);
            if (search.replaced(c) != kEmptySlot) trial.remove_holder(search.replaced(c), c.rank);
            trial.fits();
            left = trial.total() - trial.routed();
          }
          if (left >= missing || !reachable(left, group_size - depth - 1)) return std::nullopt;
          return left;
        };
        detail::LazyOrder in_order(std::move(by_bound), shortfall_left);
        bool chosen = false;
        while (const auto best = in_order.next()) {
          const auto [left, i] = *best;
          const Candidate c = candidates[i];
          const ExpertId removed = search.replaced(c);
          const auto change = [&](detail::RankBoundNetwork& network) {
            network.add_holder(c.expert, c.rank);
            if (removed != kEmptySlot) network.remove_holder(removed, c.rank);
          };
          if (left > 0) {
            // Every task must still fit under the floor (checked only for the one taken).
            trial = at_floor;
            change(trial);
            if (!trial.fits()) continue;
            std::swap(at_floor, trial);
          }
          change(below);
          below.fits();
          search.try_on(c);
          search.commit(c, result);
          result.swaps.back().floor_after = floor;
          if (left == 0) {
            feasible = below;
            floor = lowest_bound(feasible, search.lower_bound());
            result.swaps.back().floor_after = floor;
            applied = true;
          }
          chosen = true;
          break;
        }
        if (!chosen) break;
      }
      if (applied) {
        search.close_group();
      } else {
        search.drop_group(std::move(saved), group_start, result);
      }
    }
    if (!applied) break;
  }
  result.floor_after = floor;
  if (!result.swaps.empty()) result.layout = search.layout();
  return result;
}

FloorSwapResult swap_toward_floor_reference(const ExpertLayout& layout,
                                            std::span<const int64_t> expert_counts,
                                            std::span<const double> removal_cost,
                                            const FloorSwapOptions& options) {
  SwapSearch search(layout, expert_counts, removal_cost, options);
  FloorSwapResult result{layout, {}, 0, 0};
  const int num_ranks = search.num_ranks();
  const auto holders_of = [&](ExpertId e) -> const std::vector<RankId>& {
    return search.holders()[e];
  };
  int64_t floor = detail::min_max_load(expert_counts, num_ranks, holders_of);
  result.floor_before = floor;
  detail::TightSet tight;
  const auto swaps_left = [&] { return options.max_swaps - static_cast<int>(result.swaps.size()); };
  const auto shortfall_under = [&](int64_t bound, detail::TightSet* tight_out = nullptr) {
    return search.total() - detail::routed_under(expert_counts, num_ranks, holders_of, bound,
                                                 search.total(), tight_out);
  };
  while (swaps_left() > 0 && floor > search.target()) {
    const bool fits =
        detail::fits_under(expert_counts, num_ranks, holders_of, floor - 1, search.total(), &tight);
    COBALT_CHECK_INTERNAL(!fits, "floor swaps: the floor {} is not the lowest bound", floor);
    bool applied = false;
    // may_close (which the fast version uses to skip flow checks) may rule out only changes
    // that leave a task above floor - 1: checked for every candidate and exchange of the round.
    detail::RankBoundNetwork below(expert_counts, num_ranks, search.holders(), floor - 1);
    below.fits();
    Headroom headroom(below);
    const int64_t missing = below.total() - below.routed();
    const auto check_ruled_out = [&](const auto& changes, const char* what) {
      for (const auto& change : changes) {
        if (search.may_close(change, tight, missing, floor, headroom)) continue;
        search.try_on(change);
        const bool fits_now =
            detail::fits_under(expert_counts, num_ranks, holders_of, floor - 1, search.total());
        search.undo(change);
        COBALT_CHECK_INTERNAL(!fits_now, "floor swaps: a ruled-out {} lowers the floor {}", what,
                              floor);
      }
    };
    check_ruled_out(search.exchanges(tight, floor), "exchange");
    const auto& candidates = search.candidates(tight, floor);
    check_ruled_out(candidates, "swap");
    for (const Candidate& c : candidates) {
      search.try_on(c);
      if (detail::fits_under(expert_counts, num_ranks, holders_of, floor - 1, search.total())) {
        search.commit(c, result);
        floor = detail::min_max_load(expert_counts, num_ranks, holders_of);
        result.swaps.back().floor_after = floor;
        applied = true;
        break;
      }
      search.undo(c);
    }
    if (!applied) {
      for (const Exchange& x : search.exchanges(tight, floor)) {
        search.try_on(x);
        if (detail::fits_under(expert_counts, num_ranks, holders_of, floor - 1, search.total())) {
          search.commit(x, result);
          floor = detail::min_max_load(expert_counts, num_ranks, holders_of);
          result.swaps.back().floor_after = floor;
          applied = true;
          break;
        }
        search.undo(x);
      }
    }
    if (!applied && std::min(options.max_group_swaps, swaps_left()) >= 2) {
      // Step 5, each shortfall from a fresh flow.
      auto saved = search.open_group();
      const size_t group_start = result.swaps.size();
      const int group_size = std::min(options.max_group_swaps, swaps_left());
      for (int depth = 0; depth < group_size && !applied; ++depth) {
        const int64_t missing = shortfall_under(floor - 1, &tight);
        const auto& candidates = search.candidates(tight, floor, false);
        std::vector<std::pair<int64_t, size_t>> improving;  // (shortfall after, index)
        for (size_t i = 0; i < candidates.size(); ++i) {
          search.try_on(candidates[i]);
          const int64_t left = shortfall_under(floor - 1);
          search.undo(candidates[i]);
          if (left < missing && (left == 0 || depth + 1 < group_size)) {
            improving.emplace_back(left, i);
            if (left == 0) break;  // the first to close it is taken
          }
        }
        std::sort(improving.begin(), improving.end());
        bool chosen = false;
        for (const auto& [left, i] : improving) {
          const Candidate c = candidates[i];
          search.try_on(c);
          if (left > 0 && shortfall_under(floor) > 0) {
            search.undo(c);
            continue;
          }
          search.commit(c, result);
          result.swaps.back().floor_after = floor;
          if (left == 0) {
            floor = detail::min_max_load(expert_counts, num_ranks, holders_of);
            result.swaps.back().floor_after = floor;
            applied = true;
          }
          chosen = true;
          break;
        }
        if (!chosen) break;
      }
      if (applied) {
        search.close_group();
      } else {
        search.drop_group(std::move(saved), group_start, result);
      }
    }
    if (!applied) break;
  }
  result.floor_after = floor;
  if (!result.swaps.empty()) result.layout = search.layout();
  return result;
}

}  // namespace cobalt::plan
