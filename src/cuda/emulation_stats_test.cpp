// Host emulation of the routing-statistics kernels (src/cuda/routing_stats.cu): the count pass of
// every block and warp and the finalize grid run sequentially (detail/stats_body.hpp under
// HostWarp), for each method and register-row width the launcher can pick, against
// cobalt::count_routing. Like emulation_test.cpp it checks the algorithm (keys, warp aggregation,
// partials, mirroring), not shared-memory sizing or atomics.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "check_inputs.hpp"
#include "cobalt/stats/routing_stats.hpp"
#include "detail/stats_body.hpp"

namespace cobalt::cuda {
namespace {

using detail::HostWarp;

constexpr int kThreads = 1024;  // routing_stats.cu's block size

enum class Variant { kSharedAggregated, kSharedPlain, kGlobalAggregated };

struct Counts {
  std::vector<int64_t> loads, coactivation;
};

// Every warp of every block over its grid-stride chunks, as count_kernel does.
template <int kMaxK, bool kAggregate, typename Counter>
void emulate_count_blocks(const check::Batch& b, int num_blocks, bool private_per_block,
                          std::vector<Counter>& counters) {
  const int64_t entries = detail::stats_num_counters(b.num_experts);
  const HostWarp warp;
  for (int block = 0; block < num_blocks; ++block) {
    Counter* mine = counters.data() + (private_per_block ? block * entries : 0);
    for (int64_t chunk = static_cast<int64_t>(block) * kThreads; chunk < b.num_tokens();
         chunk += static_cast<int64_t>(num_blocks) * kThreads) {
      for (int64_t base = chunk; base < chunk + kThreads && base < b.num_tokens(); base += 32) {
        detail::stats_count_warp<kMaxK, kAggregate>(warp, b.ids.data(), base, b.num_tokens(),
                                                    b.top_k, b.num_experts, mine);
      }
    }
  }
}

template <int kMaxK>
Counts emulate_counts_k(const check::Batch& b, Variant variant, int num_blocks) {
  const int num_experts = b.num_experts;
  const int64_t entries = detail::stats_num_counters(num_experts);
  Counts out;
  // Poisoned outputs: every element must be written by the finalize grid.
  out.loads.assign(num_experts, -5);
  out.coactivation.assign(static_cast<size_t>(num_experts) * num_experts, -5);
  std::vector<uint32_t> partials;
  std::vector<unsigned long long> global;
  if (variant == Variant::kGlobalAggregated) {
    global.assign(entries, 0);
    emulate_count_blocks<kMaxK, true>(b, num_blocks, false, global);
  } else {
    partials.assign(static_cast<size_t>(num_blocks) * entries, 0);
    if (variant == Variant::kSharedAggregated) {
      emulate_count_blocks<kMaxK, true>(b, num_blocks, true, partials);
    } else {
      emulate_count_blocks<kMaxK, false>(b, num_blocks, true, partials);
    }
  }
  for (int y = 0; y <= num_experts; ++y) {
    for (int c = 0; c < num_experts; ++c) {
      detail::stats_finalize_entry(
          y, c, num_experts, num_blocks, partials.empty() ? nullptr : partials.data(),
          global.empty() ? nullptr : global.data(), out.loads.data(), out.coactivation.data());
    }
  }
  return out;
}

// The launcher's choice of register-row width for K (routing_stats.cu, select_kernel).
Counts emulate_counts(const check::Batch& b, Variant variant, int num_blocks) {
  if (b.top_k <= 2) return emulate_counts_k<2>(b, variant, num_blocks);
  if (b.top_k <= 4) return emulate_counts_k<4>(b, variant, num_blocks);
  if (b.top_k <= 8) return emulate_counts_k<8>(b, variant, num_blocks);
  if (b.top_k <= 16) return emulate_counts_k<16>(b, variant, num_blocks);
  return emulate_counts_k<0>(b, variant, num_blocks);
}

Counts cpu_counts(const check::Batch& b) {
  Counts out;
  out.loads.resize(b.num_experts);
  out.coactivation.resize(static_cast<size_t>(b.num_experts) * b.num_experts);
  count_routing(b.view(), out.loads, out.coactivation, 1);
  return out;
}

void expect_counts_equal(const check::Batch& b, const std::string& what) {
  const Counts cpu = cpu_counts(b);
  for (Variant v :
       {Variant::kSharedAggregated, Variant::kSharedPlain, Variant::kGlobalAggregated}) {
    for (int blocks : {1, 3}) {
      const Counts emu = emulate_counts(b, v, blocks);
      EXPECT_EQ(emu.loads, cpu.loads)
          << what << " variant " << static_cast<int>(v) << " blocks " << blocks;
      EXPECT_EQ(emu.coactivation, cpu.coactivation)
          << what << " variant " << static_cast<int>(v) << " blocks " << blocks;
    }
  }
}

struct StatsCase {
  int64_t tokens;
  int top_k, experts;
  double skew;
};

class StatsEmulation : public ::testing::TestWithParam<StatsCase> {};

TEST_P(StatsEmulation, MatchesTheCpuCounts) {
  const StatsCase c = GetParam();
  for (uint64_t seed : {1, 2}) {
    const auto b = check::random_batch(seed, c.tokens, c.top_k, c.experts, 8, c.skew);
    expect_counts_equal(b, "T=" + std::to_string(c.tokens) + " K=" + std::to_string(c.top_k) +
                               " E=" + std::to_string(c.experts));
  }
}

// Every register-row width (2, 4, 8, 16, any), partial warps and blocks (T not a multiple of 32 or
// 1024), skew that puts whole warps on one key (the aggregation path), E = K.
INSTANTIATE_TEST_SUITE_P(Shapes, StatsEmulation,
                         ::testing::Values(StatsCase{1, 1, 4, 0}, StatsCase{31, 2, 8, 0},
                                           StatsCase{1000, 3, 16, 4.0}, StatsCase{2500, 4, 64, 1},
                                           StatsCase{3001, 6, 6, 0}, StatsCase{4100, 8, 128, 8.0},
                                           StatsCase{777, 13, 40, 0.5},
                                           StatsCase{2049, 16, 300, 2.0},
                                           StatsCase{999, 24, 64, 1.0}));

TEST(StatsEmulation, EmptyBatchWritesZeros) {
  check::Batch b;
  b.top_k = 4;
  b.num_experts = 10;
  b.num_ranks = 2;
  const Counts emu = emulate_counts(b, Variant::kSharedAggregated, 2);
  EXPECT_EQ(emu.loads, std::vector<int64_t>(10, 0));
  EXPECT_EQ(emu.coactivation, std::vector<int64_t>(100, 0));
}

TEST(StatsEmulation, RealTraces) {
  const std::filesystem::path dir = std::filesystem::path(COBALT_SHARED_DIR) / "data/traces";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no traces at " << dir;
  for (const char* file :
       {"qwen15-moe-a2.7b_gsm8k_5layers.safetensors", "olmoe-1b-7b_layer0.safetensors"}) {
    expect_counts_equal(check::trace_batch((dir / file).string(), 0, 32, 0), file);
  }
}

}  // namespace
}  // namespace cobalt::cuda
