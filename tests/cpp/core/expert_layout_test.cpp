#include "cobalt/core/expert_layout.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <tuple>

#include "cobalt/core/error.hpp"

namespace cobalt {
namespace {

// 2 nodes x 2 ranks, 4 experts, 2 slots per rank.
//   rank 0: {0, 1}   rank 1: {2, -}   | node 0
//   rank 2: {3, 0}   rank 3: {1, -}   | node 1
ExpertLayout small_layout() {
  return ExpertLayout(Topology(2, 4), 4, 2, {0, 1, 2, -1, 3, 0, 1, -1});
}

TEST(ExpertLayout, DerivedMaps) {
  auto layout = small_layout();
  EXPECT_EQ(layout.num_replicas(), 6);
  EXPECT_EQ(layout.num_replicas_of(0), 2);
  EXPECT_EQ(std::vector<RankId>(layout.ranks_of(0).begin(), layout.ranks_of(0).end()),
            (std::vector<RankId>{0, 2}));
  EXPECT_EQ(layout.node_mask(0), 0b11u);
  EXPECT_EQ(layout.node_mask(2), 0b01u);
  EXPECT_EQ(layout.node_mask(3), 0b10u);
  EXPECT_EQ(layout.ranks_of(1, 1).size(), 1u);
  EXPECT_EQ(layout.ranks_of(1, 1)[0], 3);
  EXPECT_TRUE(layout.ranks_of(3, 0).empty());
  EXPECT_TRUE(layout.holds(2, 0));
  EXPECT_FALSE(layout.holds(1, 0));
  EXPECT_EQ(layout.num_used_slots(1), 1);
}

// The derived maps (the E x G bit table, each expert's ranks overall and per node, node masks)
// against a brute-force reading of the slots, on random layouts whose E x G is rarely a multiple
// of 64 (bits of one expert straddle words).
TEST(ExpertLayout, DerivedMapsMatchTheSlotsOnRandomLayouts) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int num_nodes = 1 + static_cast<int>(rng() % 5);
    const int ranks_per_node = 1 + static_cast<int>(rng() % 9);
    const Topology topology(num_nodes, num_nodes * ranks_per_node);
    const int num_ranks = topology.num_ranks();
    const int slots_per_rank = 1 + static_cast<int>(rng() % 4);
    const int num_experts =
        1 + static_cast<int>(rng() % static_cast<uint64_t>(num_ranks * slots_per_rank));
    // Every expert once, then random extra replicas on ranks that lack them, shuffled per rank.
    std::vector<std::vector<ExpertId>> rank_lists(num_ranks);
    for (ExpertId e = 0; e < num_experts; ++e) {
      RankId r = static_cast<RankId>(rng() % num_ranks);
      while (static_cast<int>(rank_lists[r].size()) == slots_per_rank) r = (r + 1) % num_ranks;
      rank_lists[r].push_back(e);
    }
    std::vector<ExpertId> slots;
    for (RankId r = 0; r < num_ranks; ++r) {
      auto& list = rank_lists[r];
      while (static_cast<int>(list.size()) < slots_per_rank) {
        const ExpertId e = static_cast<ExpertId>(rng() % num_experts);
        const bool held = std::find(list.begin(), list.end(), e) != list.end();
        list.push_back(held || rng() % 3 == 0 ? kEmptySlot : e);
      }
      std::shuffle(list.begin(), list.end(), rng);
      slots.insert(slots.end(), list.begin(), list.end());
    }
    const ExpertLayout layout(topology, num_experts, slots_per_rank, slots);
    int num_replicas = 0;
    for (ExpertId e = 0; e < num_experts; ++e) {
      std::vector<RankId> ranks;
      uint64_t mask = 0;
      for (RankId r = 0; r < num_ranks; ++r) {
        const auto first = slots.begin() + static_cast<ptrdiff_t>(r) * slots_per_rank;
        const bool held = std::find(first, first + slots_per_rank, e) != first + slots_per_rank;
        ASSERT_EQ(layout.holds(r, e), held)
            << "trial " << trial << " rank " << r << " expert " << e;
        if (!held) continue;
        ranks.push_back(r);
        mask |= uint64_t{1} << topology.node_of(r);
      }
      num_replicas += static_cast<int>(ranks.size());
      EXPECT_EQ(std::vector<RankId>(layout.ranks_of(e).begin(), layout.ranks_of(e).end()), ranks);
      EXPECT_EQ(layout.node_mask(e), mask);
      for (NodeId n = 0; n < num_nodes; ++n) {
        std::vector<RankId> on_node;
        for (RankId r : ranks) {
          if (topology.node_of(r) == n) on_node.push_back(r);
        }
        EXPECT_EQ(std::vector<RankId>(layout.ranks_of(e, n).begin(), layout.ranks_of(e, n).end()),
                  on_node);
      }
    }
    EXPECT_EQ(layout.num_replicas(), num_replicas);
  }
}

TEST(ExpertLayout, Validation) {
  Topology topo(2, 4);
  // Expert 3 missing.
  EXPECT_THROW(ExpertLayout(topo, 4, 2, {0, 1, 2, -1, 2, 0, 1, -1}), Error);
  // Duplicate on a rank.
  EXPECT_THROW(ExpertLayout(topo, 4, 2, {0, 0, 2, 1, 3, -1, -1, -1}), Error);
  // Out-of-range id.
  EXPECT_THROW(ExpertLayout(topo, 4, 2, {0, 1, 2, 3, 4, -1, -1, -1}), Error);
  // Wrong size.
  EXPECT_THROW(ExpertLayout(topo, 4, 2, {0, 1, 2, 3}), Error);
  // More experts than one MoE layer has (kMaxExperts), named with the valid range.
  try {
    ExpertLayout(Topology(1, 1), kMaxExperts + 1, 1, std::vector<ExpertId>(1, 0));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("out of range [1, 65536]"), std::string::npos) << e.what();
  }
  // Too few slots overall is a failed precondition.
  try {
    ExpertLayout(topo, 9, 2, std::vector<ExpertId>(8, -1));
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
  }
}

TEST(ExpertLayout, StaticEp) {
  auto layout = ExpertLayout::static_ep(Topology(2, 4), 8, 2);
  for (ExpertId e = 0; e < 8; ++e) {
    ASSERT_EQ(layout.num_replicas_of(e), 1);
    EXPECT_EQ(layout.ranks_of(e)[0], e * 4 / 8);
  }
  // A budget too small is the constructor's kFailedPrecondition (it was kInvalidArgument naming
  // a rank's replicas).
  try {
    ExpertLayout::static_ep(Topology(2, 8), 20, 2);
    ADD_FAILURE() << "16 ranks x 2 slots held 20 experts";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("layout: 8 ranks x 2 slots cannot hold 20 experts"),
              std::string::npos)
        << e.what();
  }
}

TEST(ExpertLayout, SlotBudgets) {
  EXPECT_EQ(slots_for_rho(128, 32, 0.5), 6);   // floor(1.5 * 4)
  EXPECT_EQ(slots_for_rho(60, 16, 0.5), 5);    // floor(5.625)
  EXPECT_EQ(slots_for_extra(640, 32, 2), 22);  // 20 + 2
  EXPECT_EQ(slots_for_extra(60, 16, 1), 5);    // ceil(3.75) + 1
  EXPECT_THROW(slots_for_rho(60, 16, -0.1), Error);
  // More slots than experts cannot be used (a rank holds each expert at most once): capped, and a
  // huge budget does not overflow.
  EXPECT_EQ(slots_for_rho(64, 8, 1e300), 64);
  EXPECT_EQ(slots_for_rho(64, 8, 1e9), 64);
  EXPECT_EQ(slots_for_extra(64, 8, 2147483647), 64);
  // E and G beyond what any layout takes are refused by name (ceil(E / G) overflowed int).
  for (const auto& [experts, ranks, words] :
       {std::tuple{kMaxExperts + 1, 8, "number of experts 65537 out of range [1, 65536]"},
        std::tuple{2147483647, 2, "number of experts 2147483647 out of range"},
        std::tuple{16, kMaxRanks + 1, "number of ranks 8193 out of range [1, 8192]"},
        std::tuple{16, 2147483647, "number of ranks 2147483647 out of range"}}) {
    for (int which = 0; which < 2; ++which) {
      try {
        which == 0 ? slots_for_rho(experts, ranks, 0.5) : slots_for_extra(experts, ranks, 0);
        ADD_FAILURE() << "accepted E=" << experts << " G=" << ranks;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_THROW(slots_for_rho(64, 8, std::numeric_limits<double>::quiet_NaN()), Error);
  try {
    slots_for_rho(60, 16, 0.0);  // floor(3.75) = 3 slots x 16 = 48 < 60
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition);
    EXPECT_NE(std::string(e.what()).find("replica budget too small"), std::string::npos);
  }
}

// The rho a too-small budget suggests works when passed back: 2/7 = 0.28571... was printed as
// 0.2857, which is too small (7 experts on 3 ranks need 3 slots); it is rounded up now.
TEST(ExpertLayout, SuggestedRhoIsEnough) {
  try {
    slots_for_rho(7, 3, 0.0);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need rho >= 0.2858"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slots_for_rho(7, 3, 0.2858), 3);
  int checked = 0;
  for (int experts = 1; experts <= 120; ++experts) {
    for (int ranks = 1; ranks <= 40; ++ranks) {
      try {
        slots_for_rho(experts, ranks, 0.0);
      } catch (const Error& e) {
        const std::string message = e.what();
        const size_t at = message.find("need rho >= ");
        ASSERT_NE(at, std::string::npos) << message;
        const double suggested = std::stod(message.substr(at + 12));
        EXPECT_GE(static_cast<int64_t>(slots_for_rho(experts, ranks, suggested)) * ranks, experts)
            << message;
        // And it is the smallest such 4-decimal value.
        if (suggested >= 1e-4) {
          EXPECT_THROW(slots_for_rho(experts, ranks, suggested - 1e-4), Error) << message;
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST(ExpertLayout, DiffCountsIntraAndCrossNodeMoves) {
  auto from = small_layout();
  // New layout: rank 1 gains expert 1 (held on rank 0, same node: intra), rank 3 gains expert 2
  // (only on node 0: cross), rank 2 drops expert 0.
  ExpertLayout to(Topology(2, 4), 4, 2, {0, 1, 2, 1, 3, -1, 1, 2});
  auto d = diff(from, to);
  EXPECT_EQ(d.num_intra_node, 1);
  EXPECT_EQ(d.num_cross_node, 1);
  EXPECT_EQ(d.num_removed, 1);
  ASSERT_EQ(d.moves.size(), 2u);
  EXPECT_EQ(d.moves[0].expert, 1);
  EXPECT_EQ(d.moves[0].src_rank, 0);
  EXPECT_EQ(d.moves[0].dst_rank, 1);
  EXPECT_FALSE(d.moves[0].cross_node);
  EXPECT_EQ(d.moves[1].expert, 2);
  EXPECT_EQ(d.moves[1].src_rank, 1);
  EXPECT_TRUE(d.moves[1].cross_node);
  EXPECT_EQ(diff(from, from).moves.size(), 0u);
}

// diff counts a replica removed from rank 0 like any other.
TEST(ExpertLayout, DiffCountsARemovalOnRankZero) {
  const Topology topo(1, 2);
  const auto from = ExpertLayout::from_rank_lists(topo, 2, 2, {{0, 1}, {1}});
  const auto to = ExpertLayout::from_rank_lists(topo, 2, 2, {{0}, {1}});
  const auto d = diff(from, to);
  EXPECT_TRUE(d.moves.empty());
  EXPECT_EQ(d.num_removed, 1);
}

}  // namespace
}  // namespace cobalt
