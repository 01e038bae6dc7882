// Host emulation of the CUDA kernels: runs the device bodies (src/cuda/detail/*_body.hpp, plain
// C++ outside nvcc) sequentially, in the kernels' phase order, and checks them against the CPU
// references bit for bit. It needs no GPU, so it runs wherever the CUDA targets are configured
// (`make test` runs it when nvcc is present). It checks the kernels' logic, not CUDA itself:
// launch configuration, shared-memory sizing, warp synchronisation and atomics are only exercised
// by cobalt_gpu_check on a GPU (docs/gpu.md).
#include <gtest/gtest.h>

#include <filesystem>
#include <tuple>
#include <utility>
#include <vector>

#include "check_inputs.hpp"
#include "cobalt/assign/dispatch_layout.hpp"
#include "cobalt/assign/node_cover.hpp"
#include "cobalt/cuda/topoep.hpp"
#include "cobalt/plan/topoep_solver.hpp"
#include "detail/assign_body.hpp"
#include "detail/dispatch_body.hpp"
#include "detail/topoep_body.hpp"

namespace cobalt::cuda {
namespace {

using detail::HostWarp;

// --- Assignment --------------------------------------------------------------------------------

template <int kMaxK>
void emulate_assign_rows(const detail::AssignTables& tab, const check::Batch& b, uint64_t prefix,
                         int64_t token_offset, detail::CoverMode mode, std::vector<int32_t>& out,
                         int64_t& deferred) {
  std::vector<uint8_t> local(1 << detail::kAssignLocalDpBits), big(size_t{1} << b.top_k);
  for (int64_t t = 0; t < b.num_tokens(); ++t) {
    const uint64_t token_h =
        token_hash(prefix, static_cast<uint64_t>(token_offset) + static_cast<uint64_t>(t));
    const int32_t* row = b.ids.data() + t * b.top_k;
    int32_t* o = out.data() + t * b.top_k;
    // The main kernel (local DP table), then the deferred pass (a 2^K table) when needed.
    if (!detail::assign_token<kMaxK>(tab, row, b.top_k, b.src[t], token_h, mode, local.data(),
                                     detail::kAssignLocalDpBits, o)) {
      ++deferred;
      ASSERT_TRUE(detail::assign_token<kMaxK>(tab, row, b.top_k, b.src[t], token_h, mode,
                                              big.data(), b.top_k, o));
    }
  }
}

// The kernel's template choice for K (assign.cu).
std::vector<int32_t> emulate_assign(const ExpertLayout& layout, const check::Batch& b,
                                    const assign::AssignKey& key, assign::CoverSearch search,
                                    int64_t* num_deferred = nullptr) {
  const detail::AssignTables tab{layout.node_masks().data(), layout.node_offsets().data(),
                                 layout.replica_ranks().data(), layout.num_nodes(),
                                 layout.topology().ranks_per_node()};
  const bool masks = search == assign::CoverSearch::kMaskEnumeration ||
                     (search == assign::CoverSearch::kAuto && layout.num_nodes() <= 8);
  const auto mode = masks ? detail::CoverMode::kMasks : detail::CoverMode::kSubsetDp;
  const uint64_t prefix =
      counter_prefix(key.seed, static_cast<uint64_t>(key.step), static_cast<uint64_t>(key.layer));
  std::vector<int32_t> out(b.ids.size(), -7);
  int64_t deferred = 0;
  if (b.top_k == 1) {
    emulate_assign_rows<1>(tab, b, prefix, key.token_offset, mode, out, deferred);
  } else if (b.top_k == 2) {
    emulate_assign_rows<2>(tab, b, prefix, key.token_offset, mode, out, deferred);
  } else if (b.top_k <= 4) {
    emulate_assign_rows<4>(tab, b, prefix, key.token_offset, mode, out, deferred);
  } else if (b.top_k <= 8) {
    emulate_assign_rows<8>(tab, b, prefix, key.token_offset, mode, out, deferred);
  } else {
    emulate_assign_rows<16>(tab, b, prefix, key.token_offset, mode, out, deferred);
  }
  if (num_deferred) *num_deferred = deferred;
  return out;
}

struct AssignCase {
  int nodes, per_node, experts, top_k, slots;
  double fill, skew;
  int64_t tokens = 3000;
};

class AssignEmulation : public ::testing::TestWithParam<AssignCase> {};

TEST_P(AssignEmulation, MatchesTheCpuBitForBit) {
  const AssignCase c = GetParam();
  const Topology topo(c.nodes, c.nodes * c.per_node);
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    const auto layout = check::random_layout(seed, topo, c.experts, c.slots, c.fill);
    const auto b = check::random_batch(seed * 31, c.tokens, c.top_k, c.experts, topo.num_ranks(),
                                       c.skew, seed % 2 == 0);
    const assign::AssignKey key{seed, 9, 3, static_cast<int64_t>(seed) * 1000};
    for (auto search : {assign::CoverSearch::kMaskEnumeration, assign::CoverSearch::kSubsetDp,
                        assign::CoverSearch::kAuto}) {
      // The mask search up to 16 nodes (Gosper's walk above 8); the reference up to 12.
      if (search == assign::CoverSearch::kMaskEnumeration && c.nodes > 16) continue;
      std::vector<RankId> cpu(b.ids.size());
      assign::assign_node_cover(b.view(), layout, key, {search, 1}, cpu);
      const auto gpu = emulate_assign(layout, b, key, search);
      ASSERT_EQ(gpu, cpu) << "seed " << seed << " search " << static_cast<int>(search);
      if (search == assign::CoverSearch::kMaskEnumeration && c.nodes <= 12) {
        std::vector<RankId> ref(b.ids.size());
        assign::assign_node_cover_reference(b.view(), layout, key, ref);
        ASSERT_EQ(gpu, ref) << "seed " << seed;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AssignEmulation,
    ::testing::Values(AssignCase{1, 4, 16, 4, 6, 0.5, 0.0}, AssignCase{2, 4, 32, 2, 6, 0.5, 1.0},
                      AssignCase{4, 8, 256, 8, 12, 0.6, 1.0}, AssignCase{4, 2, 24, 3, 4, 0.4, 0.0},
                      AssignCase{8, 2, 64, 8, 6, 0.5, 2.0}, AssignCase{8, 1, 40, 1, 7, 0.5, 0.0},
                      // Every word count of the bitset cover (N <= 6: one word, 7: two, 8:
                      // four), sparse layouts so multi-node covers are common.
                      AssignCase{3, 2, 24, 6, 5, 0.2, 0.5}, AssignCase{5, 2, 40, 8, 5, 0.2, 0.5},
                      AssignCase{6, 2, 48, 8, 5, 0.2, 0.5}, AssignCase{7, 2, 56, 16, 5, 0.2, 0.5},
                      AssignCase{8, 2, 64, 16, 5, 0.1, 0.5}, AssignCase{12, 2, 96, 8, 6, 0.3, 0.5},
                      AssignCase{16, 8, 512, 8, 6, 0.3, 1.0},
                      // K = 16 over many nodes: subset DPs beyond the local table (deferred;
                      // 2^16-state DPs are slow on the CPU too, so fewer tokens).
                      AssignCase{32, 2, 128, 16, 3, 0.8, 0.0, 200},
                      AssignCase{64, 1, 256, 16, 5, 0.9, 0.0, 100}));

TEST(AssignEmulation, DeferredPathIsExercised) {
  const Topology topo(64, 64);
  const auto layout = check::random_layout(5, topo, 256, 5, 0.9);
  const auto b = check::random_batch(17, 200, 16, 256, 64, 0.0, false);
  const assign::AssignKey key{1, 2, 3, 0};
  int64_t deferred = 0;
  const auto gpu = emulate_assign(layout, b, key, assign::CoverSearch::kSubsetDp, &deferred);
  std::vector<RankId> cpu(b.ids.size());
  assign::assign_node_cover(b.view(), layout, key, {assign::CoverSearch::kSubsetDp, 1}, cpu);
  EXPECT_EQ(gpu, cpu);
  EXPECT_GT(deferred, 0) << "no token needed the big DP table: the test lost its purpose";
}

TEST(AssignEmulation, RealTraces) {
  const std::filesystem::path dir = std::filesystem::path(COBALT_SHARED_DIR) / "data/traces";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no traces at " << dir;
  for (const char* file :
       {"qwen15-moe-a2.7b_gsm8k_5layers.safetensors", "olmoe-1b-7b_layer0.safetensors"}) {
    const auto b = check::trace_batch((dir / file).string(), 0, 32, 0);
    const Topology topo(4, 32);
    const auto layout =
        check::random_layout(3, topo, b.num_experts, (3 * b.num_experts) / 64 + 1, 0.6);
    for (auto search : {assign::CoverSearch::kMaskEnumeration, assign::CoverSearch::kSubsetDp}) {
      std::vector<RankId> cpu(b.ids.size());
      assign::assign_node_cover(b.view(), layout, {7, 1, 0, 0}, {search, 1}, cpu);
      EXPECT_EQ(emulate_assign(layout, b, {7, 1, 0, 0}, search), cpu) << file;
    }
  }
}

// --- Dispatch layout ---------------------------------------------------------------------------

assign::DispatchLayout emulate_dispatch(const std::vector<int32_t>& exec,
                                        const std::vector<int32_t>& src, int top_k,
                                        const Topology& topo) {
  const int G = topo.num_ranks(), N = topo.num_nodes();
  const int64_t T = static_cast<int64_t>(src.size());
  const detail::DispatchShape s{exec.data(), src.data(), T, top_k, G, N, topo.ranks_per_node()};
  const int64_t chunks = (T + detail::kDispatchChunk - 1) / detail::kDispatchChunk;
  assign::DispatchLayout out;
  out.rank_counts.assign(G, -1);
  out.node_counts.assign(N, 0);  // (zeroed by a memset on the device)
  out.rank_offsets.assign(G + 1, -1);
  out.pair_counts.assign(static_cast<size_t>(G) * G, 0);
  out.token_in_rank.assign(static_cast<size_t>(T) * G, 0xab);
  out.slot.assign(exec.size(), -1);
  std::vector<int32_t> chunk_counts(static_cast<size_t>(chunks) * G, -1);
  std::vector<uint32_t> ballots(static_cast<size_t>(detail::kDispatchWarps) * G);
  std::vector<uint32_t> prefix(ballots.size());
  const HostWarp w;
  // Count pass.
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<int64_t> node_hist(64, 0);
    for (int wi = 0; wi < detail::kDispatchWarps; ++wi) {
      const int64_t base = c * detail::kDispatchChunk + 32 * wi;
      detail::dispatch_warp_ballots(w, s, base, ballots.data() + wi * G);
      detail::dispatch_warp_nodes(w, s, base, node_hist.data());
    }
    detail::dispatch_chunk_counts(0, 1, G, ballots.data(), c, chunks, chunk_counts.data());
    for (int n = 0; n < N; ++n) out.node_counts[n] += node_hist[n];
    // pair counts: exercise the per-warp aggregated path always (the kernel uses it for chunks
    // that mix sources).
    for (int wi = 0; wi < detail::kDispatchWarps; ++wi) {
      const int64_t base = c * detail::kDispatchChunk + 32 * wi;
      detail::dispatch_warp_pairs(w, s, base, ballots.data() + wi * G, out.pair_counts.data());
    }
  }
  // Scan pass (dispatch_scan_kernel's result).
  for (int d = 0; d < G; ++d) {
    int64_t running = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      const int32_t v = chunk_counts[d * chunks + c];
      chunk_counts[d * chunks + c] = static_cast<int32_t>(running);
      running += v;
    }
    out.rank_counts[d] = running;
  }
  out.rank_offsets[0] = 0;
  for (int d = 0; d < G; ++d) out.rank_offsets[d + 1] = out.rank_offsets[d] + out.rank_counts[d];
  // Slot pass.
  for (int64_t c = 0; c < chunks; ++c) {
    for (int wi = 0; wi < detail::kDispatchWarps; ++wi) {
      const int64_t base = c * detail::kDispatchChunk + 32 * wi;
      detail::dispatch_warp_ballots(w, s, base, ballots.data() + wi * G);
    }
    detail::dispatch_warp_prefix(0, 1, G, ballots.data(), prefix.data());
    for (int wi = 0; wi < detail::kDispatchWarps; ++wi) {
      const int64_t base = c * detail::kDispatchChunk + 32 * wi;
      detail::dispatch_warp_slots(w, s, base, c, chunks, ballots.data() + wi * G,
                                  prefix.data() + wi * G, chunk_counts.data(),
                                  out.rank_offsets.data(), out.slot.data());
      detail::dispatch_warp_flags(w, s, base, ballots.data() + wi * G, out.token_in_rank.data());
    }
  }
  return out;
}

void expect_same(const assign::DispatchLayout& a, const assign::DispatchLayout& b) {
  EXPECT_EQ(a.rank_counts, b.rank_counts);
  EXPECT_EQ(a.node_counts, b.node_counts);
  EXPECT_EQ(a.rank_offsets, b.rank_offsets);
  EXPECT_EQ(a.pair_counts, b.pair_counts);
  EXPECT_TRUE(a.token_in_rank == b.token_in_rank);
  EXPECT_EQ(a.slot, b.slot);
}

TEST(DispatchEmulation, MatchesTheCpuReference) {
  struct Case {
    int nodes, per_node, experts, top_k;
    int64_t tokens;
    bool contiguous;
  };
  for (const Case c : {Case{4, 8, 256, 8, 5000, true}, Case{2, 3, 30, 4, 777, false},
                       Case{16, 8, 640, 8, 3001, true}, Case{1, 1, 8, 2, 300, false},
                       Case{3, 5, 45, 6, 1000, false}}) {
    const Topology topo(c.nodes, c.nodes * c.per_node);
    const auto layout =
        check::random_layout(3, topo, c.experts, c.experts / topo.num_ranks() + 3, 0.7);
    const auto b =
        check::random_batch(11, c.tokens, c.top_k, c.experts, topo.num_ranks(), 1.0, c.contiguous);
    std::vector<RankId> exec(b.ids.size());
    assign::assign_node_cover(b.view(), layout, {1, 2, 3, 0}, {}, exec);
    const auto cpu = assign::dispatch_layout(exec, b.src, c.top_k, topo);
    SCOPED_TRACE(testing::Message() << "G=" << topo.num_ranks() << " T=" << c.tokens);
    expect_same(emulate_dispatch(exec, b.src, c.top_k, topo), cpu);
  }
}

TEST(DispatchEmulation, RepeatedRanksShareASlot) {
  // Two tasks of a token on one rank (several of its experts there): one copy, one slot.
  const Topology topo(2, 8);
  const std::vector<int32_t> exec = {1, 1, 5, 2, 1, 1, 3, 3, 3};
  const std::vector<int32_t> src = {0, 1, 3};
  const auto cpu = assign::dispatch_layout(exec, src, 3, topo);
  EXPECT_EQ(cpu.rank_counts, (std::vector<int64_t>{0, 2, 1, 1, 0, 1, 0, 0}));
  EXPECT_EQ(cpu.slot[0], cpu.slot[1]);
  EXPECT_EQ(cpu.slot[6], cpu.slot[8]);
  expect_same(emulate_dispatch(exec, src, 3, topo), cpu);
}

// --- TopoEP ------------------------------------------------------------------------------------

struct TopoResult {
  std::vector<int32_t> slots;
  std::vector<int64_t> source_offsets;
  std::vector<TopoEpDeviceQuota> quotas;
  std::vector<int64_t> rank_loads;
  int64_t stats[4];
  int32_t status;
};

// sort: rank each node's candidates as the kernel does (a bitonic sort where the keys fit in
// shared memory, counting beyond); false: always by counting (the kernel's path for E > 2048).
// threads: the place kernel's block size (each barrier-separated phase runs thread 0, 1, ... in
// turn; the kernel uses kPlaceThreads, which the emulation also runs with threads = 3 to check that
// every thread's share of a phase is independent of the others').
TopoResult emulate_topoep(const plan::TopoEpInput& in, bool sort = true, int threads = 1) {
  const int G = in.topology.num_ranks(), E = in.num_experts, N = in.topology.num_nodes();
  const detail::TopoShape s{
      G, E, N, G / N, in.slots_per_rank, 4096, in.token_bytes, in.expert_param_bytes};
  const size_t bytes = detail::topo_carve(s, nullptr, false).bytes;
  std::vector<uint64_t> storage(bytes / 8 + 1);
  // Poison the workspace: the kernels must not read what they did not write.
  std::fill(reinterpret_cast<uint8_t*>(storage.data()),
            reinterpret_cast<uint8_t*>(storage.data()) + bytes, 0xcd);
  detail::TopoWork w = detail::topo_carve(s, storage.data(), true).work;
  TopoResult r;
  w.demand = in.demand.data();
  w.stats = r.stats;
  w.status = &r.status;
  std::fill(reinterpret_cast<uint8_t*>(w.num_candidates),
            reinterpret_cast<uint8_t*>(w.num_candidates) + detail::topo_zero_bytes(s, w), 0);
  std::fill(r.stats, r.stats + 4, 0);
  r.status = 0;
  // The kernels in launch order; within a kernel, blocks / warps / threads one after another.
  const int sort_size = sort ? detail::topo_place_sort_size(s) : 0;
  std::vector<detail::TopoSortKey> keys(sort_size);
  for (int d = 0; d < N; ++d) {
    for (int t = 0; t < threads; ++t) detail::topo_place_phase_a(t, threads, s, w, d);
    if (sort_size == 0) {
      for (int t = 0; t < threads; ++t) detail::topo_place_phase_b(t, threads, s, w, d);
      continue;
    }
    // The kernel's barrier-separated stages, each run by every thread in turn (within a stage
    // the threads touch disjoint pairs).
    for (int t = 0; t < threads; ++t) {
      detail::topo_sort_keys(t, threads, s, w, d, keys.data(), sort_size);
    }
    for (int k = 2; k <= sort_size; k <<= 1) {
      for (int j = k >> 1; j > 0; j >>= 1) {
        for (int t = 0; t < threads; ++t) {
          detail::topo_sort_stage(t, threads, keys.data(), sort_size, k, j);
        }
      }
    }
    for (int t = 0; t < threads; ++t) {
      detail::topo_place_sorted(t, threads, s, w, d, keys.data(), sort_size);
    }
  }
  for (int e = 0; e < E; ++e) detail::topo_route_expert(s, w, e);
  const HostWarp warp;
  for (int n = 0; n < N; ++n) {
    const int first = n * s.per_node;
    const detail::TopoNodeState st{w.slot_expert + static_cast<int64_t>(first) * s.slots,
                                   w.slot_load + static_cast<int64_t>(first) * s.slots,
                                   w.slot_used + first, w.replicas_used + first,
                                   w.rank_loads + first};
    detail::topo_refine_node(warp, s, w, st, n);
  }
  for (int e = 0; e < E; ++e) detail::topo_emit_expert(warp, s, w, e);
  for (int src = 0; src < G; ++src) detail::topo_count_source(warp, s, w, src);
  r.source_offsets.assign(G + 1, -1);
  std::vector<TopoEpDeviceQuota> quotas(static_cast<size_t>(G) * G * s.slots,
                                        TopoEpDeviceQuota{-7, -7, -7});
  for (int src = 0; src < G; ++src) {
    detail::topo_write_source(warp, s, w, src, r.source_offsets.data(), quotas.data(),
                              static_cast<int64_t>(quotas.size()));
  }
  r.slots.assign(static_cast<size_t>(G) * s.slots, -7);
  r.rank_loads.assign(G, -7);
  for (int rank = 0; rank < G; ++rank) {
    detail::topo_slots_rank(s, w, rank, r.slots.data(), r.rank_loads.data());
  }
  if (r.source_offsets[G] >= 0) quotas.resize(r.source_offsets[G]);
  r.quotas = std::move(quotas);
  return r;
}

// Both ways of ranking stage (1)'s candidates (sorted, counted), the place phases by one thread
// and by three, against the CPU solver.
void expect_topoep_equal(const plan::TopoEpInput& in) {
  const plan::TopoEpPlan cpu = plan::solve_topoep(in);
  for (const auto& [sort, threads] :
       {std::pair{true, 1}, std::pair{false, 1}, std::pair{true, 3}, std::pair{false, 3}}) {
    SCOPED_TRACE(testing::Message() << (sort ? "candidates sorted" : "candidates counted") << ", "
                                    << threads << " place threads");
    const TopoResult gpu = emulate_topoep(in, sort, threads);
    ASSERT_EQ(gpu.status, 0);
    EXPECT_EQ(gpu.slots, cpu.slots);
    EXPECT_EQ(gpu.source_offsets, cpu.source_offsets);
    ASSERT_EQ(gpu.quotas.size(), cpu.quotas.size());
    for (size_t i = 0; i < cpu.quotas.size(); ++i) {
      ASSERT_TRUE(gpu.quotas[i].expert == cpu.quotas[i].expert &&
                  gpu.quotas[i].dst == cpu.quotas[i].dst &&
                  gpu.quotas[i].count == cpu.quotas[i].count)
          << "quota " << i;
    }
    EXPECT_EQ(gpu.rank_loads, cpu.rank_loads);
    EXPECT_EQ(gpu.stats[0], cpu.stats.num_inter_node_replicas);
    EXPECT_EQ(gpu.stats[1], cpu.stats.num_intra_node_replicas);
    EXPECT_EQ(gpu.stats[2], cpu.stats.num_refinement_moves);
    EXPECT_EQ(gpu.stats[3], cpu.stats.num_dropped_replicas);
  }
}

// The place kernel sorts where the padded keys fit its 32 KB of shared memory, counts beyond.
TEST(TopoEpEmulation, CandidatesAreSortedUpTo2048Experts) {
  auto shape = [](int experts) {
    return detail::TopoShape{16, experts, 2, 8, 200, 4096, 1.0, 0.0};
  };
  EXPECT_EQ(detail::topo_place_sort_size(shape(1)), 1);
  EXPECT_EQ(detail::topo_place_sort_size(shape(640)), 1024);
  EXPECT_EQ(detail::topo_place_sort_size(shape(1024)), 1024);
  EXPECT_EQ(detail::topo_place_sort_size(shape(1025)), 2048);
  EXPECT_EQ(detail::topo_place_sort_size(shape(2048)), 2048);
  EXPECT_EQ(detail::topo_place_sort_size(shape(2049)), 0);
  EXPECT_LE(2048 * sizeof(detail::TopoSortKey), 32u * 1024u);
}

TEST(TopoEpEmulation, MatchesTheCpuSolver) {
  struct Case {
    int nodes, per_node, experts, extra;
    int64_t tokens;
    double skew, param_bytes;
  };
  int64_t moves = 0, inter = 0, intra = 0, dropped = 0;
  for (const Case c : {Case{2, 4, 32, 2, 4000, 1.0, 2e5}, Case{4, 8, 256, 2, 16384, 2.0, 1e6},
                       Case{16, 8, 640, 2, 16384, 1.5, 4e6}, Case{1, 8, 64, 3, 5000, 2.0, 0},
                       Case{4, 1, 16, 1, 3000, 1.0, 1e5}, Case{8, 4, 100, 0, 8000, 2.0, 1e5},
                       Case{4, 4, 37, 2, 6000, 3.0, 1e9}, Case{4, 8, 64, 4, 20000, 2.5, 0},
                       Case{2, 8, 32, 6, 10000, 3.0, 10}, Case{8, 8, 128, 3, 3000, 0.5, 0}}) {
    for (uint64_t seed = 1; seed <= 2; ++seed) {
      const Topology topo(c.nodes, c.nodes * c.per_node);
      const auto b = check::random_batch(seed, c.tokens, 8 < c.experts ? 8 : 2, c.experts,
                                         topo.num_ranks(), c.skew);
      const auto omega = check::demand_of(b);
      plan::TopoEpInput in;
      in.topology = topo;
      in.num_experts = c.experts;
      in.slots_per_rank = (c.experts + topo.num_ranks() - 1) / topo.num_ranks() + c.extra;
      in.token_bytes = 4096;
      in.expert_param_bytes = c.param_bytes;
      in.demand = omega;
      SCOPED_TRACE(testing::Message()
                   << c.nodes << "x" << c.per_node << " E=" << c.experts << " seed " << seed);
      expect_topoep_equal(in);
      const auto cpu = plan::solve_topoep(in);
      moves += cpu.stats.num_refinement_moves;
      inter += cpu.stats.num_inter_node_replicas;
      intra += cpu.stats.num_intra_node_replicas;
      dropped += cpu.stats.num_dropped_replicas;
    }
  }
  // The cases must reach every stage, or the comparison proves little.
  EXPECT_GT(moves, 0);
  EXPECT_GT(inter, 0);
  EXPECT_GT(intra, 0);
  RecordProperty("moves", static_cast<int>(moves));
  RecordProperty("dropped", static_cast<int>(dropped));
}

TEST(TopoEpEmulation, RandomShapes) {
  // Random topologies, budgets, skews and parameter sizes (the drop path: DropsDrainedReplicas).
  int64_t dropped = 0, light_only = 0;
  for (uint64_t seed = 1; seed <= 100; ++seed) {
    SplitMix64 rng(seed);
    const int nodes = 1 + static_cast<int>(rng.below(4)),
              per_node = 2 + static_cast<int>(rng.below(7));
    const int experts = 8 + static_cast<int>(rng.below(120)),
              extra = static_cast<int>(rng.below(5));
    const int64_t tokens = 100 + rng.below(20000);
    const double skew = 4 * rng.unit();
    const double param_bytes = rng.unit() < 0.5 ? 0 : 1e6 * rng.unit();
    const bool contiguous = rng.unit() < 0.5;
    const Topology topo(nodes, nodes * per_node);
    const auto b =
        check::random_batch(seed, tokens, 8, experts, topo.num_ranks(), skew, contiguous);
    const auto omega = check::demand_of(b);
    plan::TopoEpInput in;
    in.topology = topo;
    in.num_experts = experts;
    in.slots_per_rank = (experts + topo.num_ranks() - 1) / topo.num_ranks() + extra;
    in.token_bytes = 4096;
    in.expert_param_bytes = param_bytes;
    in.demand = omega;
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    expect_topoep_equal(in);
    const auto cpu = plan::solve_topoep(in);
    dropped += cpu.stats.num_dropped_replicas;
    if (extra == 0 && experts % topo.num_ranks() != 0) {  // free slots on ranks with fewer mains
      light_only += cpu.stats.num_inter_node_replicas + cpu.stats.num_intra_node_replicas;
    }
  }
  RecordProperty("dropped", static_cast<int>(dropped));
  EXPECT_GT(light_only, 0) << "no case used the free slots of ranks with fewer mains";
}

// The CPU test's hand-checked instances (tests/cpp/plan/topoep_solver_test.cpp,
// DrainedReplicasAreDroppedAndMovesMerge): a replica created by refinement and drained, a stage-(1)
// replica drained, moves merging; the random shapes rarely drop a replica.
TEST(TopoEpEmulation, DropsDrainedReplicas) {
  auto row = [](int64_t a, int64_t b) { return std::vector<int64_t>{a, 0, 0, b, 0, 0}; };
  std::vector<int64_t> two_nodes;
  for (const auto& r : {row(0, 5), row(3, 0), row(8, 0), row(0, 1), row(3, 3), row(0, 2)}) {
    two_nodes.insert(two_nodes.end(), r.begin(), r.end());
  }
  const std::vector<int64_t> one_node = {8, 3, 1, 0, 1, 0, 5, 0, 8, 5, 3, 0, 8, 8, 13, 0};
  int64_t dropped = 0;
  struct Case {
    Topology topo;
    int experts;
    const std::vector<int64_t>* omega;
  };
  for (const Case& c : {Case{Topology(1, 4), 4, &one_node}, Case{Topology(2, 6), 6, &two_nodes}}) {
    const Topology& topo = c.topo;
    plan::TopoEpInput in;
    in.topology = topo;
    in.num_experts = c.experts;
    in.slots_per_rank = 2;
    in.token_bytes = 1.0;
    in.expert_param_bytes = 0.0;
    in.demand = *c.omega;
    SCOPED_TRACE(testing::Message() << topo.num_nodes() << " nodes");
    expect_topoep_equal(in);
    dropped += plan::solve_topoep(in).stats.num_dropped_replicas;
  }
  EXPECT_EQ(dropped, 2) << "the instances no longer drop a replica: the drop path went unchecked";
}

TEST(TopoEpEmulation, SmallShapesWithTiedDemand) {
  // Many small nodes, E from 1 to 3G + 3 (ranks with 0, 1 or more mains), S mostly ceil(E / G),
  // small demand counts full of ties and candidates from a few to every expert: the cases where a
  // node has fewer candidates than light ranks, or no free slot, or no main at all.
  int64_t light_shapes_replicas = 0;
  for (uint64_t seed = 1; seed <= 400; ++seed) {
    SplitMix64 rng(seed * 7919);
    const int nodes = 2 + static_cast<int>(rng.below(5)),
              per_node = 1 + static_cast<int>(rng.below(16)), G = nodes * per_node;
    const int experts = 1 + static_cast<int>(rng.below(3 * G + 3));
    const int extra = rng.below(3) == 0 ? static_cast<int>(rng.below(4)) : 0;
    const int64_t most = 1 + static_cast<int64_t>(rng.below(10));
    std::vector<int64_t> omega(static_cast<size_t>(G) * experts);
    for (int64_t& v : omega) v = rng.below(3) == 0 ? 0 : static_cast<int64_t>(rng.below(most));
    plan::TopoEpInput in;
    in.topology = Topology(nodes, G);
    in.num_experts = experts;
    in.slots_per_rank = (experts + G - 1) / G + extra;
    in.token_bytes = 1.0;
    in.expert_param_bytes = rng.below(2) == 0 ? 0.0 : static_cast<double>(rng.below(20));
    in.demand = omega;
    SCOPED_TRACE(testing::Message() << "seed " << seed << ": " << nodes << "x" << per_node
                                    << " E=" << experts << " S=" << in.slots_per_rank);
    expect_topoep_equal(in);
    if (experts % G != 0) {
      light_shapes_replicas += plan::solve_topoep(in).stats.num_inter_node_replicas;
    }
  }
  EXPECT_GT(light_shapes_replicas, 0);
}

TEST(TopoEpEmulation, PaperScaleWorkload) {
  // E = 640, G = 128 (16 x 8): the target shape, on the paper-topoep preset's routing.
  const auto b = check::preset_batch("paper-topoep-640x8", 16384, 128, 3);
  const auto omega = check::demand_of(b);
  plan::TopoEpInput in;
  in.topology = Topology(16, 128);
  in.num_experts = 640;
  in.slots_per_rank = 5 + 2;
  in.token_bytes = 7168 * 2;
  in.expert_param_bytes = 1e6;
  in.demand = omega;
  expect_topoep_equal(in);
}

TEST(TopoEpEmulation, NegativeDemandIsFlagged) {
  plan::TopoEpInput in;
  in.topology = Topology(2, 4);
  in.num_experts = 8;
  in.slots_per_rank = 3;
  std::vector<int64_t> omega(32, 1);
  omega[5] = -1;
  in.demand = omega;
  EXPECT_EQ(emulate_topoep(in).status & 1, 1);
}

}  // namespace
}  // namespace cobalt::cuda
