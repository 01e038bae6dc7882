// UltraEP quota placement: hand-worked fast-oracle and fallback cases (traced through
// placement.cu's rules), invariants on random instances (replicas stay in their master's node,
// slots, quotas and per-source splits add up), and the interleaved reroute being a bijection.
#include "cobalt/plan/ultraep_solver.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/rng.hpp"

namespace cobalt::plan {
namespace {

void expect_invariants(const UltraEpInput& in, const UltraEpPlan& plan) {
  const Topology& topo = in.topology;
  const int G = topo.num_ranks(), E = in.num_experts, S = in.slots_per_rank;
  ASSERT_NO_THROW(ExpertLayout(topo, E, S, plan.slots));
  const ExpertLayout layout(topo, E, S, plan.slots);
  std::vector<int64_t> load(E, 0);
  for (size_t i = 0; i < in.demand.size(); ++i) load[i % E] += in.demand[i];
  std::vector<int64_t> rank_loads(G, 0);
  for (ExpertId e = 0; e < E; ++e) {
    const int begin = plan.instance_offsets[e], end = plan.instance_offsets[e + 1];
    ASSERT_GE(end - begin, 1);
    const RankId master = static_cast<RankId>(static_cast<int64_t>(e) * G / E);
    EXPECT_EQ(plan.instances[begin].rank, master) << "master first, expert " << e;
    EXPECT_EQ(end - begin, layout.num_replicas_of(e));
    int64_t quota = 0;
    for (int j = begin; j < end; ++j) {
      EXPECT_TRUE(layout.holds(plan.instances[j].rank, e));
      EXPECT_EQ(topo.node_of(plan.instances[j].rank), topo.node_of(master))
          << "replica outside its NVLink domain, expert " << e;
      EXPECT_GE(plan.instances[j].quota, 0);
      quota += plan.instances[j].quota;
    }
    EXPECT_EQ(quota, load[e]) << "quotas of expert " << e;
    for (RankId s = 0; s < G; ++s) {
      const int64_t own = in.demand[static_cast<size_t>(s) * E + e];
      const int64_t at = plan.alloc_index[static_cast<size_t>(s) * E + e];
      if (end - begin == 1 || own == 0) {
        EXPECT_EQ(at, -1);
        rank_loads[master] += own;
        continue;
      }
      ASSERT_GE(at, 0);
      int64_t sum = 0;
      for (int j = 0; j < end - begin; ++j) {
        EXPECT_GE(plan.alloc[at + j], 0);
        sum += plan.alloc[at + j];
        rank_loads[plan.instances[begin + j].rank] += plan.alloc[at + j];
      }
      EXPECT_EQ(sum, own) << "split of source " << s << " expert " << e;
    }
  }
  EXPECT_EQ(rank_loads, plan.rank_loads);
}

// One node of two ranks, expert 0 (master rank 0) takes 100 tasks: lo = 50, the fast oracle tries
// T = ceil(50 * 1.01) = 51 with floor ceil(49 / 1) = 49 and exports 49 tasks to rank 1.
// Split: rank 0's 60 tasks fill its master (51) and send 9 to the replica; rank 1's 40 stay local.
TEST(UltraEpSolver, FastOracleHandWorked) {
  std::vector<int64_t> demand = {60, 0, 40, 0};  // [G = 2, E = 2]
  UltraEpInput in{Topology(1, 2), 2, 2, demand, {}};
  const UltraEpPlan plan = solve_ultraep(in);
  expect_invariants(in, plan);
  EXPECT_EQ(plan.thresholds, (std::vector<int64_t>{51}));
  EXPECT_EQ(plan.num_fast_oracle, 1);
  ASSERT_EQ(plan.instance_offsets, (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(plan.instances[0].rank, 0);
  EXPECT_EQ(plan.instances[0].quota, 51);
  EXPECT_EQ(plan.instances[1].rank, 1);
  EXPECT_EQ(plan.instances[1].quota, 49);
  EXPECT_EQ(std::vector<int64_t>(plan.alloc.begin() + plan.alloc_index[0],
                                 plan.alloc.begin() + plan.alloc_index[0] + 2),
            (std::vector<int64_t>{51, 9}));
  EXPECT_EQ(std::vector<int64_t>(plan.alloc.begin() + plan.alloc_index[2],
                                 plan.alloc.begin() + plan.alloc_index[2] + 2),
            (std::vector<int64_t>{0, 40}));
  EXPECT_EQ(plan.rank_loads, (std::vector<int64_t>{51, 49}));
}

// Three ranks, one replica slot each, two hot masters (300 tasks on ranks 0 and 1): only rank 2
// can take a replica, so no cap below 300 is reachable. The fast oracle fails three times, the
// fallback searches [201, 300) with the kernel's probes and ends at hi = 300 with no exports.
TEST(UltraEpSolver, FallbackSearchEndsAtHiWhenSlotsCannotHelp) {
  std::vector<int64_t> omega(9, 0);
  omega[0 * 3 + 0] = 300;
  omega[1 * 3 + 1] = 300;
  UltraEpInput in{Topology(1, 3), 3, 2, omega, {}};
  in.options.min_tokens_per_replica = 1;
  const UltraEpPlan plan = solve_ultraep(in);
  expect_invariants(in, plan);
  EXPECT_EQ(plan.num_fast_oracle, 0);
  EXPECT_EQ(plan.thresholds, (std::vector<int64_t>{300}));
  EXPECT_EQ(plan.num_replicas, 0);
  EXPECT_EQ(plan.rank_loads, (std::vector<int64_t>{300, 300, 0}));
}

TEST(UltraEpSolver, InvariantsOnRandomInstances) {
  SplitMix64 rng(11);
  struct Case {
    int nodes, ranks, experts, extra;
  };
  for (const Case c : {Case{2, 16, 32, 2}, Case{4, 32, 128, 2}, Case{4, 32, 100, 1},
                       Case{1, 8, 64, 3}, Case{2, 16, 40, 0}}) {
    for (int64_t tasks : {50, 3000}) {
      std::vector<int64_t> demand(static_cast<size_t>(c.ranks) * c.experts, 0);
      for (RankId s = 0; s < c.ranks; ++s) {
        for (int64_t t = 0; t < tasks; ++t) {
          double u = rng.unit();
          demand[static_cast<size_t>(s) * c.experts + static_cast<int>(u * u * u * c.experts)] += 1;
        }
      }
      const int slots = (c.experts + c.ranks - 1) / c.ranks + c.extra;
      UltraEpInput in{Topology(c.nodes, c.ranks), c.experts, slots, demand, {}};
      in.options.min_tokens_per_replica = std::max<int64_t>(1, tasks / 64);
      const UltraEpPlan plan = solve_ultraep(in);
      SCOPED_TRACE(testing::Message() << c.nodes << "x" << c.ranks / c.nodes << " E=" << c.experts
                                      << " tasks/rank=" << tasks);
      expect_invariants(in, plan);
      // Each domain meets its threshold on the quotas.
      std::vector<int64_t> quota_load(c.ranks, 0);
      for (const auto& inst : plan.instances) quota_load[inst.rank] += inst.quota;
      for (RankId r = 0; r < c.ranks; ++r) {
        EXPECT_LE(quota_load[r], plan.thresholds[in.topology.node_of(r)]) << "rank " << r;
      }
      const auto again = solve_ultraep(in);
      EXPECT_EQ(again.slots, plan.slots);
      EXPECT_EQ(again.alloc, plan.alloc);
    }
  }
}

// When G does not divide E, ranks with floor(E / G) masters have a free slot even at S =
// ceil(E / G): replicas go there (every rank used to get S - ceil(E / G) replica slots, so these
// shapes stayed static), and no rank exceeds its S slots.
TEST(UltraEpSolver, RanksWithFewerMastersUseTheirFreeSlots) {
  const int G = 8, E = 12, S = 2;  // ranks hold 2, 1, 2, 1, ... masters
  std::vector<int64_t> demand(static_cast<size_t>(G) * E, 0);
  for (RankId s = 0; s < G; ++s) demand[static_cast<size_t>(s) * E + 0] = 100;  // expert 0 hot
  for (size_t i = 0; i < demand.size(); ++i) demand[i] += 5;
  UltraEpInput in{Topology(2, G), E, S, demand, {}};
  in.options.min_tokens_per_replica = 1;  // the default 1024 would keep these small loads home
  const UltraEpPlan plan = solve_ultraep(in);
  expect_invariants(in, plan);
  EXPECT_GT(plan.num_replicas, 0);
  // Expert 0's master (rank 0, with expert 1) carried 8 x 105 + 8 x 5 tasks alone under static EP.
  EXPECT_LT(*std::max_element(plan.rank_loads.begin(), plan.rank_loads.end()), 8 * 105 + 8 * 5);
}

// Per-source splits multiply counts by replica capacities: beyond ~3e9 tasks that overflowed
// int64 (a 43 s call and a far worse balance). Scaled by 2^33, the instance must balance as well
// as the unscaled one.
TEST(UltraEpSolver, HugeCountsBalanceLikeSmallOnes) {
  SplitMix64 rng(5);
  const Topology topo(4, 32);
  const int experts = 128, slots = 6;
  std::vector<int64_t> demand(static_cast<size_t>(32) * experts, 0);
  for (RankId s = 0; s < 32; ++s) {
    for (int t = 0; t < 2000; ++t) {
      const double u = rng.unit();
      demand[static_cast<size_t>(s) * experts + static_cast<int>(u * u * experts)] += 1;
    }
  }
  std::vector<int64_t> huge(demand);
  for (auto& v : huge) v <<= 33;
  auto imbalance = [](const UltraEpPlan& plan) {
    const auto [lo, hi] = std::minmax_element(plan.rank_loads.begin(), plan.rank_loads.end());
    double sum = 0;
    for (auto v : plan.rank_loads) sum += static_cast<double>(v);
    (void)lo;
    return static_cast<double>(*hi) / (sum / static_cast<double>(plan.rank_loads.size()));
  };
  UltraEpInput small_in{topo, experts, slots, demand, {}};
  UltraEpInput huge_in{topo, experts, slots, huge, {}};
  small_in.options.min_tokens_per_replica = 16;
  huge_in.options.min_tokens_per_replica = int64_t{16} << 33;
  const UltraEpPlan small_plan = solve_ultraep(small_in);
  const UltraEpPlan huge_plan = solve_ultraep(huge_in);
  expect_invariants(huge_in, huge_plan);
  EXPECT_LE(imbalance(huge_plan), imbalance(small_plan) + 0.01);
}

TEST(UltraEpSolver, InterleaveIsABijection) {
  for (int64_t total : {1, 2, 3, 4, 10, 12, 97, 360}) {
    for (ExpertId e : {0, 3, 17}) {
      const auto il = ultraep_interleave(e, total);
      std::vector<int> hit(total, 0);
      for (int64_t k = 0; k < total; ++k) hit[il.slot(k)] += 1;
      EXPECT_EQ(hit, std::vector<int>(total, 1)) << "total " << total << " expert " << e;
    }
  }
  // reroute.cu: n = 10 -> stride 7 (6 shares a factor with 10), offset e mod n.
  const auto il = ultraep_interleave(3, 10);
  EXPECT_EQ(il.stride, 7);
  EXPECT_EQ(il.offset, 3);
  EXPECT_EQ(il.slot(1), 0);
}

TEST(UltraEpSolver, RejectsBadInputs) {
  std::vector<int64_t> demand(4 * 8, 1);
  EXPECT_THROW(solve_ultraep(UltraEpInput{Topology(1, 4), 8, 1, demand, {}}), Error);
  EXPECT_THROW(solve_ultraep(UltraEpInput{Topology(1, 4), 7, 2, demand, {}}), Error);
  demand[0] = -2;
  EXPECT_THROW(solve_ultraep(UltraEpInput{Topology(1, 4), 8, 2, demand, {}}), Error);
  // Sums past 2^52 (rank loads overflowed int64) and options outside their ranges.
  demand.assign(4 * 8, 1);
  demand[0] = demand[2] = std::numeric_limits<int64_t>::max() / 2;
  try {
    solve_ultraep(UltraEpInput{Topology(1, 4), 8, 2, demand, {}});
    ADD_FAILURE() << "accepted demand summing past 2^52";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("sums past 2^52 tasks (at demand[0][0]"),
              std::string::npos)
        << e.what();
  }
  demand.assign(4 * 8, 1);
  UltraEpOptions nan_threshold, negative_eps, negative_floor;
  nan_threshold.balance_threshold = std::nan("");
  negative_eps.oracle_eps = -5;
  negative_floor.min_tokens_per_replica = -7;
  for (const auto& [options, field] :
       {std::pair{nan_threshold, "balance threshold"}, std::pair{negative_eps, "oracle eps"},
        std::pair{negative_floor, "min tokens per replica"}}) {
    try {
      solve_ultraep(UltraEpInput{Topology(1, 4), 8, 2, demand, options});
      ADD_FAILURE() << "accepted a bad " << field;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("ultraep: ") + field), std::string::npos)
          << e.what();
    }
  }
}

// UltraEP's per-source split recomputed from the header's words (local fill, proportional
// split of the rest by remaining capacity, largest remainder first, ties: lower host rank, then
// instance order).
TEST(UltraEpSolver, SplitFollowsTheHeaderIncludingTies) {
  SplitMix64 rng(5);
  int64_t num_ties = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const int nodes = 1 + static_cast<int>(rng.below(2)), ranks = nodes * (2 + rng.below(3));
    const int experts = ranks + static_cast<int>(rng.below(ranks * 2));
    std::vector<int64_t> demand(static_cast<size_t>(ranks) * experts, 0);
    for (RankId s = 0; s < ranks; ++s) {
      for (int t = 0; t < 40; ++t) {
        const double u = rng.unit();
        demand[static_cast<size_t>(s) * experts + static_cast<int>(u * u * u * experts)] += 1;
      }
    }
    const int slots = (experts + ranks - 1) / ranks + 2;
    UltraEpInput in{Topology(nodes, ranks), experts, slots, demand, {}};
    in.options.min_tokens_per_replica = 1;
    const UltraEpPlan p = solve_ultraep(in);
    for (ExpertId e = 0; e < experts; ++e) {
      const int first = p.instance_offsets[e], num = p.instance_offsets[e + 1] - first;
      if (num < 2) continue;
      std::vector<int64_t> local(num), cap(num);
      int64_t total_remote = 0;
      for (int j = 0; j < num; ++j) {
        const auto& inst = p.instances[first + j];
        local[j] = std::min(demand[static_cast<size_t>(inst.rank) * experts + e], inst.quota);
        cap[j] = inst.quota - local[j];
        total_remote += cap[j];
      }
      for (RankId s = 0; s < ranks; ++s) {
        const int64_t own = demand[static_cast<size_t>(s) * experts + e];
        if (own == 0) continue;
        std::vector<int64_t> alloc(num, 0), rem_of(num, -1);
        int64_t rem = own;
        int mine = -1;
        for (int j = 0; j < num; ++j) {
          if (p.instances[first + j].rank == s) {
            mine = j;
            alloc[j] += local[j];
            rem -= local[j];
          }
        }
        rem = std::max<int64_t>(rem, 0);
        if (rem > 0 && total_remote > 0) {
          int64_t assigned = 0;
          for (int j = 0; j < num; ++j) {
            if (j == mine || cap[j] <= 0) continue;
            alloc[j] += rem * cap[j] / total_remote;
            rem_of[j] = rem * cap[j] % total_remote;
            assigned += rem * cap[j] / total_remote;
          }
          std::vector<int> order;
          for (int j = 0; j < num; ++j)
            if (rem_of[j] >= 0) order.push_back(j);
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
            return std::make_pair(-rem_of[a], p.instances[first + a].rank) <
                   std::make_pair(-rem_of[b], p.instances[first + b].rank);
          });
          for (size_t i = 0; i + 1 < order.size(); ++i)
            num_ties += rem_of[order[i]] == rem_of[order[i + 1]];
          for (int64_t i = 0; i < rem - assigned; ++i) alloc[order[i]] += 1;
        }
        const int64_t at = p.alloc_index[static_cast<size_t>(s) * experts + e];
        ASSERT_GE(at, 0);
        ASSERT_EQ(std::vector<int64_t>(p.alloc.begin() + at, p.alloc.begin() + at + num), alloc)
            << "trial " << trial << " expert " << e << " source " << s;
      }
    }
  }
  EXPECT_GT(num_ties, 10);
}

}  // namespace
}  // namespace cobalt::plan
