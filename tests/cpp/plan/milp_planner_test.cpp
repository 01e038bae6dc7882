// Tests of the CBC node-level MILP (solve_global_milp): exactness against brute force on tiny
// instances, plan validity, warm starts, the watchdog, and the load-split helper.
#include "cobalt/plan/milp_planner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <functional>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/plan/node_plan.hpp"
#include "plan/max_flow.hpp"

namespace cobalt::plan {
namespace {

// An instance that owns its arrays (GlobalPlanInput only views them).
struct Instance {
  Topology topology{1, 1};
  int num_experts = 0;
  int slots_per_rank = 0;
  double eps = 0.15;
  std::vector<double> load;
  std::vector<double> coact;
  std::vector<double> source_demand;  // [N, E] or empty
  double source_weight = 0.0;

  GlobalPlanInput input() const {
    return GlobalPlanInput{topology, num_experts, slots_per_rank, eps,
                           load,     coact,       source_demand,  source_weight};
  }
};

// Random loads in [load_lo, load_hi) and symmetric co-activation: each pair is zero with
// probability `sparsity`, else uniform in [0, 1).
Instance random_instance(uint64_t seed, int num_experts, int num_nodes, int per_node, int slots,
                         double load_lo, double load_hi, double sparsity = 0.3) {
  SplitMix64 rng(seed);
  Instance inst;
  inst.topology = Topology(num_nodes, num_nodes * per_node);
  inst.num_experts = num_experts;
  inst.slots_per_rank = slots;
  inst.load.resize(num_experts);
  for (double& w : inst.load) w = load_lo + (load_hi - load_lo) * rng.unit();
  inst.coact.assign(static_cast<size_t>(num_experts) * num_experts, 0.0);
  for (int i = 0; i < num_experts; ++i) {
    for (int j = i + 1; j < num_experts; ++j) {
      const double c = rng.unit() < sparsity ? 0.0 : rng.unit();
      inst.coact[static_cast<size_t>(i) * num_experts + j] = c;
      inst.coact[static_cast<size_t>(j) * num_experts + i] = c;
    }
  }
  return inst;
}

// Co-activation from synthetic routing with planted topics: each token picks a topic, then K
// distinct experts, each from the topic's block with probability `locality`, else uniformly. Loads
// are the per-expert task counts, c_ij the number of tokens choosing both.
Instance topic_instance(uint64_t seed, int num_experts, int num_nodes, int per_node, int slots,
                        int top_k, int num_tokens, int num_topics, double locality) {
  SplitMix64 rng(seed);
  Instance inst;
  inst.topology = Topology(num_nodes, num_nodes * per_node);
  inst.num_experts = num_experts;
  inst.slots_per_rank = slots;
  inst.load.assign(num_experts, 0.0);
  inst.coact.assign(static_cast<size_t>(num_experts) * num_experts, 0.0);
  std::vector<int> perm(num_experts);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = num_experts - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  const int block = std::max(1, num_experts / num_topics);
  std::vector<int> chosen;
  for (int t = 0; t < num_tokens; ++t) {
    const int topic = static_cast<int>(rng.below(num_topics));
    chosen.clear();
    while (static_cast<int>(chosen.size()) < top_k) {
      int e;
      if (rng.unit() < locality) {
        e = perm[(topic * block + static_cast<int>(rng.below(block))) % num_experts];
      } else {
        e = static_cast<int>(rng.below(num_experts));
      }
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    for (int a : chosen) {
      inst.load[a] += 1;
      for (int b : chosen) {
        if (a != b) inst.coact[static_cast<size_t>(a) * num_experts + b] += 1;
      }
    }
  }
  return inst;
}

// Independent load-feasibility check for brute force: Edmonds-Karp on a dense matrix,
// source -> expert (w_e) -> node (x_en cap) -> sink (M cap).
bool load_feasible(const GlobalPlanInput& in, const std::vector<int>& x) {
  const int num_experts = in.num_experts;
  const int num_nodes = in.topology.num_nodes();
  const int num_vertices = num_experts + num_nodes + 2;
  const int source = num_vertices - 2;
  const int sink = num_vertices - 1;
  const double cap = in.rank_load_cap();
  std::vector<double> residual(static_cast<size_t>(num_vertices) * num_vertices, 0.0);
  auto r = [&](int a, int b) -> double& {
    return residual[static_cast<size_t>(a) * num_vertices + b];
  };
  double total = 0;
  for (int e = 0; e < num_experts; ++e) {
    r(source, e) = in.expert_load[e];
    total += in.expert_load[e];
    for (int n = 0; n < num_nodes; ++n) r(e, num_experts + n) = x[e * num_nodes + n] * cap;
  }
  for (int n = 0; n < num_nodes; ++n) r(num_experts + n, sink) = in.topology.ranks_per_node() * cap;
  const double zero = 1e-12 * std::max(1.0, total);
  double routed = 0;
  for (;;) {
    std::vector<int> parent(num_vertices, -1);
    parent[source] = source;
    std::deque<int> queue{source};
    while (!queue.empty() && parent[sink] < 0) {
      const int v = queue.front();
      queue.pop_front();
      for (int w = 0; w < num_vertices; ++w) {
        if (parent[w] < 0 && r(v, w) > zero) parent[w] = v, queue.push_back(w);
      }
    }
    if (parent[sink] < 0) break;
    double push = std::numeric_limits<double>::infinity();
    for (int v = sink; v != source; v = parent[v]) push = std::min(push, r(parent[v], v));
    for (int v = sink; v != source; v = parent[v]) r(parent[v], v) -= push, r(v, parent[v]) += push;
    routed += push;
  }
  return routed >= total - 1e-9 * std::max(1.0, total);
}

// Exhaustive optimum of Eq. (3): every x_e in {0..M}^N \ {0} per expert, slot-feasible, then load
// feasibility by max-flow. Returns -1 when infeasible.
double brute_force_optimum(const GlobalPlanInput& in) {
  const int num_experts = in.num_experts;
  const int num_nodes = in.topology.num_nodes();
  const int per_node = in.topology.ranks_per_node();
  const int node_slots = per_node * in.slots_per_rank;
  std::vector<std::vector<int>> choices;  // all nonzero vectors in {0..M}^N
  std::vector<int> v(num_nodes, 0);
  for (;;) {
    int k = 0;
    while (k < num_nodes && v[k] == per_node) v[k++] = 0;
    if (k == num_nodes) break;
    ++v[k];
    choices.push_back(v);
  }
  std::vector<int> x(static_cast<size_t>(num_experts) * num_nodes, 0);
  std::vector<int> used(num_nodes, 0);
  double best = -1;
  NodePlan plan(num_experts, num_nodes);
  auto recurse = [&](auto&& self, int e) -> void {
    if (e == num_experts) {
      plan.replicas = x;
      const double value = coactivation_objective(in, plan);
      if (value > best && load_feasible(in, x)) best = value;
      return;
    }
    for (const auto& choice : choices) {
      bool fits = true;
      for (int n = 0; n < num_nodes; ++n) fits = fits && used[n] + choice[n] <= node_slots;
      if (!fits) continue;
      for (int n = 0; n < num_nodes; ++n) x[e * num_nodes + n] = choice[n], used[n] += choice[n];
      self(self, e + 1);
      for (int n = 0; n < num_nodes; ++n) used[n] -= choice[n];
    }
    for (int n = 0; n < num_nodes; ++n) x[e * num_nodes + n] = 0;
  };
  recurse(recurse, 0);
  return best;
}

// A simple feasible warm start: one replica per expert, heaviest first onto the least-loaded node
// with a free slot (LPT); load shares by max-flow. Requires every w_e <= cap.
NodePlan greedy_plan(const GlobalPlanInput& in) {
  const int num_nodes = in.topology.num_nodes();
  const int node_slots = in.topology.ranks_per_node() * in.slots_per_rank;
  std::vector<int> order(in.num_experts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return in.expert_load[a] > in.expert_load[b]; });
  NodePlan plan(in.num_experts, num_nodes);
  std::vector<double> node_load(num_nodes, 0.0);
  std::vector<int> used(num_nodes, 0);
  for (int e : order) {
    int best = -1;
    for (int n = 0; n < num_nodes; ++n) {
      if (used[n] < node_slots && (best < 0 || node_load[n] < node_load[best])) best = n;
    }
    plan.x(e, best) = 1;
    ++used[best];
    node_load[best] += in.expert_load[e];
  }
  EXPECT_TRUE(assign_load_shares(in, plan));
  EXPECT_EQ(check_node_plan(in, plan), "");
  return plan;
}

struct TinyCase {
  uint64_t seed;
  int num_experts, num_nodes, per_node, slots;
  bool degree_cuts;
};

TEST(MilpPlanner, MatchesBruteForceOnTinyInstances) {
  // Loads up to 3x the mean so some experts exceed a rank's cap and must be replicated.
  const std::vector<TinyCase> cases = {
      {11, 4, 2, 1, 2, true}, {12, 4, 2, 2, 2, false}, {13, 5, 2, 1, 3, true},
      {14, 5, 2, 2, 2, true}, {15, 6, 2, 1, 3, false}, {16, 6, 2, 2, 2, true},
      {17, 6, 2, 2, 3, true}, {18, 5, 2, 2, 3, false},
  };
  for (const TinyCase& tc : cases) {
    SCOPED_TRACE(::testing::Message() << "seed " << tc.seed << " E=" << tc.num_experts << " "
                                      << tc.num_nodes << "x" << tc.per_node << " S=" << tc.slots);
    const Instance inst =
        random_instance(tc.seed, tc.num_experts, tc.num_nodes, tc.per_node, tc.slots, 0.2, 3.0);
    const GlobalPlanInput in = inst.input();
    const double expected = brute_force_optimum(in);
    ASSERT_GE(expected, 0) << "instance should be feasible";
    MilpOptions options;
    options.time_limit_s = 20;
    options.degree_cuts = tc.degree_cuts;
    const MilpResult result = solve_global_milp(in, options);
    ASSERT_EQ(result.status, "optimal");
    EXPECT_TRUE(result.optimal);
    ASSERT_TRUE(result.has_solution);
    EXPECT_EQ(check_node_plan(in, result.plan), "");
    EXPECT_NEAR(result.objective, expected, 1e-9 * std::max(1.0, expected));
    EXPECT_DOUBLE_EQ(result.objective, coactivation_objective(in, result.plan));
    EXPECT_GE(result.bound, result.objective);
    EXPECT_LE(result.gap, 1e-6);
  }
}

// The paper's rank-level optimum by brute force: every rank holds a set of at most S distinct
// experts, every expert is held, the objective counts a pair once per node holding both, and the
// loads must split under the per-rank cap (a max flow: expert -> ranks holding it -> sink with
// capacity (1 + eps) W / G). -1 when no layout fits. Tiny shapes only (G subsets per layout).
double rank_level_optimum(const GlobalPlanInput& in) {
  const int E = in.num_experts, G = in.topology.num_ranks(), M = in.topology.ranks_per_node();
  std::vector<uint32_t> subsets;  // the sets a rank can hold
  for (uint32_t m = 0; m < (1u << E); ++m) {
    if (std::popcount(m) <= in.slots_per_rank) subsets.push_back(m);
  }
  std::vector<double> pairs(size_t{1} << E, 0.0);  // co-activation inside each expert set
  for (uint32_t m = 0; m < pairs.size(); ++m) {
    for (int i = 0; i < E; ++i) {
      for (int j = i + 1; j < E; ++j) {
        if ((m >> i & 1) && (m >> j & 1)) pairs[m] += in.coactivation[i * E + j];
      }
    }
  }
  const double cap = in.rank_load_cap(), total = in.total_load();
  double best = -1;
  std::vector<uint32_t> held(G);
  auto fits = [&] {
    MaxFlow flow(E + G + 2);
    const int source = E + G, sink = source + 1;
    for (int e = 0; e < E; ++e) {
      flow.add_edge(source, e, in.expert_load[e]);
      for (int r = 0; r < G; ++r) {
        if (held[r] >> e & 1) flow.add_edge(e, E + r, total);
      }
    }
    for (int r = 0; r < G; ++r) flow.add_edge(E + r, sink, cap);
    return flow.run(source, sink, 1e-12) >= total - 1e-9 * std::max(1.0, total);
  };
  std::function<void(int)> place = [&](int r) {
    if (r == G) {
      uint32_t all = 0;
      double objective = 0;
      for (int n = 0; n < G / M; ++n) {
        uint32_t node = 0;
        for (int q = 0; q < M; ++q) node |= held[n * M + q];
        all |= node;
        objective += pairs[node];
      }
      if (all == (1u << E) - 1 && objective > best + 1e-12 && fits()) best = objective;
      return;
    }
    for (uint32_t m : subsets) {
      held[r] = m;
      place(r + 1);
    }
  };
  place(0);
  return best;
}

// The node-level model (DESIGN.md §4) relaxes the paper's per-rank load cap to a node cap and a
// per-replica cap (docs/planner.md): its optimum is never below the rank-level one (a rank
// layout's loads summed per node meet every node-level constraint), and it can lie above every
// rank-feasible layout. On 2 x 2 ranks with S = 2 (8 slots): E = 6 leaves two slots spare, and
// the optima agree on these instances (found, not a theorem); E = 7 leaves one, and some differ.
TEST(MilpPlanner, NodeLevelOptimumBoundsTheRankLevelOne) {
  int above = 0;
  for (const auto& [num_experts, seeds] : {std::pair{6, 6}, std::pair{7, 10}}) {
    for (int k = 0; k < seeds; ++k) {
      const uint64_t seed = 1000 + static_cast<uint64_t>(k);
      SCOPED_TRACE(::testing::Message() << "E=" << num_experts << " seed " << seed);
      const Instance inst = random_instance(seed, num_experts, 2, 2, 2, 1.0, 3.0);
      const GlobalPlanInput in = inst.input();
      const double rank_level = rank_level_optimum(in);
      ASSERT_GE(rank_level, 0);
      MilpOptions options;
      options.time_limit_s = 20;
      const MilpResult result = solve_global_milp(in, options);
      ASSERT_EQ(result.status, "optimal");
      const double tolerance = 1e-9 * std::max(1.0, rank_level);
      EXPECT_GE(result.objective, rank_level - tolerance);
      if (num_experts == 6) EXPECT_NEAR(result.objective, rank_level, tolerance);
      if (result.objective > rank_level + tolerance) ++above;
    }
  }
  RecordProperty("node_level_above", above);
  EXPECT_GT(above, 0) << "no instance shows the relaxation: the test no longer checks it";
}

TEST(MilpPlanner, MatchesBruteForceWithSourceAnchoring) {
  // Source anchoring makes nodes distinguishable, so the expert-0-on-node-0 breaker must be off:
  // with every slot needed (N M S = E) and expert 0 drawn to node 1, fixing it to node 0 would cut
  // off the optimum.
  for (uint64_t seed : {71, 72, 73}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    Instance inst = random_instance(seed, 4, 2, 1, 2, 0.8, 1.0);
    SplitMix64 rng(seed * 7);
    inst.source_demand.resize(2 * 4);
    for (double& d : inst.source_demand) d = rng.unit();
    inst.source_demand[1 * 4 + 0] = 10.0;  // node 1 wants expert 0
    inst.source_weight = 0.5;
    const GlobalPlanInput in = inst.input();
    const double expected = brute_force_optimum(in);
    ASSERT_GE(expected, 0);
    MilpOptions options;
    options.time_limit_s = 20;
    const MilpResult result = solve_global_milp(in, options);
    ASSERT_EQ(result.status, "optimal");
    EXPECT_EQ(check_node_plan(in, result.plan), "");
    EXPECT_NEAR(result.objective, expected, 1e-9 * expected);
    EXPECT_GT(result.plan.x(0, 1), 0);
    EXPECT_GE(result.bound, result.objective);
  }
}

TEST(MilpPlanner, PlanPassesCheckWithReplicatedHotExperts) {
  // Two experts each carry ~30% of the load: with cap = 1.15 W / 4 each needs two replicas.
  Instance inst = random_instance(21, 8, 2, 2, 3, 0.5, 1.0);
  inst.load[2] = 6.0;
  inst.load[5] = 6.0;
  const GlobalPlanInput in = inst.input();
  MilpOptions options;
  options.time_limit_s = 20;
  const MilpResult result = solve_global_milp(in, options);
  ASSERT_TRUE(result.has_solution);
  EXPECT_EQ(result.status, "optimal");
  EXPECT_EQ(check_node_plan(in, result.plan), "");
  const double cap = in.rank_load_cap();
  for (int e : {2, 5}) {
    int replicas = 0;
    for (int n = 0; n < 2; ++n) replicas += result.plan.x(e, n);
    EXPECT_GE(replicas, static_cast<int>(std::ceil(inst.load[e] / cap)));
  }
  EXPECT_EQ(result.objective, coactivation_objective(in, result.plan));
}

TEST(MilpPlanner, HonoursWarmStartWithExpertZeroOffNodeZero) {
  const Instance inst = topic_instance(31, 24, 2, 4, 4, 4, 4000, 4, 0.7);
  const GlobalPlanInput in = inst.input();
  NodePlan warm = greedy_plan(in);
  // Put expert 0 on the last node so the symmetry breaker has to relabel the warm start.
  if (warm.x(0, 1) == 0) {
    for (int e = 0; e < in.num_experts; ++e) {
      std::swap(warm.x(e, 0), warm.x(e, 1));
      std::swap(warm.u(e, 0), warm.u(e, 1));
    }
  }
  ASSERT_EQ(check_node_plan(in, warm), "");
  const double warm_objective = coactivation_objective(in, warm);
  MilpOptions options;
  options.time_limit_s = 1.5;
  options.warm_start = &warm;
  const MilpResult result = solve_global_milp(in, options);
  ASSERT_TRUE(result.has_solution);
  EXPECT_NE(result.status, "watchdog");
  EXPECT_EQ(check_node_plan(in, result.plan), "");
  EXPECT_GE(result.objective, warm_objective - 1e-9 * warm_objective);
  EXPECT_GE(result.bound, result.objective);
  EXPECT_LT(result.seconds, options.time_limit_s * 1.5 + 5);
}

TEST(MilpPlanner, OptimalWarmStartComesBackUnchanged) {
  const Instance inst = random_instance(35, 6, 2, 1, 3, 0.5, 1.0);
  const GlobalPlanInput in = inst.input();
  MilpOptions options;
  options.time_limit_s = 20;
  const MilpResult first = solve_global_milp(in, options);
  ASSERT_EQ(first.status, "optimal");
  // Relabel the nodes of the optimum (expert 0 then sits on node 1 unless it is on both).
  NodePlan warm = first.plan;
  for (int e = 0; e < in.num_experts; ++e) {
    std::swap(warm.x(e, 0), warm.x(e, 1));
    std::swap(warm.u(e, 0), warm.u(e, 1));
  }
  options.warm_start = &warm;
  const MilpResult second = solve_global_milp(in, options);
  EXPECT_EQ(second.status, "optimal");
  EXPECT_TRUE(second.optimal);
  EXPECT_EQ(second.plan.replicas, warm.replicas);
  EXPECT_EQ(second.plan.load_share, warm.load_share);
  EXPECT_DOUBLE_EQ(second.objective, first.objective);
}

TEST(MilpPlanner, WatchdogReturnsWarmStart) {
  const Instance inst = random_instance(41, 64, 4, 8, 3, 1.0, 2.0, 0.0);
  const GlobalPlanInput in = inst.input();
  const NodePlan warm = greedy_plan(in);
  MilpOptions options;
  options.time_limit_s = 60;
  options.hard_timeout_s = 0.05;
  options.warm_start = &warm;
  const auto start = std::chrono::steady_clock::now();
  const MilpResult result = solve_global_milp(in, options);
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(result.status, "watchdog");
  EXPECT_LT(elapsed, 1.0);
  ASSERT_TRUE(result.has_solution);
  EXPECT_FALSE(result.optimal);
  EXPECT_EQ(result.plan.replicas, warm.replicas);
  EXPECT_EQ(result.plan.load_share, warm.load_share);
  EXPECT_EQ(check_node_plan(in, result.plan), "");
  EXPECT_DOUBLE_EQ(result.objective, coactivation_objective(in, warm));
  EXPECT_GE(result.bound, result.objective);
  EXPECT_TRUE(std::isfinite(result.bound));
  EXPECT_GE(result.gap, 0);
}

TEST(MilpPlanner, WatchdogWithoutWarmStartHasNoSolution) {
  const Instance inst = random_instance(42, 64, 4, 8, 3, 1.0, 2.0, 0.0);
  MilpOptions options;
  options.hard_timeout_s = 0.05;
  const MilpResult result = solve_global_milp(inst.input(), options);
  EXPECT_EQ(result.status, "watchdog");
  EXPECT_FALSE(result.has_solution);
  EXPECT_EQ(result.plan.num_experts, 64);
  EXPECT_EQ(result.plan.num_nodes, 4);
  EXPECT_TRUE(std::isinf(result.gap));
}

TEST(MilpPlanner, ReportsInfeasible) {
  // Expert 0 needs both single-slot nodes (w_0 > cap), leaving no slot for expert 1.
  Instance inst;
  inst.topology = Topology(2, 2);
  inst.num_experts = 2;
  inst.slots_per_rank = 1;
  inst.load = {10.0, 0.0};
  inst.coact = {0.0, 1.0, 1.0, 0.0};
  MilpOptions options;
  options.time_limit_s = 10;
  const MilpResult result = solve_global_milp(inst.input(), options);
  EXPECT_EQ(result.status, "infeasible");
  EXPECT_FALSE(result.has_solution);
  EXPECT_EQ(result.bound, -std::numeric_limits<double>::infinity());
}

// A time limit far beyond the clock's range (1e10 s: the watchdog's deadline in nanoseconds
// overflowed int64, signed-overflow UB that on x86 put the deadline in the past, so the solve was
// killed at once as "watchdog") is saturated: the solve runs and proves optimality.
TEST(MilpPlanner, HugeTimeLimitsDoNotOverflowTheDeadline) {
  const Instance inst = random_instance(11, 4, 2, 1, 2, 0.2, 3.0);
  const GlobalPlanInput in = inst.input();
  for (const double limit : {1e10, 1e300}) {
    MilpOptions options;
    options.time_limit_s = limit;
    const MilpResult result = solve_global_milp(in, options);
    EXPECT_EQ(result.status, "optimal") << limit;
    EXPECT_TRUE(result.has_solution) << limit;
  }
  MilpOptions options;
  options.hard_timeout_s = std::numeric_limits<double>::infinity();
  EXPECT_EQ(solve_global_milp(in, options).status, "optimal");
}

TEST(MilpPlanner, RejectsBadArguments) {
  const Instance inst = random_instance(51, 6, 2, 1, 3, 0.5, 1.0);
  const GlobalPlanInput in = inst.input();
  MilpOptions options;
  options.time_limit_s = 0;
  EXPECT_THROW(solve_global_milp(in, options), Error);
  options.time_limit_s = 1;
  options.num_threads = 0;
  EXPECT_THROW(solve_global_milp(in, options), Error);
  options.num_threads = 1;
  NodePlan bad(6, 2);  // no replicas at all
  options.warm_start = &bad;
  EXPECT_THROW(solve_global_milp(in, options), Error);
  NodePlan wrong_shape(6, 3);
  options.warm_start = &wrong_shape;
  EXPECT_THROW(solve_global_milp(in, options), Error);
}

// A model too large to build within the hard timeout is refused before it is built (E = 1024 on
// 8 nodes with every pair co-activated: 4.2 M columns), quickly and with a failed precondition.
TEST(MilpPlanner, RefusesModelsTooLargeToBuild) {
  const int num_experts = 1024;
  std::vector<double> w(num_experts, 1.0), c(static_cast<size_t>(num_experts) * num_experts, 1.0);
  for (int e = 0; e < num_experts; ++e) c[static_cast<size_t>(e) * num_experts + e] = 0.0;
  const GlobalPlanInput in{Topology(8, 64), num_experts, 24, 0.15, w, c};
  MilpOptions options;
  options.time_limit_s = 1;
  const auto start = std::chrono::steady_clock::now();
  try {
    solve_global_milp(in, options);
    ADD_FAILURE() << "no error for a 4.2 M-column model";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("use the heuristic backend"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(MilpPlanner, RelativeGap) {
  EXPECT_DOUBLE_EQ(relative_gap(90, 100), 0.1);
  EXPECT_DOUBLE_EQ(relative_gap(0.25, 0.5), 0.25);  // denominator max(1, |bound|)
  EXPECT_DOUBLE_EQ(relative_gap(100, 100), 0.0);
  EXPECT_TRUE(std::isinf(relative_gap(1, std::numeric_limits<double>::infinity())));
  EXPECT_TRUE(std::isnan(relative_gap(std::nan(""), 1)));
}

TEST(MilpPlanner, AssignLoadSharesMatchesFeasibility) {
  Instance inst;
  inst.topology = Topology(2, 4);  // M = 2
  inst.num_experts = 3;
  inst.slots_per_rank = 2;
  inst.load = {4.0, 2.0, 2.0};  // W = 8, cap = 1.15 * 8 / 4 = 2.3
  inst.coact.assign(9, 0.0);
  const GlobalPlanInput in = inst.input();
  NodePlan plan(3, 2);
  plan.x(0, 0) = 1, plan.x(1, 1) = 1, plan.x(2, 1) = 1;  // expert 0: 4 > one rank's 2.3
  EXPECT_FALSE(assign_load_shares(in, plan));
  plan.x(0, 0) = 2;  // two replicas: 4 <= 4.6
  ASSERT_TRUE(assign_load_shares(in, plan));
  EXPECT_EQ(check_node_plan(in, plan), "");
  EXPECT_NEAR(plan.u(0, 0), 4.0, 1e-12);
  // Split expert 0 over both nodes, next to expert 1 on node 0 and expert 2 on node 1: the share a
  // on node 0 must lie in [1.7, 2.3] (rank caps) -- feasible.
  plan = NodePlan(3, 2);
  plan.x(0, 0) = 1, plan.x(0, 1) = 1, plan.x(1, 0) = 1, plan.x(2, 1) = 1;
  ASSERT_TRUE(assign_load_shares(in, plan));
  EXPECT_EQ(check_node_plan(in, plan), "");
  NodePlan wrong(3, 3);
  EXPECT_THROW(assign_load_shares(in, wrong), Error);
}

// assign_load_shares against the test's own max flow (load_feasible, Edmonds-Karp on a dense
// matrix) on random replica counts: it finds a split exactly when one exists; the split it writes
// gives every expert its load, within cap x_en per (expert, node) and M cap per node; otherwise
// it leaves the shares zero.
TEST(MilpPlanner, AssignLoadSharesAgreesWithAnIndependentFlow) {
  int num_feasible = 0, num_infeasible = 0;
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    SplitMix64 rng(seed * 31337);
    const int num_nodes = 1 + static_cast<int>(rng.below(4));
    const int per_node = 1 + static_cast<int>(rng.below(3));
    const int num_experts = 2 + static_cast<int>(rng.below(8));
    const int slots = (num_experts + num_nodes * per_node - 1) / (num_nodes * per_node) + 1;
    const Instance inst = random_instance(seed, num_experts, num_nodes, per_node, slots, 1.0, 50.0);
    const GlobalPlanInput in = inst.input();
    NodePlan plan(num_experts, num_nodes);
    std::vector<int> x(static_cast<size_t>(num_experts) * num_nodes, 0);
    for (int e = 0; e < num_experts; ++e) {
      x[static_cast<size_t>(e) * num_nodes + rng.below(num_nodes)] = 1;  // every expert somewhere
      for (int n = 0; n < num_nodes; ++n) {
        if (rng.below(3) == 0) x[static_cast<size_t>(e) * num_nodes + n] += 1;
      }
      for (int n = 0; n < num_nodes; ++n) {
        x[static_cast<size_t>(e) * num_nodes + n] =
            std::min(x[static_cast<size_t>(e) * num_nodes + n], per_node);
        plan.x(e, n) = x[static_cast<size_t>(e) * num_nodes + n];
      }
    }
    const bool expected = load_feasible(in, x);
    ASSERT_EQ(assign_load_shares(in, plan), expected) << "seed " << seed;
    if (expected) {
      ++num_feasible;
      const double cap = in.rank_load_cap();
      for (int e = 0; e < num_experts; ++e) {
        double sum = 0;
        for (int n = 0; n < num_nodes; ++n) {
          EXPECT_LE(plan.u(e, n), cap * plan.x(e, n) * (1 + 1e-9)) << "seed " << seed;
          sum += plan.u(e, n);
        }
        EXPECT_NEAR(sum, in.expert_load[e], 1e-9 * in.total_load()) << "seed " << seed;
      }
      for (int n = 0; n < num_nodes; ++n) {
        double node = 0;
        for (int e = 0; e < num_experts; ++e) node += plan.u(e, n);
        EXPECT_LE(node, per_node * cap * (1 + 1e-9)) << "seed " << seed;
      }
    } else {
      ++num_infeasible;
      for (double u : plan.load_share) EXPECT_EQ(u, 0.0) << "seed " << seed;
    }
  }
  EXPECT_GT(num_feasible, 50);  // both answers are checked
  EXPECT_GT(num_infeasible, 50);
}

// Scaling measurements for the docs (not part of the suite):
//   cobalt_tests --gtest_also_run_disabled_tests --gtest_filter='MilpPlannerBench.*'
TEST(MilpPlannerBench, DISABLED_Scaling) {
  struct Config {
    int num_experts, num_nodes, per_node;
    double time_limit;
  };
  for (const Config& cfg : {Config{16, 2, 4, 30}, Config{32, 2, 8, 30}, Config{64, 4, 8, 30}}) {
    const int slots = static_cast<int>(1.5 * cfg.num_experts / (cfg.num_nodes * cfg.per_node));
    for (int kind = 0; kind < 2; ++kind) {
      const Instance inst = kind == 0
                                ? topic_instance(61, cfg.num_experts, cfg.num_nodes, cfg.per_node,
                                                 slots, 4, 20000, cfg.num_nodes * 2, 0.6)
                                : random_instance(62, cfg.num_experts, cfg.num_nodes, cfg.per_node,
                                                  slots, 1.0, 2.0, 0.0);
      const GlobalPlanInput in = inst.input();
      const NodePlan warm = greedy_plan(in);
      for (int use_warm = 0; use_warm < 2; ++use_warm) {
        MilpOptions options;
        options.time_limit_s = cfg.time_limit;
        options.warm_start = use_warm ? &warm : nullptr;
        const MilpResult r = solve_global_milp(in, options);
        std::printf(
            "E=%d %dx%d S=%d %s warm=%d: status=%s obj=%.1f bound=%.1f gap=%.4f warm_obj=%.1f "
            "t=%.2fs\n",
            cfg.num_experts, cfg.num_nodes, cfg.per_node, slots, kind == 0 ? "topics" : "uniform",
            use_warm, r.status.c_str(), r.objective, r.bound, r.gap,
            coactivation_objective(in, warm), r.seconds);
        std::fflush(stdout);
      }
    }
  }
}

}  // namespace
}  // namespace cobalt::plan
