#include "cobalt/plan/rank_matching.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

#include "cobalt/core/error.hpp"

namespace cobalt::plan {
namespace {

constexpr int64_t kMaxAbsWeight = int64_t{1} << 40;

void check_weights(std::span<const int64_t> weight, int n) {
  COBALT_CHECK_ARG(n >= 0, "matching: size {} must be >= 0", n);
  COBALT_CHECK_ARG(weight.size() == static_cast<size_t>(n) * n,
                   "matching: {} weights for a {}x{} matrix", weight.size(), n, n);
  for (size_t i = 0; i < weight.size(); ++i) {
    COBALT_CHECK_ARG(weight[i] >= -kMaxAbsWeight && weight[i] <= kMaxAbsWeight,
                     "matching: weight {} at ({}, {}) outside [-2^40, 2^40]", weight[i],
                     i / std::max(n, 1), i % std::max(n, 1));
  }
}

}  // namespace

std::vector<int> max_weight_perfect_matching(std::span<const int64_t> weight, int n) {
  check_weights(weight, n);
  // Minimum-cost assignment on cost = -weight with row potentials u and column potentials v (both
  // 1-based; column 0 is a virtual column holding the row being inserted). Rows are added one at a
  // time; each addition grows a shortest augmenting path in reduced costs (Dijkstra on the dense
  // bipartite graph), then flips the path. Reduced costs stay >= 0, so the final matching is
  // optimal.
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max() / 4;
  const auto cost = [&](int row, int col) { return -weight[static_cast<size_t>(row) * n + col]; };
  std::vector<int64_t> u(n + 1, 0), v(n + 1, 0), min_reduced(n + 1);
  std::vector<int> col_owner(n + 1, 0);  // col_owner[col] = 1-based row matched to col, 0 = free
  std::vector<int> prev_col(n + 1, 0);
  std::vector<char> visited(n + 1);
  for (int row = 1; row <= n; ++row) {
    col_owner[0] = row;
    int col = 0;
    std::fill(min_reduced.begin(), min_reduced.end(), kInf);
    std::fill(visited.begin(), visited.end(), 0);
    do {
      visited[col] = 1;
      const int owner = col_owner[col];
      int64_t delta = kInf;
      int next_col = -1;
      for (int c = 1; c <= n; ++c) {
        if (visited[c]) continue;
        const int64_t reduced = cost(owner - 1, c - 1) - u[owner] - v[c];
        if (reduced < min_reduced[c]) {
          min_reduced[c] = reduced;
          prev_col[c] = col;
        }
        if (min_reduced[c] < delta) {
          delta = min_reduced[c];
          next_col = c;
        }
      }
      COBALT_CHECK_INTERNAL(next_col > 0, "matching: no augmenting column for row {}", row);
      for (int c = 0; c <= n; ++c) {
        if (visited[c]) {
          u[col_owner[c]] += delta;
          v[c] -= delta;
        } else {
          min_reduced[c] -= delta;
        }
      }
      col = next_col;
    } while (col_owner[col] != 0);
    do {  // flip the augmenting path back to the virtual column
      const int back = prev_col[col];
      col_owner[col] = col_owner[back];
      col = back;
    } while (col != 0);
  }
  std::vector<int> row2col(n, -1);
  for (int c = 1; c <= n; ++c) row2col[col_owner[c] - 1] = c - 1;
  return row2col;
}

int64_t max_weight_perfect_matching_brute_force(std::span<const int64_t> weight, int n) {
  check_weights(weight, n);
  COBALT_CHECK_ARG(n <= 9, "matching brute force: size {} must be <= 9", n);
  std::vector<int> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  int64_t best = std::numeric_limits<int64_t>::min();
  do {
    int64_t total = 0;
    for (int row = 0; row < n; ++row) total += weight[static_cast<size_t>(row) * n + perm[row]];
    best = std::max(best, total);
  } while (std::next_permutation(perm.begin(), perm.end()));
  return best;
}

std::vector<int> keep_replicas_in_place(const ExpertLayout& current, NodeId node,
                                        std::span<const std::vector<ExpertId>> groups) {
  const Topology& topo = current.topology();
  const int per_node = topo.ranks_per_node();
  COBALT_CHECK_ARG(node >= 0 && node < topo.num_nodes(), "matching: node {} outside [0, {})", node,
                   topo.num_nodes());
  COBALT_CHECK_ARG(static_cast<int>(groups.size()) == per_node,
                   "matching: {} groups for a node of {} ranks", groups.size(), per_node);
  for (const auto& group : groups) {
    for (ExpertId e : group) {
      COBALT_CHECK_ARG(e >= 0 && e < current.num_experts(), "matching: expert {} outside [0, {})",
                       e, current.num_experts());
    }
  }
  const RankId first = topo.first_rank_of(node);
  std::vector<int64_t> kept(static_cast<size_t>(per_node) * per_node, 0);
  for (int g = 0; g < per_node; ++g) {
    for (int i = 0; i < per_node; ++i) {
      for (ExpertId e : groups[g])
        kept[static_cast<size_t>(g) * per_node + i] += current.holds(first + i, e);
    }
  }
  return keep_most_in_place(kept, per_node);
}

std::vector<int> keep_most_in_place(std::span<const int64_t> kept, int n) {
  COBALT_CHECK_ARG(n >= 0 && kept.size() == static_cast<size_t>(n) * n,
                   "matching: {} kept counts for {} groups", kept.size(), n);
  // A kept replica outweighs every identity bonus together (at most n of them).
  std::vector<int64_t> weight(kept.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    COBALT_CHECK_ARG(kept[i] >= 0, "matching: negative kept count {}", kept[i]);
    weight[i] = kept[i] * (n + 1) + (i / n == i % n ? 1 : 0);
  }
  return max_weight_perfect_matching(weight, n);
}

}  // namespace cobalt::plan
