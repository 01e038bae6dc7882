// Internal: Dinic's max-flow on doubles, used to split expert loads over nodes (the transport
// problem behind a node plan's load shares) exactly.
#pragma once

#include <algorithm>
#include <limits>
#include <queue>
#include <vector>

namespace cobalt::plan {

class MaxFlow {
 public:
  explicit MaxFlow(int num_vertices) : head_(num_vertices, -1) {}

  // Adds edge from -> to with capacity cap; returns the edge index (its flow is flow(index)).
  int add_edge(int from, int to, double cap) {
    const int idx = static_cast<int>(to_.size());
    to_.push_back(to), cap_.push_back(cap), next_.push_back(head_[from]), head_[from] = idx;
    to_.push_back(from), cap_.push_back(0.0), next_.push_back(head_[to]), head_[to] = idx + 1;
    original_.push_back(cap), original_.push_back(0.0);
    return idx;
  }
  double flow(int edge_idx) const { return std::max(0.0, original_[edge_idx] - cap_[edge_idx]); }
  // Sets edge edge_idx (an index add_edge returned) to capacity `cap` carrying `flow` (0 <= flow
  // <= cap). The caller keeps flow conservation; a later run() augments from this state (a warm
  // start: it returns only the flow it adds).
  void set_edge(int edge_idx, double cap, double flow) {
    original_[edge_idx] = cap;
    cap_[edge_idx] = cap - flow;
    cap_[edge_idx ^ 1] = flow;
  }

  // Calls f(edge_idx) for every edge leaving v, the residual (reverse) edges of edges into v
  // included: those have odd indices, and edge_idx ^ 1 is the edge into v.
  template <class F>
  void for_each_edge(int v, F&& f) const {
    for (int idx = head_[v]; idx >= 0; idx = next_[idx]) f(idx);
  }
  int head(int edge_idx) const { return to_[edge_idx]; }  // the vertex the edge points to

  // After run(): whether v is reachable from the source in the residual graph, i.e. on the source
  // side of a minimum cut (the last search of run() is the one that failed to reach the sink).
  bool on_source_side(int v) const { return level_[v] >= 0; }

  double run(int source, int sink, double zero) {
    zero_ = zero;
    double total = 0;
    const int num_vertices = static_cast<int>(head_.size());
    level_.assign(num_vertices, -1);
    iter_.assign(num_vertices, -1);
    while (bfs(source, sink)) {
      iter_ = head_;
      for (;;) {
        const double pushed = dfs(source, sink, std::numeric_limits<double>::infinity());
        if (pushed <= zero_) break;
        total += pushed;
      }
    }
    return total;
  }

 private:
  bool bfs(int source, int sink) {
    std::fill(level_.begin(), level_.end(), -1);
    queue_.assign(1, source);  // the buffer is kept across searches
    level_[source] = 0;
    for (size_t q = 0; q < queue_.size(); ++q) {
      const int v = queue_[q];
      for (int idx = head_[v]; idx >= 0; idx = next_[idx]) {
        if (cap_[idx] > zero_ && level_[to_[idx]] < 0) {
          level_[to_[idx]] = level_[v] + 1;
          queue_.push_back(to_[idx]);
        }
      }
    }
    return level_[sink] >= 0;
  }
  double dfs(int v, int sink, double limit) {
    if (v == sink) return limit;
    for (int& idx = iter_[v]; idx >= 0; idx = next_[idx]) {
      const int w = to_[idx];
      if (cap_[idx] > zero_ && level_[w] == level_[v] + 1) {
        const double pushed = dfs(w, sink, std::min(limit, cap_[idx]));
        if (pushed > zero_) {
          cap_[idx] -= pushed;
          cap_[idx ^ 1] += pushed;
          return pushed;
        }
      }
    }
    return 0.0;
  }

  std::vector<int> head_, to_, next_, level_, iter_, queue_;
  std::vector<double> cap_, original_;
  double zero_ = 0;
};

}  // namespace cobalt::plan
