#include "cobalt/eval/metrics.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <numeric>
#include <set>
#include <string>

#include "cobalt/core/assignment.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::eval {
namespace {

TEST(Metrics, HandComputedFixture) {
  // 3 nodes x 2 ranks (node n = ranks 2n, 2n+1). K = 3.
  // token 0 from rank 0 (node 0): exec ranks {1, 2, 3} -> nodes {0, 1, 1}: remote {1} -> V += 1;
  //                                no-dedup: ranks 2 and 3 are remote -> 2.
  // token 1 from rank 5 (node 2): exec ranks {0, 2, 4} -> nodes {0, 1, 2}: remote {0, 1} -> V += 2;
  //                                no-dedup 2.
  // token 2 from rank 3 (node 1): exec ranks {2, 3, 2} -> all node 1 -> V += 0, no-dedup 0.
  Topology topo(3, 6);
  std::vector<ExpertId> ids = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<RankId> src = {0, 5, 3};
  RoutingBatch batch(ids, src, 3, 9, 6);
  std::vector<RankId> exec = {1, 2, 3, 0, 2, 4, 2, 3, 2};
  auto v = cross_node_transfers(batch, exec, topo);
  EXPECT_EQ(v.dedup, 3);
  EXPECT_EQ(v.no_dedup, 4);
  // Loads: rank0 1, rank1 1, rank2 4, rank3 2, rank4 1, rank5 0 -> mean 9/6 = 1.5, max 4 -> 2.6667.
  auto loads = rank_loads(exec, 6);
  EXPECT_EQ(loads, (std::vector<int64_t>{1, 1, 4, 2, 1, 0}));
  EXPECT_NEAR(imbalance(loads), 4 / 1.5, 1e-12);
  // Expert counts all 1 -> MaxVio 0.
  auto m = step_metrics(batch, exec, topo);
  EXPECT_DOUBLE_EQ(m.max_violation, 0.0);
  // MaxVio of (3, 1, 0, 0): mean 1, max 3 -> 2.
  std::vector<int64_t> counts = {3, 1, 0, 0};
  EXPECT_DOUBLE_EQ(max_violation(counts), 2.0);
  EXPECT_DOUBLE_EQ(imbalance(std::vector<int64_t>{0, 0}), 1.0);
  EXPECT_DOUBLE_EQ(token_bytes(3, 4096, 2), 3.0 * 4096 * 2);
}

// Loads and counts that cannot be task counts (negative, or summing past int64) are refused, not
// turned into a negative or zero imbalance.
TEST(Metrics, ImbalanceRefusesNegativeAndOverflowingCounts) {
  const int64_t huge = int64_t{1} << 62;
  for (const std::vector<int64_t>& counts :
       {std::vector<int64_t>{-1, 1}, std::vector<int64_t>{huge, huge}, {3, huge, huge, 1}}) {
    for (const bool experts : {false, true}) {
      try {
        experts ? max_violation(counts) : imbalance(counts);
        ADD_FAILURE() << "accepted " << counts[0] << ", " << counts[1];
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(experts ? "expert" : "rank"), std::string::npos)
            << e.what();
      }
    }
  }
  // Up to 2^63 - 1 in total is fine.
  EXPECT_DOUBLE_EQ(imbalance(std::vector<int64_t>{huge, huge - 1}), 2.0 * huge / (2.0 * huge - 1));
}

TEST(Metrics, CrossNodeMatchesSetReferenceOnRandomInputs) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SplitMix64 rng(seed);
    const int nodes = 1 + rng.below(8), per_node = 1 + rng.below(4), top_k = 1 + rng.below(6);
    Topology topo(nodes, nodes * per_node);
    auto owned = testing::random_batch(seed, 500, top_k, 16, topo.num_ranks());
    auto batch = owned.view();
    std::vector<RankId> exec(batch.num_tasks());
    for (auto& r : exec) r = static_cast<RankId>(rng.below(topo.num_ranks()));
    int64_t ref_dedup = 0, ref_no_dedup = 0;
    for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
      std::set<NodeId> remote;
      const NodeId src = topo.node_of(batch.source_of(t));
      for (int k = 0; k < top_k; ++k) {
        const NodeId n = topo.node_of(exec[t * top_k + k]);
        if (n != src) {
          remote.insert(n);
          ++ref_no_dedup;
        }
      }
      ref_dedup += static_cast<int64_t>(remote.size());
    }
    auto v = cross_node_transfers(batch, exec, topo);
    EXPECT_EQ(v.dedup, ref_dedup);
    EXPECT_EQ(v.no_dedup, ref_no_dedup);
    auto loads = rank_loads(exec, topo.num_ranks());
    int64_t sum = 0;
    for (auto l : loads) sum += l;
    EXPECT_EQ(sum, batch.num_tasks());
  }
}

TEST(ExchangeVolume, HandComputedFixture) {
  // 2 nodes x 4 ranks (node 0 = ranks 0-3, node 1 = ranks 4-7). K = 4.
  // token 0 from rank 1: exec {1, 2, 5, 6}: local copy 1->2; one IB copy node 0->1, landing on the
  //   relay rank 4 + (1 % 4) = 5, which forwards to 6. (Task on rank 1 itself moves nothing.)
  // token 1 from rank 6: exec {0, 0, 3, 7}: rank 0 receives once; one IB copy 1->0 landing on
  //   relay 0 + 2 = 2, forwarded to 0 and 3; local copy 6->7.
  Topology topo(2, 8);
  std::vector<ExpertId> ids = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<RankId> src = {1, 6};
  RoutingBatch batch(ids, src, 4, 8, 8);
  std::vector<RankId> exec = {1, 2, 5, 6, 0, 0, 3, 7};
  const ExchangeVolume v = exchange_volume(batch, exec, topo);
  EXPECT_EQ(v.node_out, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(v.node_in, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(v.nvlink_out, (std::vector<int64_t>{0, 1, 2, 0, 0, 1, 1, 0}));
  EXPECT_EQ(v.nvlink_in, (std::vector<int64_t>{1, 0, 1, 1, 0, 0, 1, 1}));
}

// Brute force: explicit sets of destination ranks and nodes per token.
ExchangeVolume reference_volume(const RoutingBatch& batch, std::span<const RankId> exec,
                                const Topology& topo) {
  const int m = topo.ranks_per_node();
  ExchangeVolume v;
  v.node_out.assign(topo.num_nodes(), 0);
  v.node_in.assign(topo.num_nodes(), 0);
  v.nvlink_out.assign(topo.num_ranks(), 0);
  v.nvlink_in.assign(topo.num_ranks(), 0);
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    const RankId s = batch.source_of(t);
    std::map<NodeId, std::set<RankId>> dest;  // node -> destination ranks
    for (int k = 0; k < batch.top_k(); ++k) {
      const RankId r = exec[t * batch.top_k() + k];
      dest[r / m].insert(r);
    }
    for (const auto& [node, ranks] : dest) {
      const RankId entry = node == s / m ? s : node * m + s % m;
      if (node != s / m) {
        ++v.node_out[s / m];
        ++v.node_in[node];
      }
      for (RankId d : ranks) {
        if (d == entry) continue;
        ++v.nvlink_out[entry];
        ++v.nvlink_in[d];
      }
    }
  }
  return v;
}

TEST(ExchangeVolume, MatchesBruteForceOnRandomInputs) {
  // Up to 64 ranks the rank sets are bit masks (a fixed node loop up to 8 nodes, a loop over the
  // reached nodes above); more ranks take the per-task path. All three shapes are drawn.
  for (uint64_t seed = 1; seed <= 90; ++seed) {
    SplitMix64 rng(seed * 7);
    // Every fifth seed one of the widest node counts within 64 ranks: 64 x 1, 32 x 2, 21 x 3.
    static constexpr int kWide[][2] = {{64, 1}, {32, 2}, {21, 3}};
    const int shape = static_cast<int>(seed % 3);
    const bool wide = seed % 5 == 0;
    const int nodes = wide         ? kWide[seed % 3][0]
                      : shape == 0 ? 1 + rng.below(8)
                      : shape == 1 ? 9 + rng.below(8)
                                   : 9 + rng.below(4),
              per_node = wide         ? kWide[seed % 3][1]
                         : shape == 0 ? 1 + rng.below(8)
                         : shape == 1 ? 1 + rng.below(4)
                                      : 8 + rng.below(3),
              top_k = 1 + rng.below(8);
    Topology topo(nodes, nodes * per_node);
    auto owned = testing::random_batch(seed, 400, top_k, 24, topo.num_ranks(), 1.0);
    auto batch = owned.view();
    std::vector<RankId> exec(batch.num_tasks());
    // Mix of uniform ranks and ranks on the source node, so both paths are exercised.
    for (size_t i = 0; i < exec.size(); ++i) {
      const RankId s = batch.source_of(static_cast<TokenIdx>(i / top_k));
      exec[i] = rng.below(3) == 0 ? topo.first_rank_of(topo.node_of(s)) + rng.below(per_node)
                                  : static_cast<RankId>(rng.below(topo.num_ranks()));
    }
    const ExchangeVolume got = exchange_volume(batch, exec, topo);
    const ExchangeVolume want = reference_volume(batch, exec, topo);
    EXPECT_EQ(got.node_out, want.node_out) << "seed " << seed;
    EXPECT_EQ(got.node_in, want.node_in) << "seed " << seed;
    EXPECT_EQ(got.nvlink_out, want.nvlink_out) << "seed " << seed;
    EXPECT_EQ(got.nvlink_in, want.nvlink_in) << "seed " << seed;
    // Inter-node copies are exactly the node-deduplicated cross-node transfers V.
    const int64_t v = cross_node_transfers(batch, exec, topo).dedup;
    EXPECT_EQ(std::accumulate(got.node_out.begin(), got.node_out.end(), int64_t{0}), v);
    EXPECT_EQ(std::accumulate(got.node_in.begin(), got.node_in.end(), int64_t{0}), v);
  }
}

TEST(ExchangeVolume, RejectsBadExecutionRanks) {
  Topology topo(2, 4);
  std::vector<ExpertId> ids = {0, 1};
  std::vector<RankId> src = {0};
  RoutingBatch batch(ids, src, 2, 4, 4);
  std::vector<RankId> exec = {0, 4};
  EXPECT_THROW(exchange_volume(batch, exec, topo), Error);
  std::vector<RankId> short_exec = {0};
  EXPECT_THROW(exchange_volume(batch, short_exec, topo), Error);
}

// A batch whose source ranks go beyond the topology's ranks is refused by every metric (they
// index per-rank tables with the source rank).
// The simulator's one-pass replay equals validate_assignment + step_metrics + exchange_volume on
// valid assignments (both sides of 64 ranks, more than 8 nodes within 64), and reports a task on
// a rank lacking its expert as validate_assignment does.
TEST(Metrics, ReplayLayerEqualsTheSeparateCalls) {
  static constexpr int kShapes[][2] = {{2, 4}, {4, 8}, {8, 8}, {16, 4}, {64, 1}, {9, 8}, {3, 5}};
  for (uint64_t seed = 1; seed <= 70; ++seed) {
    SplitMix64 rng(seed * 131);
    const auto& shape = kShapes[seed % 7];
    const Topology topo(shape[0], shape[0] * shape[1]);
    const int slots = 1 + static_cast<int>(rng.below(3));
    const int experts = 1 + static_cast<int>(rng.below(topo.num_ranks() * slots));
    const int top_k = 1 + static_cast<int>(rng.below(std::min(experts, 8)));
    const auto layout = testing::random_layout(seed, topo, experts, slots, rng.unit());
    const auto owned = testing::random_batch(seed * 3, static_cast<int64_t>(rng.below(400)), top_k,
                                             experts, topo.num_ranks(), 1.5);
    const auto batch = owned.view();
    std::vector<RankId> exec(batch.num_tasks());
    for (size_t i = 0; i < exec.size(); ++i) {
      const auto holders = layout.ranks_of(batch.topk_ids()[i]);
      exec[i] = holders[rng.below(static_cast<uint32_t>(holders.size()))];
    }
    SCOPED_TRACE("seed " + std::to_string(seed));
    const LayerReplay replay = replay_layer(batch, layout, exec, topo);
    const StepMetrics want = step_metrics(batch, exec, topo);
    const ExchangeVolume volume = exchange_volume(batch, exec, topo);
    EXPECT_EQ(replay.metrics.transfers.dedup, want.transfers.dedup);
    EXPECT_EQ(replay.metrics.transfers.no_dedup, want.transfers.no_dedup);
    EXPECT_EQ(replay.metrics.rank_loads, want.rank_loads);
    EXPECT_EQ(replay.metrics.imbalance, want.imbalance);
    EXPECT_EQ(replay.metrics.max_violation, want.max_violation);
    EXPECT_EQ(replay.volume.node_out, volume.node_out);
    EXPECT_EQ(replay.volume.node_in, volume.node_in);
    EXPECT_EQ(replay.volume.nvlink_out, volume.nvlink_out);
    EXPECT_EQ(replay.volume.nvlink_in, volume.nvlink_in);
    // A task moved to a rank without its expert (or out of range): validate_assignment's error.
    if (batch.num_tasks() == 0) continue;
    const size_t i = rng.below(static_cast<uint32_t>(exec.size()));
    RankId bad = topo.num_ranks();
    for (RankId r = 0; r < topo.num_ranks(); ++r) {
      if (!layout.holds(r, batch.topk_ids()[i])) bad = r;
    }
    exec[i] = bad;
    std::string want_error, got_error;
    try {
      validate_assignment(batch, layout, exec);
    } catch (const Error& e) {
      want_error = e.what();
      EXPECT_EQ(e.code(), ErrorCode::kInternal);
    }
    try {
      replay_layer(batch, layout, exec, topo);
    } catch (const Error& e) {
      got_error = e.what();
      EXPECT_EQ(e.code(), ErrorCode::kInternal);
    }
    EXPECT_FALSE(want_error.empty());
    EXPECT_EQ(got_error, want_error);
  }
}

TEST(Metrics, RejectSourcesBeyondTheTopology) {
  Topology topo(2, 4);
  std::vector<ExpertId> ids = {0, 1};
  std::vector<RankId> src = {7};  // valid for the batch's 8 ranks, not for the 4-rank topology
  RoutingBatch batch(ids, src, 2, 4, 8);
  std::vector<RankId> exec = {0, 1};
  for (const auto& call : std::vector<std::function<void()>>{
           [&] { cross_node_transfers(batch, exec, topo); },
           [&] { exchange_volume(batch, exec, topo); }, [&] { step_metrics(batch, exec, topo); }}) {
    try {
      call();
      ADD_FAILURE() << "accepted a source rank beyond the topology";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("source ranks in [0, 8)"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace cobalt::eval
