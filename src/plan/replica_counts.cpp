#include "cobalt/plan/replica_counts.hpp"

#include <queue>

#include "cobalt/core/error.hpp"

namespace cobalt::plan {
namespace {

struct Entry {
  double load;
  int replicas;
  int expert;
};

// Max-heap order on load per replica; ties pop the lower expert id first. Compared by
// cross-multiplication so equal ratios compare equal exactly.
struct LowerPriority {
  bool operator()(const Entry& a, const Entry& b) const {
    const double lhs = a.load * b.replicas, rhs = b.load * a.replicas;
    if (lhs != rhs) return lhs < rhs;
    return a.expert > b.expert;
  }
};

}  // namespace

std::vector<int> proportional_replica_counts(std::span<const double> expert_load,
                                             int total_replicas, int node_step,
                                             int max_per_expert) {
  const int num_experts = static_cast<int>(expert_load.size());
  COBALT_CHECK_ARG(num_experts >= 1, "replica counts: no experts");
  COBALT_CHECK_ARG(total_replicas >= num_experts, "replica counts: budget {} replicas < {} experts",
                   total_replicas, num_experts);
  COBALT_CHECK_ARG(node_step >= 1, "replica counts: node step {} must be >= 1", node_step);
  COBALT_CHECK_ARG(max_per_expert >= 1, "replica counts: max per expert {} must be >= 1",
                   max_per_expert);
  for (int e = 0; e < num_experts; ++e) {
    COBALT_CHECK_ARG(expert_load[e] >= 0, "replica counts: load of expert {} is {} (< 0)", e,
                     expert_load[e]);
  }
  const int start =
      static_cast<int64_t>(node_step) * num_experts <= total_replicas && node_step <= max_per_expert
          ? node_step
          : 1;
  std::priority_queue<Entry, std::vector<Entry>, LowerPriority> heap;
  for (int e = 0; e < num_experts; ++e) heap.push({expert_load[e], start, e});
  int64_t used = static_cast<int64_t>(start) * num_experts;
  std::vector<int> counts(num_experts, start);
  while (used < total_replicas && !heap.empty()) {
    Entry top = heap.top();
    heap.pop();
    const int step = top.replicas >= node_step ? node_step : 1;
    if (used + step > total_replicas || top.replicas + step > max_per_expert) {
      counts[top.expert] = top.replicas;  // frozen
      continue;
    }
    top.replicas += step;
    used += step;
    counts[top.expert] = top.replicas;
    heap.push(top);
  }
  return counts;
}

}  // namespace cobalt::plan
