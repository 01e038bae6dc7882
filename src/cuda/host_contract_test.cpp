// The CUDA launchers' host-side contract (include/cobalt/cuda/common.hpp): argument errors throw
// cobalt::Error(kInvalidArgument) naming what is wrong, before any CUDA runtime call, so they hold
// on a machine without a GPU (this test needs none; the pointers below are host memory that no
// check dereferences). Without a device, a well-formed call throws kInternal naming the CUDA call
// instead of crashing. An error left pending by an earlier CUDA call is named as such
// (kFailedPrecondition) before anything is launched.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/cuda/assign.hpp"
#include "cobalt/cuda/dispatch_layout.hpp"
#include "cobalt/cuda/routing_stats.hpp"
#include "cobalt/cuda/topoep.hpp"

namespace cobalt::cuda {
namespace {

template <typename F>
void expect_error(ErrorCode code, const std::string& needle, F&& call) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

void expect_invalid(const std::string& needle, const auto& call) {
  expect_error(ErrorCode::kInvalidArgument, needle, call);
}

// Dummy maps of a 2-node, 4-rank, 8-expert layout: never read by the checks.
struct HostLayout {
  std::vector<uint64_t> node_mask = std::vector<uint64_t>(8, 1);
  std::vector<int32_t> node_offsets = std::vector<int32_t>(8 * 2 + 1, 0);
  std::vector<int32_t> replica_ranks = std::vector<int32_t>(8, 0);
  LayoutView view(int num_nodes = 2, int num_ranks = 4) const {
    return LayoutView{
        8, num_nodes, num_ranks, node_mask.data(), node_offsets.data(), replica_ranks.data()};
  }
};

TEST(CudaHostContract, AssignRejectsBadArgumentsBeforeTouchingTheDevice) {
  const HostLayout host;
  std::vector<int32_t> ids(64), src(8), exec(64);
  const assign::AssignKey key{};
  const auto call = [&](const LayoutView& layout, int64_t tokens, int top_k,
                        assign::CoverSearch search, size_t workspace_bytes = 0,
                        void* workspace = nullptr) {
    assign_node_cover(layout, ids.data(), src.data(), tokens, top_k, key, search, exec.data(),
                      workspace, workspace_bytes, nullptr);
  };
  const auto kAuto = assign::CoverSearch::kAuto, kDp = assign::CoverSearch::kSubsetDp;
  expect_invalid("top_k out of range [1, 16]", [&] { call(host.view(), 8, 0, kAuto); });
  expect_invalid("top_k out of range [1, 16]", [&] { call(host.view(), 8, 17, kAuto); });
  expect_invalid("negative token count", [&] { call(host.view(), -1, 8, kAuto); });
  expect_invalid("invalid shape", [&] { call(host.view(2, 5), 8, 8, kAuto); });
  expect_invalid("invalid shape", [&] { call(host.view(65, 65), 8, 8, kAuto); });
  LayoutView no_maps = host.view();
  no_maps.node_offsets = nullptr;
  expect_invalid("null maps", [&] { call(no_maps, 8, 8, kAuto); });
  expect_invalid("mask enumeration over more than 20 nodes",
                 [&] { call(host.view(21, 21), 8, 8, assign::CoverSearch::kMaskEnumeration); });
  // The grid's and the deferred list's limits (int32 block and deferred counts).
  const int64_t int32_max = std::numeric_limits<int32_t>::max();
  expect_invalid("more than (2^31 - 1) x 256 tokens",
                 [&] { call(host.view(), int32_max * 256 + 1, 8, kAuto); });
  expect_invalid("at most 2^31 - 1 tokens per call",
                 [&] { call(host.view(), int32_max + 1, 9, kDp); });
  // Counts at the limits pass both checks and the workspace check (none is needed there): the
  // null pointers are what is refused next. The subset DP at K <= 8 keeps no deferred list.
  EXPECT_EQ(assign_workspace_bytes(int32_max + 1, 8, 2, kDp), 0u);
  const auto reaches_the_pointers = [&](int64_t tokens, int top_k, assign::CoverSearch search) {
    expect_invalid("null input or output", [&] {
      assign_node_cover(host.view(), nullptr, nullptr, tokens, top_k, key, search, nullptr, nullptr,
                        0, nullptr);
    });
  };
  reaches_the_pointers(int32_max + 1, 8, kDp);
  reaches_the_pointers(int32_max * 256, 8, kAuto);
  reaches_the_pointers(int32_max * 256, 16, assign::CoverSearch::kMaskEnumeration);
  const size_t needed = assign_workspace_bytes(1000, 12, 2, kDp);
  EXPECT_GT(needed, size_t{1000} * 8);  // the deferred list and 1024 DP tables of 2^12 bytes
  expect_invalid("workspace smaller than assign_workspace_bytes()",
                 [&] { call(host.view(), 1000, 12, kDp, needed - 1); });
  // Nothing to do: no pointer is needed (and none is read).
  EXPECT_NO_THROW(assign_node_cover(host.view(), nullptr, nullptr, 0, 8, key, kAuto, nullptr,
                                    nullptr, 0, nullptr));
  expect_invalid("null input or output", [&] {
    assign_node_cover(host.view(), nullptr, src.data(), 8, 8, key, kAuto, exec.data(), nullptr, 0,
                      nullptr);
  });
}

TEST(CudaHostContract, CountRoutingRejectsBadArguments) {
  std::vector<int32_t> ids(64);
  std::vector<int64_t> counts(8), coact(64);
  const auto call = [&](int64_t tokens, int top_k, int experts, int64_t* c, int64_t* p) {
    count_routing(ids.data(), tokens, top_k, experts, c, p, nullptr, 0, nullptr,
                  StatsMethod::kGlobalAggregated);
  };
  expect_invalid("top_k must be >= 1", [&] { call(8, 0, 8, counts.data(), coact.data()); });
  expect_invalid("num_experts out of range [1, 65536]",
                 [&] { call(8, 2, 65537, counts.data(), coact.data()); });
  expect_invalid("negative token count", [&] { call(-1, 2, 8, counts.data(), coact.data()); });
  expect_invalid("null output", [&] { call(8, 2, 8, nullptr, coact.data()); });
  expect_invalid("workspace smaller", [&] { call(8, 2, 8, counts.data(), coact.data()); });
}

TEST(CudaHostContract, DispatchLayoutRejectsBadArguments) {
  std::vector<int32_t> exec(64), src(8);
  std::vector<int64_t> rank_counts(4), node_counts(2), offsets(5), pairs(16);
  DispatchLayoutOutputs out{rank_counts.data(), node_counts.data(), offsets.data()};
  const auto call = [&](int64_t tokens, int top_k, int nodes, int ranks,
                        const DispatchLayoutOutputs& o, const int32_t* source = nullptr) {
    dispatch_layout(exec.data(), source, tokens, top_k, nodes, ranks, o, nullptr, 0, nullptr);
  };
  expect_invalid("top_k out of range [1, 64]", [&] { call(8, 0, 2, 4, out); });
  expect_invalid("num_ranks out of range [1, 2048]", [&] { call(8, 8, 2, 4096, out); });
  expect_invalid("num_nodes must be in [1, 64] and divide num_ranks",
                 [&] { call(8, 8, 3, 4, out); });
  expect_invalid("negative token count", [&] { call(-1, 8, 2, 4, out); });
  DispatchLayoutOutputs missing = out;
  missing.node_counts = nullptr;
  expect_invalid("rank_counts, node_counts and rank_offsets are required",
                 [&] { call(8, 8, 2, 4, missing); });
  DispatchLayoutOutputs with_pairs = out;
  with_pairs.pair_counts = pairs.data();
  expect_invalid("pair_counts needs source_rank", [&] { call(8, 8, 2, 4, with_pairs); });
  expect_invalid("T * K must stay below 2^31",
                 [&] { call(int64_t{1} << 28, 8, 2, 4, out); });  // 2^31 copies
  expect_invalid("workspace smaller than dispatch_layout_workspace_bytes()",
                 [&] { call(8, 8, 2, 4, out); });
}

TEST(CudaHostContract, SolveTopoEpRejectsBadShapes) {
  std::vector<int64_t> demand(4 * 8);
  TopoEpDeviceInput in;
  in.num_nodes = 2;
  in.num_ranks = 4;
  in.num_experts = 8;
  in.slots_per_rank = 3;
  in.token_bytes = 1.0;
  in.expert_param_bytes = 1.0;
  in.demand = demand.data();
  const TopoEpDeviceOutput out{};
  const auto with = [&](auto change) {
    TopoEpDeviceInput bad = in;
    change(bad);
    return [bad, &out] { solve_topoep(bad, out, nullptr, 0, nullptr); };
  };
  expect_invalid("number of experts must be >= 1", with([](auto& x) { x.num_experts = 0; }));
  expect_invalid("divide num_ranks", with([](auto& x) { x.num_nodes = 3; }));
  expect_invalid("cannot hold the main instances", with([](auto& x) { x.slots_per_rank = 1; }));
  expect_invalid("max_moves_per_node must be >= 1",
                 with([](auto& x) { x.max_moves_per_node = 0; }));
  expect_invalid("finite and >= 0", with([](auto& x) { x.token_bytes = -1.0; }));
  expect_invalid("null demand", with([](auto& x) { x.demand = nullptr; }));
  expect_invalid("null output", with([](auto&) {}));
}

TEST(CudaHostContract, WithoutADeviceAWellFormedCallFailsCleanly) {
  if (device_available()) GTEST_SKIP() << "a CUDA device is present: these pointers are host";
  const HostLayout host;
  std::vector<int32_t> ids(16, 0), src(2, 0), exec(16);
  // The launch (or the first runtime call) fails: kInternal naming it, no crash.
  expect_error(ErrorCode::kInternal, "CUDA", [&] {
    assign_node_cover(host.view(), ids.data(), src.data(), 2, 8, assign::AssignKey{},
                      assign::CoverSearch::kAuto, exec.data(), nullptr, 0, nullptr);
  });
}

// A 256-byte aligned host buffer standing in for a device workspace (never read: the launchers
// refuse before they enqueue anything).
struct HostWorkspace {
  std::vector<unsigned char> bytes;
  explicit HostWorkspace(size_t size) : bytes(size + 256) {}
  void* data() {
    const auto address = reinterpret_cast<uintptr_t>(bytes.data());
    return bytes.data() + (256 - address % 256) % 256;
  }
};

TEST(CudaHostContract, AnErrorLeftPendingByAnEarlierCallIsNamedNotBlamedOnTheLaunch) {
  // With a device: the launchers refuse with kFailedPrecondition naming the earlier call's error,
  // which they clear. Without one (as here on the build machine): the runtime's own error cannot
  // be cleared, and every launcher reports it as kInternal, launching nothing.
  const bool device = device_available();
  (void)cudaGetLastError();
  const HostLayout host;
  std::vector<int32_t> ids(16, 0), src(2, 0), exec(16);
  std::vector<int64_t> rank_counts(4), node_counts(2), offsets(5), counts(8), coact(64);
  HostWorkspace dispatch_ws(dispatch_layout_workspace_bytes(2, 4));
  // (The global method's size needs no device; the shared ones' asks it for its SM count.)
  const size_t stats_bytes =
      routing_counts_workspace_bytes(2, 8, 8, StatsMethod::kGlobalAggregated);
  HostWorkspace stats_ws(stats_bytes);
  std::vector<int64_t> demand(4 * 8), source_offsets(5), rank_loads(4), stats(4);
  std::vector<int32_t> slots(4 * 3), status(1);
  std::vector<TopoEpDeviceQuota> quotas(topoep_quota_capacity(4, 3));
  TopoEpDeviceInput topo_in;
  topo_in.num_nodes = 2;
  topo_in.num_ranks = 4;
  topo_in.num_experts = 8;
  topo_in.slots_per_rank = 3;
  topo_in.demand = demand.data();
  const TopoEpDeviceOutput topo_out{
      slots.data(),      source_offsets.data(), quotas.data(), static_cast<int64_t>(quotas.size()),
      rank_loads.data(), stats.data(),          status.data()};
  HostWorkspace topo_ws(topoep_workspace_bytes(topo_in));
  // Well-formed calls on host pointers (dummy maps and buffers, never read: nothing launches).
  const std::vector<std::pair<std::string, std::function<void()>>> launchers = {
      {"cuda assign",
       [&] {
         assign_node_cover(host.view(), ids.data(), src.data(), 2, 8, assign::AssignKey{},
                           assign::CoverSearch::kAuto, exec.data(), nullptr, 0, nullptr);
       }},
      {"cuda dispatch layout",
       [&] {
         dispatch_layout(
             exec.data(), src.data(), 2, 8, 2, 4,
             DispatchLayoutOutputs{rank_counts.data(), node_counts.data(), offsets.data()},
             dispatch_ws.data(), dispatch_layout_workspace_bytes(2, 4), nullptr);
       }},
      {"cuda count_routing",
       [&] {
         count_routing(ids.data(), 2, 8, 8, counts.data(), coact.data(), stats_ws.data(),
                       stats_bytes, nullptr, StatsMethod::kGlobalAggregated);
       }},
      {"cuda topoep",
       [&] {
         solve_topoep(topo_in, topo_out, topo_ws.data(), topoep_workspace_bytes(topo_in), nullptr);
       }},
  };
  // Argument errors stay kInvalidArgument with an error pending: a misaligned workspace is
  // refused before the pending error is looked at (and leaves it pending).
  ASSERT_NE(cudaSetDevice(-1), cudaSuccess);
  const cudaError_t before = cudaPeekAtLastError();
  char* misaligned = static_cast<char*>(dispatch_ws.data()) + 8;
  expect_invalid("256-byte aligned", [&] {
    dispatch_layout(exec.data(), src.data(), 2, 8, 2, 4,
                    DispatchLayoutOutputs{rank_counts.data(), node_counts.data(), offsets.data()},
                    misaligned, dispatch_layout_workspace_bytes(2, 4), nullptr);
  });
  expect_invalid("256-byte aligned", [&] {
    count_routing(ids.data(), 2, 8, 8, counts.data(), coact.data(),
                  static_cast<char*>(stats_ws.data()) + 8, stats_bytes, nullptr,
                  StatsMethod::kGlobalAggregated);
  });
  {
    std::vector<int32_t> wide_ids(2 * 12, 0), wide_exec(2 * 12);
    const size_t bytes = assign_workspace_bytes(2, 12, 2, assign::CoverSearch::kSubsetDp);
    HostWorkspace assign_ws(bytes + 8);
    expect_invalid("256-byte aligned", [&] {
      assign_node_cover(host.view(), wide_ids.data(), src.data(), 2, 12, assign::AssignKey{},
                        assign::CoverSearch::kSubsetDp, wide_exec.data(),
                        static_cast<char*>(assign_ws.data()) + 8, bytes, nullptr);
    });
  }
  EXPECT_EQ(cudaPeekAtLastError(), before);
  (void)cudaGetLastError();
  for (const auto& [name, call] : launchers) {
    // An invalid device id fails with or without a device, and leaves its error pending.
    ASSERT_NE(cudaSetDevice(-1), cudaSuccess);
    const cudaError_t pending = cudaPeekAtLastError();
    ASSERT_NE(pending, cudaSuccess);
    if (device) {
      expect_error(ErrorCode::kFailedPrecondition,
                   name +
                       " launched nothing: an earlier CUDA call on this thread left an error "
                       "pending (" +
                       cudaGetErrorName(pending),
                   call);
      EXPECT_EQ(cudaPeekAtLastError(), cudaSuccess) << name << " must clear what it reported";
    } else {
      expect_error(ErrorCode::kInternal, "CUDA: " + name + ": ", call);
    }
  }
}

}  // namespace
}  // namespace cobalt::cuda
