#include "cobalt/assign/node_cover.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdlib>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <string>

#include "assign/node_cover_avx512.hpp"
#include "assign/set_cover.hpp"
#include "cobalt/assign/balanced_cover.hpp"
#include "cobalt/core/assignment.hpp"
#include "cobalt/core/environment.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"
#include "cobalt/eval/metrics.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::assign {
namespace {

// Brute force: smallest set of remote nodes covering the token's experts not on the source node.
int brute_force_cover(std::span<const ExpertId> experts, NodeId src, const ExpertLayout& layout) {
  const int num_nodes = layout.num_nodes();
  int best = num_nodes + 1;
  for (uint64_t b = 0; b < (uint64_t{1} << num_nodes); ++b) {
    if (b & (uint64_t{1} << src)) continue;
    bool ok = true;
    for (ExpertId e : experts) {
      const uint64_t m = layout.node_mask(e);
      if (m & (uint64_t{1} << src)) continue;
      ok = ok && (m & b) != 0;
    }
    if (ok) best = std::min(best, std::popcount(b));
  }
  return best;
}

struct Case {
  int nodes, per_node, experts, top_k, slots;
};

class NodeCoverProperty : public ::testing::TestWithParam<Case> {};

TEST_P(NodeCoverProperty, BothSearchesReachTheBruteForceMinimum) {
  const Case c = GetParam();
  Topology topo(c.nodes, c.nodes * c.per_node);
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    auto layout = testing::random_layout(seed, topo, c.experts, c.slots, 0.5);
    auto owned = testing::random_batch(seed * 7, 300, c.top_k, c.experts, topo.num_ranks(), 1.0);
    auto batch = owned.view();
    for (CoverSearch search : {CoverSearch::kMaskEnumeration, CoverSearch::kSubsetDp}) {
      std::vector<RankId> exec(batch.num_tasks());
      assign_node_cover(batch, layout, {seed, 3, 1, 0}, {search, 1}, exec);
      validate_assignment(batch, layout, exec);
      for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
        const NodeId src = topo.node_of(batch.source_of(t));
        const int expected = brute_force_cover(batch.experts_of(t), src, layout);
        // Remote nodes actually used by the assignment.
        std::set<NodeId> used;
        for (int k = 0; k < c.top_k; ++k) {
          const NodeId n = topo.node_of(exec[t * c.top_k + k]);
          const ExpertId e = batch.experts_of(t)[k];
          if (layout.node_mask(e) & (uint64_t{1} << src)) {
            EXPECT_EQ(n, src) << "local expert must run on the source node";
          }
          if (n != src) used.insert(n);
        }
        ASSERT_EQ(static_cast<int>(used.size()), expected) << "token " << t << " seed " << seed;
        EXPECT_EQ(min_remote_cover_size(batch.experts_of(t), src, layout), expected);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, NodeCoverProperty,
                         ::testing::Values(Case{2, 2, 8, 2, 3}, Case{4, 2, 16, 4, 3},
                                           Case{4, 8, 64, 8, 3}, Case{6, 2, 24, 6, 2},
                                           Case{8, 1, 32, 8, 6}, Case{10, 2, 40, 8, 3}));

TEST(NodeCover, FastPathMatchesTheSimpleReferenceBitForBit) {
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SplitMix64 rng(seed);
    const int nodes = 1 + static_cast<int>(rng.below(8)),
              per_node = 1 + static_cast<int>(rng.below(4));
    const int top_k = 1 + static_cast<int>(rng.below(8));
    Topology topo(nodes, nodes * per_node);
    const int experts = std::max(top_k + 1, 4 * topo.num_ranks());
    const int slots = 4 + static_cast<int>(rng.below(4));
    auto layout = testing::random_layout(seed, topo, experts, slots, rng.unit());
    auto owned = testing::random_batch(seed * 13, 2000, top_k, experts, topo.num_ranks(), 1.0);
    auto batch = owned.view();
    std::vector<RankId> fast(batch.num_tasks()), ref(batch.num_tasks());
    const AssignKey key{seed, 5, 2, 100};
    assign_node_cover(batch, layout, key, {CoverSearch::kMaskEnumeration, 2}, fast);
    assign_node_cover_reference(batch, layout, key, ref);
    ASSERT_EQ(fast, ref) << "seed " << seed << " nodes " << nodes;
  }
}

// Every node count of the bitset search (N <= 8: one to four 64-bit words of masks) and of the
// plain enumeration above it, sparse layouts (multi-node covers are common), K up to 16.
TEST(NodeCover, MaskSearchMatchesTheReferenceForEveryNodeCount) {
  for (int nodes = 1; nodes <= 11; ++nodes) {
    for (int top_k : {1, 3, 8, 16}) {
      const Topology topo(nodes, nodes * 2);
      const int experts = std::max(top_k + 1, 3 * topo.num_ranks());
      const int slots = (experts + topo.num_ranks() - 1) / topo.num_ranks() + 1;
      auto layout = testing::random_layout(nodes * 7 + top_k, topo, experts, slots, 0.3);
      auto owned =
          testing::random_batch(nodes * 31 + top_k, 600, top_k, experts, topo.num_ranks(), 0.5);
      auto batch = owned.view();
      std::vector<RankId> fast(batch.num_tasks()), ref(batch.num_tasks());
      const AssignKey key{static_cast<uint64_t>(nodes), 1, 0, 3};
      assign_node_cover(batch, layout, key, {CoverSearch::kMaskEnumeration, 1}, fast);
      assign_node_cover_reference(batch, layout, key, ref);
      ASSERT_EQ(fast, ref) << "nodes " << nodes << " K " << top_k;
      // The covers alone (cobalt+'s balanced assignment uses them): by brute force, the remote
      // node sets with the fewest nodes in value order, and the one the key's draw picks.
      std::vector<uint64_t> covers(batch.num_tokens());
      remote_node_covers(batch, layout, key, {CoverSearch::kMaskEnumeration, 1}, covers);
      const uint64_t prefix = counter_prefix(key.seed, key.step, key.layer);
      for (int64_t t = 0; t < batch.num_tokens(); ++t) {
        const uint64_t src_bit = uint64_t{1} << topo.node_of(batch.source_of(t));
        std::vector<uint64_t> minimum;
        int best_size = nodes + 1;
        for (uint64_t b = 0; b < (uint64_t{1} << nodes); ++b) {
          if (b & src_bit) continue;
          bool feasible = true;
          for (ExpertId e : batch.experts_of(t)) {
            const uint64_t m = layout.node_mask(e);
            feasible = feasible && ((m & src_bit) || (m & b));
          }
          if (!feasible || std::popcount(b) > best_size) continue;
          if (std::popcount(b) < best_size) minimum.clear();
          best_size = std::popcount(b);
          minimum.push_back(b);
        }
        const uint64_t token_h = token_hash(prefix, static_cast<uint64_t>(key.token_offset + t));
        const uint64_t best = minimum[uniform_below(cover_hash_from_token(token_h),
                                                    static_cast<uint32_t>(minimum.size()))];
        ASSERT_EQ(covers[t], best) << "nodes " << nodes << " K " << top_k << " token " << t;
      }
    }
  }
}

// The AVX-512 kernel (one token's tasks per register) against the reference and the portable loop
// for every node count and K it takes, dense and sparse layouts, several replicas per (expert,
// node), token counters past 2^32. Skipped where the CPU has no AVX-512.
TEST(NodeCover, Avx512KernelMatchesTheReferenceBitForBit) {
  if (!avx512_kernel_available()) GTEST_SKIP() << "this CPU has no AVX-512 F/DQ/VL/BW";
  for (int nodes = 1; nodes <= 8; ++nodes) {
    for (int top_k = 1; top_k <= 8; ++top_k) {
      for (double fill : {0.2, 0.9}) {
        const uint64_t seed = static_cast<uint64_t>(nodes * 100 + top_k * 10) + (fill > 0.5);
        SplitMix64 rng(seed);
        const int per_node = 1 + static_cast<int>(rng.below(4));
        const Topology topo(nodes, nodes * per_node);
        const int experts = std::max(top_k + 1, 2 * topo.num_ranks());
        const int slots = (experts + topo.num_ranks() - 1) / topo.num_ranks() + 1 +
                          static_cast<int>(rng.below(4));
        auto layout = testing::random_layout(seed, topo, experts, slots, fill);
        auto owned = testing::random_batch(seed * 3, 700, top_k, experts, topo.num_ranks(), 0.8);
        auto batch = owned.view();
        // A canary tail past the output: a store beyond the K lanes of the last token shows.
        constexpr RankId kCanary = -77;
        std::vector<RankId> avx_with_tail(batch.num_tasks() + 8, kCanary);
        std::vector<RankId> portable(batch.num_tasks()), ref(batch.num_tasks());
        const AssignKey key{seed, 9, 3, int64_t{5} << 32};
        assign_node_cover(batch, layout, key,
                          {CoverSearch::kMaskEnumeration, 1, CpuKernel::kAvx512},
                          std::span(avx_with_tail).first(batch.num_tasks()));
        const std::vector<RankId> avx(avx_with_tail.begin(),
                                      avx_with_tail.begin() + batch.num_tasks());
        ASSERT_EQ(
            std::count(avx_with_tail.begin() + batch.num_tasks(), avx_with_tail.end(), kCanary), 8)
            << "nodes " << nodes << " K " << top_k;
        assign_node_cover(batch, layout, key,
                          {CoverSearch::kMaskEnumeration, 1, CpuKernel::kPortable}, portable);
        assign_node_cover_reference(batch, layout, key, ref);
        ASSERT_EQ(avx, ref) << "nodes " << nodes << " K " << top_k << " fill " << fill;
        ASSERT_EQ(portable, ref) << "nodes " << nodes << " K " << top_k << " fill " << fill;
      }
    }
  }
}

// The kernel's multiply-shift draw against uniform_below (rng.hpp), on hashes chosen so that the
// low half's product carries into the high half's (hi * n mod 2^32 + floor(lo * n / 2^32) >=
// 2^32), which random draws reach with probability about n / 2^33: a kernel that dropped the low
// half's product would pass the bit-for-bit tests above almost surely.
TEST(NodeCover, Avx512DrawEqualsUniformBelowWhereTheLowHalfCarries) {
  if (!avx512_kernel_available()) GTEST_SKIP() << "this CPU has no AVX-512 F/DQ/VL/BW";
  SplitMix64 rng(4242);
  int num_carries = 0;
  for (int round = 0; round < 2000; ++round) {
    std::array<uint64_t, 8> hash{}, n{}, out{};
    for (int lane = 0; lane < 8; ++lane) {
      // n from 1 to 2^32 - 1, small ones too; hi drawn until the carry is possible, lo high.
      n[lane] = lane % 4 == 0 ? 1 + rng.below(1000) : 1 + (rng.next() >> 33) + (rng.next() >> 33);
      n[lane] = std::min<uint64_t>(n[lane], 0xffffffffu);
      uint64_t hi = rng.next() >> 32;
      for (int tries = 0;
           tries < 64 && (hi * n[lane]) % (uint64_t{1} << 32) <= (uint64_t{1} << 32) - n[lane];
           ++tries) {
        hi = rng.next() >> 32;
      }
      const uint64_t lo = 0xffffffffu - (rng.next() >> 40);
      hash[lane] = hi << 32 | lo;
      const uint64_t high_rest = (hi * n[lane]) % (uint64_t{1} << 32);
      num_carries += high_rest + ((lo * n[lane]) >> 32) >= (uint64_t{1} << 32);
    }
    assign::detail::uniform_below_avx512(hash.data(), n.data(), out.data());
    for (int lane = 0; lane < 8; ++lane) {
      ASSERT_EQ(out[lane], uniform_below(hash[lane], static_cast<uint32_t>(n[lane])))
          << "hash " << hash[lane] << " n " << n[lane];
    }
  }
  EXPECT_GT(num_carries, 1000);
}

// kAuto is the kernel where it applies: identical output for any thread count (chunks starting
// mid-batch), K below the lane count, and expert ids far above the other tests' (E = 20000).
TEST(NodeCover, KernelsAgreeForAnyThreadCount) {
  Topology topo(4, 32);
  for (int top_k : {3, 8}) {
    for (int experts : {128, 20000}) {
      auto layout =
          testing::random_layout(17 + top_k, topo, experts, experts / topo.num_ranks() + 2, 0.6);
      auto owned =
          testing::random_batch(23 + experts, 40000, top_k, experts, topo.num_ranks(), 1.2);
      auto batch = owned.view();
      std::vector<RankId> portable(batch.num_tasks()), automatic(batch.num_tasks());
      assign_node_cover(batch, layout, {7, 1, 0, 11}, {CoverSearch::kAuto, 1, CpuKernel::kPortable},
                        portable);
      assign_node_cover(batch, layout, {7, 1, 0, 11}, {CoverSearch::kAuto, 3, CpuKernel::kAuto},
                        automatic);
      EXPECT_EQ(portable, automatic) << "K " << top_k << " E " << experts;
    }
  }
}

// kAuto picks the kernel exactly where the CPU has what it needs (a wrong detection would skip
// the kernel's tests silently).
TEST(NodeCover, ResolvesTheKernelTheCpuRuns) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool cpu_has_it = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
  EXPECT_EQ(avx512_kernel_available(), cpu_has_it);
#endif
  const CpuKernel expected = avx512_kernel_available() ? CpuKernel::kAvx512 : CpuKernel::kPortable;
  EXPECT_EQ(resolve_kernel({}, 4, 8), expected);
  EXPECT_EQ(resolve_kernel({}, 8, 1), expected);
  EXPECT_EQ(resolve_kernel({}, 9, 8), expected);  // the subset search's byte-lane set list
  EXPECT_EQ(resolve_kernel({}, 64, 8), expected);
  EXPECT_EQ(resolve_kernel({}, 4, 9), CpuKernel::kPortable);  // more tasks than lanes
  EXPECT_EQ(resolve_kernel({}, 16, 9), CpuKernel::kPortable);
  EXPECT_EQ(resolve_kernel({CoverSearch::kSubsetDp, 1, CpuKernel::kAuto}, 4, 8), expected);
  // No mask table above 8 nodes.
  EXPECT_EQ(resolve_kernel({CoverSearch::kMaskEnumeration, 1, CpuKernel::kAuto}, 9, 8),
            CpuKernel::kPortable);
  EXPECT_EQ(resolve_kernel({CoverSearch::kAuto, 1, CpuKernel::kPortable}, 4, 8),
            CpuKernel::kPortable);
  EXPECT_THROW(resolve_kernel({}, 0, 8), Error);
  EXPECT_THROW(resolve_kernel({}, 4, 0), Error);
  EXPECT_THROW(resolve_kernel({}, 4, 17), Error);
}

// COBALT_CPU_KERNEL=portable turns kAuto's kernel off; explicit choices ignore it; a value that
// names no choice is an error naming it. The library reads it when it loads and on
// reload_environment() only (never on its worker threads), so a change needs a reload.
TEST(NodeCover, EnvironmentCanKeepAutoOnThePortableLoop) {
  const CpuKernel detected = avx512_kernel_available() ? CpuKernel::kAvx512 : CpuKernel::kPortable;
  struct Unset {  // the other tests in this process see no override, whatever happens here
    ~Unset() {
      ::unsetenv("COBALT_CPU_KERNEL");
      reload_environment();
    }
  } unset_at_exit;
  const CpuKernel before = resolve_kernel({}, 4, 8);
  ASSERT_EQ(::setenv("COBALT_CPU_KERNEL", "portable", 1), 0);
  EXPECT_EQ(resolve_kernel({}, 4, 8), before) << "read without a reload";
  reload_environment();
  EXPECT_EQ(resolve_kernel({}, 4, 8), CpuKernel::kPortable);
  EXPECT_EQ(resolve_kernel({}, 16, 8), CpuKernel::kPortable);  // the subset search's set list
  EXPECT_EQ(resolve_kernel({CoverSearch::kAuto, 1, CpuKernel::kPortable}, 4, 8),
            CpuKernel::kPortable);
  if (avx512_kernel_available()) {
    EXPECT_EQ(resolve_kernel({CoverSearch::kAuto, 1, CpuKernel::kAvx512}, 4, 8),
              CpuKernel::kAvx512);
  }
  ASSERT_EQ(::setenv("COBALT_CPU_KERNEL", "auto", 1), 0);
  reload_environment();
  EXPECT_EQ(resolve_kernel({}, 4, 8), detected);
  ASSERT_EQ(::setenv("COBALT_CPU_KERNEL", "avx2", 1), 0);
  reload_environment();
  try {
    resolve_kernel({}, 4, 8);
    ADD_FAILURE() << "no error for COBALT_CPU_KERNEL=avx2";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("COBALT_CPU_KERNEL=avx2"), std::string::npos);
  }
  ASSERT_EQ(::unsetenv("COBALT_CPU_KERNEL"), 0);
  reload_environment();
  EXPECT_EQ(resolve_kernel({}, 4, 8), detected);
}

TEST(NodeCover, ExplicitAvx512KernelRejectsWhatItCannotRun) {
  auto code_of = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::optional<ErrorCode>(e.code());
    }
    return std::optional<ErrorCode>();
  };
  const AssignOptions avx512{CoverSearch::kAuto, 1, CpuKernel::kAvx512};
  // K = 9: more tasks than lanes.
  {
    Topology topo(2, 4);
    auto layout = testing::random_layout(1, topo, 16, 6, 0.5);
    auto owned = testing::random_batch(2, 10, 9, 16, 4);
    std::vector<RankId> exec(owned.view().num_tasks());
    EXPECT_EQ(code_of([&] { assign_node_cover(owned.view(), layout, {}, avx512, exec); }),
              ErrorCode::kInvalidArgument);
    EXPECT_NO_THROW(assign_node_cover(owned.view(), layout, {}, {}, exec));
  }
  // N = 9 with the mask enumeration: no mask table above 8 nodes.
  {
    Topology topo(9, 9);
    auto layout = testing::random_layout(3, topo, 27, 4, 0.5);
    auto owned = testing::random_batch(4, 10, 4, 27, 9);
    std::vector<RankId> exec(owned.view().num_tasks());
    EXPECT_EQ(code_of([&] {
                assign_node_cover(owned.view(), layout, {},
                                  {CoverSearch::kMaskEnumeration, 1, CpuKernel::kAvx512}, exec);
              }),
              ErrorCode::kInvalidArgument);
  }
  // Shapes it takes (the mask table on 2 nodes, the subset search on 2 and 9): run where the CPU
  // has AVX-512, else a failed precondition.
  for (const auto& [nodes, search] :
       {std::pair{2, CoverSearch::kAuto}, std::pair{2, CoverSearch::kSubsetDp},
        std::pair{9, CoverSearch::kAuto}}) {
    Topology topo(nodes, 2 * nodes);
    auto layout = testing::random_layout(5, topo, 16, 6, 0.5);
    auto owned = testing::random_batch(6, 10, 4, 16, topo.num_ranks());
    std::vector<RankId> exec(owned.view().num_tasks());
    const auto code = code_of([&] {
      assign_node_cover(owned.view(), layout, {}, {search, 1, CpuKernel::kAvx512}, exec);
    });
    if (avx512_kernel_available()) {
      EXPECT_FALSE(code.has_value()) << "N " << nodes;
    } else {
      EXPECT_EQ(code, ErrorCode::kFailedPrecondition) << "N " << nodes;
    }
  }
}

// The subset search with the byte-lane set list (kAvx512) against the portable list: the same
// ranks and the same covers, bit for bit, for node counts up to 64, K up to the lane count (all
// experts uncovered and partly covered), sparse and dense layouts. Skipped without AVX-512.
TEST(NodeCover, SubsetSearchKernelsAgreeBitForBit) {
  if (!avx512_kernel_available()) GTEST_SKIP() << "this CPU has no AVX-512 F/DQ/VL/BW";
  int num_multi_node_covers = 0;
  for (int nodes : {2, 5, 8, 9, 16, 23, 33, 64}) {
    for (int top_k = 1; top_k <= 8; ++top_k) {
      for (double fill : {0.1, 0.7}) {
        const uint64_t seed = static_cast<uint64_t>(nodes * 1000 + top_k * 10) + (fill > 0.5);
        SplitMix64 rng(seed);
        const int per_node = 1 + static_cast<int>(rng.below(3));
        const Topology topo(nodes, nodes * per_node);
        const int experts = std::max(top_k + 1, 3 * topo.num_ranks() / 2);
        const int slots =
            (experts + topo.num_ranks() - 1) / topo.num_ranks() + static_cast<int>(rng.below(3));
        auto layout = testing::random_layout(seed, topo, experts, slots, fill);
        auto owned = testing::random_batch(seed * 7, 600, top_k, experts, topo.num_ranks(), 0.9);
        auto batch = owned.view();
        const AssignKey key{seed, 3, 1, int64_t{3} << 32};
        const AssignOptions avx512{CoverSearch::kSubsetDp, 1, CpuKernel::kAvx512};
        const AssignOptions portable{CoverSearch::kSubsetDp, 1, CpuKernel::kPortable};
        std::vector<RankId> exec_avx(batch.num_tasks()), exec_portable(batch.num_tasks());
        assign_node_cover(batch, layout, key, avx512, exec_avx);
        assign_node_cover(batch, layout, key, portable, exec_portable);
        ASSERT_EQ(exec_avx, exec_portable) << "N " << nodes << " K " << top_k << " fill " << fill;
        std::vector<uint64_t> covers_avx(batch.num_tokens()), covers_portable(batch.num_tokens());
        remote_node_covers(batch, layout, {}, avx512, covers_avx);
        remote_node_covers(batch, layout, {}, portable, covers_portable);
        ASSERT_EQ(covers_avx, covers_portable) << "N " << nodes << " K " << top_k;
        for (uint64_t c : covers_avx) num_multi_node_covers += std::popcount(c) >= 2;
      }
    }
  }
  EXPECT_GT(num_multi_node_covers, 5000);  // the combination search runs, not only single covers
}

TEST(NodeCover, IdenticalForAnyThreadCountAndTokenSubset) {
  Topology topo(4, 16);
  auto layout = testing::random_layout(11, topo, 64, 6, 0.6);
  auto owned = testing::random_batch(5, 50000, 8, 64, topo.num_ranks(), 1.0);
  auto batch = owned.view();
  std::vector<RankId> one(batch.num_tasks()), many(batch.num_tasks());
  assign_node_cover(batch, layout, {42, 7, 2, 0}, {CoverSearch::kAuto, 1}, one);
  assign_node_cover(batch, layout, {42, 7, 2, 0}, {CoverSearch::kAuto, 4}, many);
  EXPECT_EQ(one, many);
  // A suffix processed alone, with its token offset, reproduces the same ranks.
  auto tail = batch.slice(30000, 50000);
  std::vector<RankId> part(tail.num_tasks());
  assign_node_cover(tail, layout, {42, 7, 2, 30000}, {CoverSearch::kAuto, 1}, part);
  EXPECT_TRUE(std::equal(part.begin(), part.end(), one.begin() + 30000 * 8));
  // Another seed changes some choices.
  std::vector<RankId> other(batch.num_tasks());
  assign_node_cover(batch, layout, {43, 7, 2, 0}, {CoverSearch::kAuto, 1}, other);
  EXPECT_NE(one, other);
  // 0 threads is one per core (the same ranks); a negative count is an error, for both
  // assignments, not a silent "every core".
  std::vector<RankId> every_core(batch.num_tasks());
  assign_node_cover(batch, layout, {42, 7, 2, 0}, {CoverSearch::kAuto, 0}, every_core);
  EXPECT_EQ(one, every_core);
  try {
    assign_node_cover(batch, layout, {42, 7, 2, 0}, {CoverSearch::kAuto, -1}, other);
    FAIL() << "a negative thread count was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("threads -1 must be >= 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(assign_balanced_cover(batch, layout, {}, {CoverSearch::kAuto, -2}, other), Error);
}

// remote_node_covers checks what assign_node_cover checks: the mask search above 20 nodes (2^N
// masks) and a layout of another E or G are errors, not an allocation or an out-of-bounds read.
TEST(NodeCover, CoversRejectWhatTheAssignmentRejects) {
  const Topology topo(24, 24);
  auto layout = testing::random_layout(8, topo, 48, 3, 0.5);
  auto owned = testing::random_batch(9, 20, 4, 48, 24);
  std::vector<uint64_t> covers(owned.view().num_tokens());
  std::vector<RankId> exec(owned.view().num_tasks());
  const AssignOptions masks{CoverSearch::kMaskEnumeration, 1};
  EXPECT_THROW(remote_node_covers(owned.view(), layout, {}, masks, covers), Error);
  EXPECT_THROW(assign_node_cover(owned.view(), layout, {}, masks, exec), Error);
  EXPECT_NO_THROW(remote_node_covers(owned.view(), layout, {}, {}, covers));
  auto wider = testing::random_batch(9, 20, 4, 96, 24);  // E = 96 against the layout's 48
  std::vector<uint64_t> wider_covers(wider.view().num_tokens());
  try {
    remote_node_covers(wider.view(), layout, {}, {}, wider_covers);
    ADD_FAILURE() << "no error for a batch of E = 96 on a layout of E = 48";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("E=48"), std::string::npos) << e.what();
  }
  // Negative threads are an error here as in the assignment (they ran one per core).
  EXPECT_THROW(remote_node_covers(owned.view(), layout, {}, {CoverSearch::kAuto, -1}, covers),
               Error);
}

// min_remote_cover_size checks its ids (an expert of 100000 read past the layout: a crash; -5
// gave 0; a source node beyond N shifted past 64 bits).
TEST(NodeCover, CoverSizeRejectsIdsOutOfRange) {
  const auto layout = ExpertLayout::static_ep(Topology(2, 4), 8, 2);
  const std::vector<ExpertId> fine{0, 7}, huge{0, 100000}, negative{-5};
  EXPECT_EQ(min_remote_cover_size(fine, 0, layout), 1);
  for (const auto& [experts, node] :
       {std::pair{huge, 0}, std::pair{negative, 0}, std::pair{fine, 70}, std::pair{fine, -1}}) {
    try {
      min_remote_cover_size(experts, node, layout);
      ADD_FAILURE() << "accepted expert " << experts.back() << " on node " << node;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("out of range [0, "), std::string::npos) << e.what();
    }
  }
}

TEST(NodeCover, ScalesToSixtyFourNodes) {
  Topology topo(64, 512);
  auto layout = testing::random_layout(3, topo, 1024, 3, 0.5);
  auto owned = testing::random_batch(9, 2000, 8, 1024, topo.num_ranks(), 0.5);
  auto batch = owned.view();
  std::vector<RankId> exec(batch.num_tasks());
  assign_node_cover(batch, layout, {1, 0, 0, 0}, {CoverSearch::kAuto, 2}, exec);
  validate_assignment(batch, layout, exec);
  int64_t expected = 0;
  for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
    expected +=
        min_remote_cover_size(batch.experts_of(t), topo.node_of(batch.source_of(t)), layout);
  }
  EXPECT_EQ(eval::cross_node_transfers(batch, exec, topo).dedup, expected);
  EXPECT_THROW(assign_node_cover(batch, layout, {}, {CoverSearch::kMaskEnumeration, 1}, exec),
               Error);
}

// Ties between minimum covers are drawn uniformly (the paper leaves them open; the first in value
// order sent them all to the lowest node ids). Single-node ties: expert 0 on nodes 1, 2 and 3;
// two-node ties: expert 0 on nodes {1, 2}, expert 1 on {3, 4} (four covers). Every search and
// kernel, on a node count of the bitset table (5) and of the plain enumeration (10).
TEST(NodeCover, TiedMinimumCoversAreDrawnUniformly) {
  for (int nodes : {5, 10}) {
    const Topology topo(nodes, 2 * nodes);
    std::vector<std::vector<ExpertId>> lists(topo.num_ranks());
    for (int n : {1, 2}) lists[2 * n].push_back(0);
    for (int n : {3, 4}) lists[2 * n].push_back(1);
    lists[2 * 3 + 1].push_back(0);  // node 3 holds expert 0 too (the single-node ties)
    for (auto& list : lists) {
      if (list.empty()) list.push_back(2);
    }
    const auto layout = ExpertLayout::from_rank_lists(topo, 3, 1, lists);
    constexpr int kTokens = 24000;
    // Tokens from node 0 choosing expert 0 alone: three single-node covers {1}, {2}, {3}.
    std::vector<ExpertId> single_ids(kTokens, 0);
    std::vector<RankId> src(kTokens, 0);
    const RoutingBatch single(single_ids, src, 1, 3, topo.num_ranks());
    // Tokens choosing experts 0 and 1 where no node holds both: a second layout without rank 7's
    // replica of expert 0 (expert 0 on nodes {1, 2}, expert 1 on {3, 4}: four two-node covers).
    auto pair_lists = lists;
    pair_lists[7] = {2};
    const auto pair_layout = ExpertLayout::from_rank_lists(topo, 3, 1, pair_lists);
    std::vector<ExpertId> pair_ids;
    for (int t = 0; t < kTokens; ++t) pair_ids.insert(pair_ids.end(), {0, 1});
    const RoutingBatch pairs(pair_ids, src, 2, 3, topo.num_ranks());
    std::vector<AssignOptions> options = {{CoverSearch::kMaskEnumeration, 1},
                                          {CoverSearch::kSubsetDp, 1},
                                          {CoverSearch::kAuto, 2, CpuKernel::kPortable}};
    if (avx512_kernel_available()) options.push_back({CoverSearch::kAuto, 1, CpuKernel::kAvx512});
    for (const AssignOptions& option : options) {
      std::vector<uint64_t> covers(kTokens);
      remote_node_covers(single, layout, {5, 2, 1, 0}, option, covers);
      std::map<uint64_t, int> count;
      for (uint64_t c : covers) ++count[c];
      ASSERT_EQ(count.size(), 3u) << nodes << " nodes";
      for (uint64_t c : {0b10u, 0b100u, 0b1000u}) {
        EXPECT_NEAR(count[c], kTokens / 3, kTokens / 30) << nodes << " nodes, cover " << c;
      }
      // The subset search draws single-node ties only (docs: its own order above that).
      if (option.search == CoverSearch::kSubsetDp ||
          (option.search == CoverSearch::kAuto && nodes > 8)) {
        continue;
      }
      remote_node_covers(pairs, pair_layout, {5, 2, 1, 0}, option, covers);
      count.clear();
      for (uint64_t c : covers) ++count[c];
      ASSERT_EQ(count.size(), 4u) << nodes << " nodes";
      for (uint64_t c : {0b01010u, 0b10010u, 0b01100u, 0b10100u}) {
        EXPECT_NEAR(count[c], kTokens / 4, kTokens / 40) << nodes << " nodes, cover " << c;
      }
      // Both assignments follow these covers (the same key): every task on a node of its
      // token's cover.
      std::vector<RankId> exec(pairs.num_tasks()), balanced(pairs.num_tasks());
      assign_node_cover(pairs, pair_layout, {5, 2, 1, 0}, option, exec);
      assign_balanced_cover(pairs, pair_layout, {5, 2, 1, 0}, option, balanced);
      for (int64_t t = 0; t < kTokens; ++t) {
        for (int k = 0; k < 2; ++k) {
          ASSERT_TRUE((covers[t] >> topo.node_of(exec[2 * t + k])) & 1) << t;
          ASSERT_TRUE((covers[t] >> topo.node_of(balanced[2 * t + k])) & 1) << t;
        }
      }
    }
  }
}

// The subset search favours no node: on a layout symmetric under a rotation of the node ids (expert
// e on nodes e and e + 5 mod 12), with sources on every node, every node is in nearly the same
// share of the covers. The same search on the original ids (detail::min_node_cover, the lowest
// ids first, what the subset search did before session 34) is not.
TEST(NodeCover, SubsetSearchFavoursNoNode) {
  constexpr int kNodes = 12, kTokens = 24000, kTopK = 4;
  const Topology topo(kNodes, kNodes);
  std::vector<std::vector<ExpertId>> lists(kNodes);
  for (int e = 0; e < kNodes; ++e) {
    lists[e].push_back(e);
    lists[(e + 5) % kNodes].push_back(e);
  }
  const auto layout = ExpertLayout::from_rank_lists(topo, kNodes, 2, lists);
  SplitMix64 rng(11);
  std::vector<ExpertId> ids;
  std::vector<RankId> src(kTokens);
  for (int t = 0; t < kTokens; ++t) {
    std::vector<ExpertId> row;
    while (static_cast<int>(row.size()) < kTopK) {
      const auto e = static_cast<ExpertId>(rng.below(kNodes));
      if (std::find(row.begin(), row.end(), e) == row.end()) row.push_back(e);
    }
    ids.insert(ids.end(), row.begin(), row.end());
    src[t] = static_cast<RankId>(rng.below(kNodes));
  }
  const RoutingBatch batch(ids, src, kTopK, kNodes, kNodes);
  std::vector<uint64_t> covers(kTokens);
  remote_node_covers(batch, layout, {3, 1, 0, 0}, {CoverSearch::kSubsetDp, 1}, covers);
  std::vector<int64_t> share(kNodes, 0), lowest_first_share(kNodes, 0);
  detail::SetCoverScratch scratch;
  for (int t = 0; t < kTokens; ++t) {
    const uint64_t src_bit = uint64_t{1} << src[t];
    std::array<uint32_t, kMaxNodes> sets{};
    uint64_t candidates = 0;
    int num_uncovered = 0;
    for (ExpertId e : batch.experts_of(t)) {
      if (layout.node_mask(e) & src_bit) continue;
      for (uint64_t m = layout.node_mask(e); m; m &= m - 1) {
        sets[std::countr_zero(m)] |= uint32_t{1} << num_uncovered;
      }
      candidates |= layout.node_mask(e);
      ++num_uncovered;
    }
    const uint64_t lowest_first =
        num_uncovered == 0
            ? 0
            : detail::min_node_cover((uint32_t{1} << num_uncovered) - 1, sets, candidates, scratch);
    ASSERT_EQ(std::popcount(covers[t]), std::popcount(lowest_first)) << t;
    for (int n = 0; n < kNodes; ++n) {
      share[n] += (covers[t] >> n) & 1;
      lowest_first_share[n] += (lowest_first >> n) & 1;
    }
  }
  const auto spread = [](const std::vector<int64_t>& v) {
    const double mean = static_cast<double>(std::accumulate(v.begin(), v.end(), int64_t{0})) /
                        static_cast<double>(v.size());
    return static_cast<double>(*std::max_element(v.begin(), v.end())) / mean;
  };
  EXPECT_LT(spread(share), 1.05);
  EXPECT_GT(spread(lowest_first_share), 1.15);  // what the relabelling removes
}

TEST(NodeCover, UniformWithinNode) {
  // One expert with 4 replicas on node 1 (ranks 4..7); tokens from node 0 spread evenly over them.
  Topology topo(2, 8);
  std::vector<std::vector<ExpertId>> lists(8);
  lists[0] = {1};
  for (int r = 4; r < 8; ++r) lists[r] = {0};
  auto layout = ExpertLayout::from_rank_lists(topo, 2, 1, lists);
  std::vector<ExpertId> ids(40000, 0);
  std::vector<RankId> src(40000, 0);
  RoutingBatch batch(ids, src, 1, 2, 8);
  std::vector<RankId> exec(batch.num_tasks());
  assign_node_cover(batch, layout, {0, 0, 0, 0}, {}, exec);
  auto loads = eval::rank_loads(exec, 8);
  for (int r = 4; r < 8; ++r) EXPECT_NEAR(loads[r], 10000, 400) << r;
}

}  // namespace
}  // namespace cobalt::assign
