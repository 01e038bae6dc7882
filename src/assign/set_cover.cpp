#include "set_cover.hpp"

#include <algorithm>
#include <bit>

namespace cobalt::assign::detail {
namespace {

constexpr int kMaxCombinationSets = 12;  // above: the DP

uint64_t nodes_of(const SetList& list, const int* pick, int count) {
  uint64_t nodes = 0;
  for (int i = 0; i < count; ++i) nodes |= uint64_t{1} << list.node[pick[i]];
  return nodes;
}

// Exact DP over the subsets of `full` (many sets).
uint64_t cover_by_dp(const SetList& list, uint32_t full, SetCoverScratch& scratch) {
  const size_t num_states = size_t{1} << std::popcount(full);  // full == num_states - 1
  auto& best = scratch.best;
  auto& choice = scratch.choice;
  best.assign(num_states, 0xff);
  choice.assign(num_states, 0);
  best[0] = 0;
  for (size_t s = 1; s < num_states; ++s) {
    for (int i = 0; i < list.size; ++i) {
      if ((list.sets[i] & s) == 0) continue;
      const size_t rest = s & ~static_cast<size_t>(list.sets[i]);
      if (best[rest] + 1 < best[s]) {
        best[s] = static_cast<uint8_t>(best[rest] + 1);
        choice[s] = static_cast<uint64_t>(i);
      }
    }
  }
  uint64_t nodes = 0;
  for (size_t s = num_states - 1; s != 0;) {
    const int i = static_cast<int>(choice[s]);
    nodes |= uint64_t{1} << list.node[i];
    s &= ~static_cast<size_t>(list.sets[i]);
  }
  return nodes;
}

// Depth-first search for the first combination of `size` sets, in lexicographic order of the
// list, whose union is `full`: picks in increasing order, so the first found is the enumeration's
// first. Pruning never drops a feasible completion: suffix_union[i] (the union of sets i..) and
// suffix_largest[i] (their largest popcount) only shrink as i grows, so once the sets from i on
// cannot complete the cover with the picks left, no later i can either.
bool first_combination(const SetList& list, const uint32_t* suffix_union, const int* suffix_largest,
                       uint32_t full, int size, int depth, int start, uint32_t covered, int* pick) {
  const int picks_left = size - depth;
  const int missing = std::popcount(full & ~covered);
  for (int i = start; i + picks_left <= list.size; ++i) {
    if ((covered | suffix_union[i]) != full || missing > picks_left * suffix_largest[i]) {
      return false;
    }
    pick[depth] = i;
    const uint32_t next = covered | list.sets[i];
    if (picks_left == 1) {
      if (next == full) return true;
      continue;
    }
    if (first_combination(list, suffix_union, suffix_largest, full, size, depth + 1, i + 1, next,
                          pick)) {
      return true;
    }
  }
  return false;
}

}  // namespace

// (Arrays left uninitialised: only [0, size) is ever read; this runs once per token.)
void make_set_list(uint32_t full, const std::array<uint32_t, kMaxNodes>& cover,
                   uint64_t candidate_nodes, SetList& list) {
  auto& sets = list.sets;
  auto& node = list.node;
  int size = 0;
  for (uint64_t m = candidate_nodes; m; m &= m - 1) {
    const int n = std::countr_zero(m);
    const uint32_t c = cover[n] & full;
    if (c == 0) continue;
    bool dominated = false;
    for (int i = 0; i < size && !dominated; ++i) dominated = (c | sets[i]) == sets[i];
    if (dominated) continue;
    int kept = 0;
    for (int i = 0; i < size; ++i) {
      if ((sets[i] | c) != c) {
        sets[kept] = sets[i];
        node[kept++] = node[i];
      }
    }
    size = kept;
    sets[size] = c;
    node[size++] = n;
  }
  list.size = size;
}

uint64_t min_node_cover(uint32_t full, const std::array<uint32_t, kMaxNodes>& cover,
                        uint64_t candidate_nodes, SetCoverScratch& scratch) {
  SetList list;
  make_set_list(full, cover, candidate_nodes, list);
  return min_cover_of_list(list, full, scratch);
}

uint64_t min_cover_of_list(const SetList& list, uint32_t full, SetCoverScratch& scratch) {
  for (int i = 0; i < list.size; ++i) {
    if (list.sets[i] == full) return uint64_t{1} << list.node[i];
  }
  if (list.size == 0) return 0;  // nothing covers `full` (callers never ask: every expert is held)
  if (list.size > kMaxCombinationSets) return cover_by_dp(list, full, scratch);
  std::array<uint32_t, kMaxCombinationSets + 1> suffix_union;
  std::array<int, kMaxCombinationSets + 1> suffix_largest;
  suffix_union[list.size] = 0;
  suffix_largest[list.size] = 0;
  for (int i = list.size - 1; i >= 0; --i) {
    suffix_union[i] = suffix_union[i + 1] | list.sets[i];
    suffix_largest[i] = std::max(suffix_largest[i + 1], std::popcount(list.sets[i]));
  }
  std::array<int, kMaxCombinationSets> pick;
  // No cover has fewer sets than the missing elements over the largest set.
  const int largest = suffix_largest[0];
  const int elements = std::popcount(full);
  for (int size = std::max(2, (elements + largest - 1) / largest); size <= list.size; ++size) {
    if (first_combination(list, suffix_union.data(), suffix_largest.data(), full, size, 0, 0, 0,
                          pick.data())) {
      return nodes_of(list, pick.data(), size);
    }
  }
  return 0;  // unreachable: all the sets together cover `full`
}

uint64_t min_node_cover_reference(uint32_t full, const std::array<uint32_t, kMaxNodes>& cover,
                                  uint64_t candidate_nodes, SetCoverScratch& scratch) {
  SetList list;
  make_set_list(full, cover, candidate_nodes, list);
  for (int i = 0; i < list.size; ++i) {
    if (list.sets[i] == full) return uint64_t{1} << list.node[i];
  }
  if (list.size > kMaxCombinationSets) return cover_by_dp(list, full, scratch);
  // Iterative deepening over every combination in lexicographic order.
  std::array<int, kMaxNodes> pick{};
  for (int size = 2; size <= list.size; ++size) {
    for (int i = 0; i < size; ++i) pick[i] = i;
    for (;;) {
      uint32_t covered = 0;
      for (int i = 0; i < size; ++i) covered |= list.sets[pick[i]];
      if (covered == full) return nodes_of(list, pick.data(), size);
      int pos = size - 1;
      while (pos >= 0 && pick[pos] == list.size - size + pos) --pos;
      if (pos < 0) break;
      ++pick[pos];
      for (int i = pos + 1; i < size; ++i) pick[i] = pick[i - 1] + 1;
    }
  }
  return 0;
}

}  // namespace cobalt::assign::detail
