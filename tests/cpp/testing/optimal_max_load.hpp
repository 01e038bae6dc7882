// Brute force for the balanced assignment's tests: the best maximum rank load any assignment on a
// layout can reach.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/routing_batch.hpp"

namespace cobalt::testing {

// The smallest maximum rank load of any assignment on `layout` (tasks of expert e on any holder of
// e), by brute force: for C = 0, 1, ... a max-flow check that every task fits under C per rank.
inline int64_t optimal_max_load(const RoutingBatch& batch, const ExpertLayout& layout) {
  const int num_experts = layout.num_experts(), num_ranks = layout.num_ranks();
  std::vector<int64_t> demand(num_experts, 0);
  for (ExpertId e : batch.topk_ids()) ++demand[e];
  for (int64_t cap = 0;; ++cap) {
    // Residual graph: source -> expert (demand), expert -> holder (inf), rank -> sink (cap).
    const int n = num_experts + num_ranks + 2, s = n - 2, t = n - 1;
    std::vector<std::vector<int64_t>> residual(n, std::vector<int64_t>(n, 0));
    for (ExpertId e = 0; e < num_experts; ++e) {
      residual[s][e] = demand[e];
      for (RankId r : layout.ranks_of(e)) residual[e][num_experts + r] = batch.num_tasks();
    }
    for (RankId r = 0; r < num_ranks; ++r) residual[num_experts + r][t] = cap;
    int64_t flow = 0;
    for (;;) {
      std::vector<int> parent(n, -1);
      parent[s] = s;
      std::vector<int> stack{s};
      while (!stack.empty() && parent[t] < 0) {
        const int u = stack.back();
        stack.pop_back();
        for (int v = 0; v < n; ++v) {
          if (parent[v] < 0 && residual[u][v] > 0) {
            parent[v] = u;
            stack.push_back(v);
          }
        }
      }
      if (parent[t] < 0) break;
      int64_t push = batch.num_tasks();
      for (int v = t; v != s; v = parent[v]) push = std::min(push, residual[parent[v]][v]);
      for (int v = t; v != s; v = parent[v]) {
        residual[parent[v]][v] -= push;
        residual[v][parent[v]] += push;
      }
      flow += push;
    }
    if (flow == batch.num_tasks()) return cap;
  }
}

}  // namespace cobalt::testing
