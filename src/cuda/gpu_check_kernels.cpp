// cobalt_gpu_check: one check (and timing) per kernel against its CPU reference.
#include "gpu_check_kernels.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "cobalt/core/error.hpp"

namespace cobalt::cuda::check {

// --- Assignment
// ------------------------------------------------------------------------------------

const char* search_name(assign::CoverSearch s) {
  return s == assign::CoverSearch::kMaskEnumeration ? "masks"
         : s == assign::CoverSearch::kSubsetDp      ? "subset-dp"
                                                    : "auto";
}

// Runs and checks the assignment; returns the CPU result (exec ranks) for later kernels.
std::vector<int32_t> check_assign(Context& ctx, const Batch& b, const ExpertLayout& layout,
                                  assign::CoverSearch search, bool timed, int64_t token_offset,
                                  bool misaligned) {
  Row row;
  row.kernel = "assign";
  row.input = b.name + (misaligned ? " (misaligned)" : "") + (token_offset ? " (offset)" : "");
  row.shape = std::to_string(layout.num_nodes()) + "x" +
              std::to_string(layout.topology().ranks_per_node()) + " E" +
              std::to_string(b.num_experts) + " K" + std::to_string(b.top_k) + " T" +
              std::to_string(b.num_tokens()) + " " + search_name(search);
  const assign::AssignKey key{12345, 7, 3, token_offset};
  std::vector<RankId> cpu(b.ids.size());
  const double t0 = now_ms();
  assign::assign_node_cover(b.view(), layout, key, {search, 1}, cpu);
  row.cpu_ms = now_ms() - t0;
  row.bytes = 4.0 * b.num_tokens() * (2 * b.top_k + 1);
  if (ctx.opt.dry_run) {
    finish(ctx, std::move(row));
    return cpu;
  }

  guarded(ctx, row, [&] {
    const DeviceLayout dlayout(layout, ctx.stream);
    const size_t pad = misaligned ? 1 : 0;
    DeviceBuffer<int32_t> ids(b.ids.size() + pad), src(b.src.size()), exec(b.ids.size() + pad);
    cuda_ok(cudaMemcpy(ids.get() + pad, b.ids.data(), b.ids.size() * 4, cudaMemcpyHostToDevice),
            "upload ids");
    src.upload(b.src);
    const size_t ws_bytes =
        assign_workspace_bytes(b.num_tokens(), b.top_k, layout.num_nodes(), search);
    DeviceBuffer<unsigned char> ws(ws_bytes);
    auto call = [&] {
      assign_node_cover(dlayout.view(), ids.get() + pad, src.get(), b.num_tokens(), b.top_k, key,
                        search, exec.get() + pad, ws.get(), ws_bytes, ctx.stream);
    };
    auto compare = [&] {
      cuda_ok(cudaStreamSynchronize(ctx.stream), "assign");
      std::vector<int32_t> gpu(b.ids.size());
      cuda_ok(cudaMemcpy(gpu.data(), exec.get() + pad, gpu.size() * 4, cudaMemcpyDeviceToHost),
              "download exec");
      int64_t bad = count_mismatches(gpu, cpu, "exec_rank");
      if (search == assign::CoverSearch::kMaskEnumeration && layout.num_nodes() <= 12 &&
          b.num_tokens() <= 200000) {
        std::vector<RankId> ref(b.ids.size());
        assign::assign_node_cover_reference(b.view(), layout, key, ref);
        bad += count_mismatches(gpu, ref, "exec_rank vs reference");
      }
      return bad;
    };
    ws.poison();
    exec.poison();
    check_then_time(ctx, row, call, compare, timed);
  });
  finish(ctx, std::move(row));
  return cpu;
}

void check_pending_error(Context& ctx, const Batch& b, const ExpertLayout& layout) {
  Row row;
  row.kernel = "assign";
  row.input = b.name + " (error pending)";
  row.shape = std::to_string(layout.num_nodes()) + "x" +
              std::to_string(layout.topology().ranks_per_node()) + " E" +
              std::to_string(b.num_experts) + " K" + std::to_string(b.top_k) + " T" +
              std::to_string(b.num_tokens());
  const assign::AssignKey key{1, 2, 3, 0};
  std::vector<RankId> cpu(b.ids.size());
  const double t0 = now_ms();
  assign::assign_node_cover(b.view(), layout, key, {}, cpu);
  row.cpu_ms = now_ms() - t0;
  row.bytes = 4.0 * b.num_tokens() * (2 * b.top_k + 1);
  if (ctx.opt.dry_run) {
    finish(ctx, std::move(row));
    return;
  }
  guarded(ctx, row, [&] {
    const DeviceLayout dlayout(layout, ctx.stream);
    DeviceBuffer<int32_t> ids(b.ids.size()), src(b.src.size()), exec(b.ids.size());
    ids.upload(b.ids);
    src.upload(b.src);
    exec.poison();
    const auto call = [&] {
      assign_node_cover(dlayout.view(), ids.get(), src.get(), b.num_tokens(), b.top_k, key,
                        assign::CoverSearch::kAuto, exec.get(), nullptr, 0, ctx.stream);
    };
    int64_t bad = 0;
    // An invalid device id: a plain (not sticky) error, left pending for cudaGetLastError().
    if (cudaSetDevice(-1) == cudaSuccess || cudaPeekAtLastError() == cudaSuccess) {
      throw CudaFailure("cudaSetDevice(-1) left no error pending");
    }
    try {
      call();
      std::fprintf(stderr, "  pending error: the launcher did not refuse\n");
      ++bad;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kFailedPrecondition ||
          std::string(e.what()).find("cudaErrorInvalidDevice") == std::string::npos) {
        std::fprintf(stderr, "  pending error: wrong error: %s\n", e.what());
        ++bad;
      }
    }
    if (cudaPeekAtLastError() != cudaSuccess) {
      std::fprintf(stderr, "  pending error: still pending after the refusal\n");
      (void)cudaGetLastError();
      ++bad;
    }
    cuda_ok(cudaStreamSynchronize(ctx.stream), "after the refused call");
    int32_t poison_word = 0;
    std::memset(&poison_word, kPoison, sizeof poison_word);
    const std::vector<int32_t> untouched = exec.download();
    if (std::any_of(untouched.begin(), untouched.end(),
                    [&](int32_t v) { return v != poison_word; })) {
      std::fprintf(stderr, "  pending error: the refused call wrote its output\n");
      ++bad;
    }
    call();  // the retry runs
    cuda_ok(cudaStreamSynchronize(ctx.stream), "retry");
    row.mismatches = bad + count_mismatches(exec.download(), cpu, "exec_rank (retry)");
  });
  finish(ctx, std::move(row));
}

// --- Routing statistics
// ----------------------------------------------------------------------------

const char* method_name(StatsMethod m) {
  switch (m) {
    case StatsMethod::kAuto:
      return "auto";
    case StatsMethod::kSharedAggregated:
      return "shared+aggregated";
    case StatsMethod::kSharedPlain:
      return "shared plain";
    case StatsMethod::kGlobalAggregated:
      return "global+aggregated";
  }
  return "?";
}

void check_stats(Context& ctx, const Batch& b, std::vector<StatsMethod> methods, bool timed) {
  const int E = b.num_experts;
  std::vector<int64_t> loads(E), coact(static_cast<size_t>(E) * E);
  const double t0 = now_ms();
  count_routing(b.view(), loads, coact, 1);
  const double cpu_ms = now_ms() - t0;
  if (ctx.opt.dry_run) {
    Row row;
    row.kernel = "stats";
    row.input = b.name;
    row.shape = fmt::format("E{} K{} T{}", E, b.top_k, b.num_tokens());
    row.cpu_ms = cpu_ms;
    row.bytes = 4.0 * b.num_tokens() * b.top_k + 8.0 * (E + static_cast<double>(E) * E);
    finish(ctx, std::move(row));
    return;
  }
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<int64_t> d_loads(E), d_coact(static_cast<size_t>(E) * E);
  ids.upload(b.ids);
  for (StatsMethod method : methods) {
    if (!routing_counts_supported(E, method)) continue;
    Row row;
    row.kernel = "stats";
    row.input = b.name;
    row.shape = fmt::format("E{} K{} T{} {}", E, b.top_k, b.num_tokens(), method_name(method));
    row.cpu_ms = cpu_ms;
    row.bytes = 4.0 * b.num_tokens() * b.top_k + 8.0 * (E + static_cast<double>(E) * E);
    guarded(ctx, row, [&] {
      const size_t ws_bytes = routing_counts_workspace_bytes(b.num_tokens(), b.top_k, E, method);
      DeviceBuffer<unsigned char> ws(ws_bytes);
      auto call = [&] {
        count_routing(ids.get(), b.num_tokens(), b.top_k, E, d_loads.get(), d_coact.get(), ws.get(),
                      ws_bytes, ctx.stream, method);
      };
      auto compare = [&] {
        cuda_ok(cudaStreamSynchronize(ctx.stream), "count_routing");
        return count_mismatches(d_loads.download(), loads, "expert_counts") +
               count_mismatches(d_coact.download(), coact, "coactivation");
      };
      ws.poison();
      d_loads.poison();
      d_coact.poison();
      check_then_time(ctx, row, call, compare, timed);
    });
    finish(ctx, std::move(row));
  }
}

// --- Dispatch layout
// -------------------------------------------------------------------------------

void check_dispatch(Context& ctx, const Batch& b, const std::vector<int32_t>& exec,
                    const Topology& topo, bool timed, bool optional_outputs) {
  const int G = topo.num_ranks(), N = topo.num_nodes();
  const int64_t T = b.num_tokens();
  Row row;
  row.kernel = "dispatch";
  row.input = b.name;
  row.shape = std::to_string(N) + "x" + std::to_string(topo.ranks_per_node()) + " K" +
              std::to_string(b.top_k) + " T" + std::to_string(T) +
              (optional_outputs ? " all outputs" : " counts+offsets");
  const double t0 = now_ms();
  const auto cpu = assign::dispatch_layout(exec, b.src, b.top_k, topo);
  row.cpu_ms = now_ms() - t0;
  row.bytes = 4.0 * T * b.top_k + 8.0 * (2 * G + N + 1);
  if (optional_outputs) row.bytes += 4.0 * T + 4.0 * T * b.top_k + 1.0 * T * G + 8.0 * G * G;
  if (ctx.opt.dry_run) {
    finish(ctx, std::move(row));
    return;
  }
  guarded(ctx, row, [&] {
    DeviceBuffer<int32_t> d_exec, d_src;
    d_exec.upload(exec);
    d_src.upload(b.src);
    DeviceBuffer<int64_t> rank_counts(G), node_counts(N), rank_offsets(G + 1),
        pair_counts(static_cast<size_t>(G) * G);
    DeviceBuffer<int32_t> slot(exec.size());
    DeviceBuffer<uint8_t> token_in_rank(static_cast<size_t>(T) * G);
    DispatchLayoutOutputs out;
    out.rank_counts = rank_counts.get();
    out.node_counts = node_counts.get();
    out.rank_offsets = rank_offsets.get();
    if (optional_outputs) {
      out.slot = slot.get();
      out.token_in_rank = token_in_rank.get();
      out.pair_counts = pair_counts.get();
    }
    const size_t ws_bytes = dispatch_layout_workspace_bytes(T, G);
    DeviceBuffer<unsigned char> ws(ws_bytes);
    auto call = [&] {
      dispatch_layout(d_exec.get(), d_src.get(), T, b.top_k, N, G, out, ws.get(), ws_bytes,
                      ctx.stream);
    };
    auto compare = [&] {
      cuda_ok(cudaStreamSynchronize(ctx.stream), "dispatch_layout");
      int64_t bad = count_mismatches(rank_counts.download(), cpu.rank_counts, "rank_counts") +
                    count_mismatches(node_counts.download(), cpu.node_counts, "node_counts") +
                    count_mismatches(rank_offsets.download(), cpu.rank_offsets, "rank_offsets");
      if (optional_outputs) {
        bad += count_mismatches(pair_counts.download(), cpu.pair_counts, "pair_counts") +
               count_mismatches(slot.download(), cpu.slot, "slot") +
               count_mismatches(token_in_rank.download(), cpu.token_in_rank, "token_in_rank");
      }
      return bad;
    };
    ws.poison();
    rank_counts.poison();
    node_counts.poison();
    rank_offsets.poison();
    pair_counts.poison();
    slot.poison();
    token_in_rank.poison();
    check_then_time(ctx, row, call, compare, timed);
  });
  finish(ctx, std::move(row));
}

// --- TopoEP
// ----------------------------------------------------------------------------------------

void check_topoep(Context& ctx, const std::string& name, const plan::TopoEpInput& in, bool timed,
                  bool print) {
  const int G = in.topology.num_ranks(), E = in.num_experts, S = in.slots_per_rank;
  Row row;
  row.kernel = "topoep";
  row.input = name;
  row.shape = std::to_string(in.topology.num_nodes()) + "x" +
              std::to_string(in.topology.ranks_per_node()) + " E" + std::to_string(E) + " S" +
              std::to_string(S);
  const double t0 = now_ms();
  const plan::TopoEpPlan cpu = plan::solve_topoep(in);
  row.cpu_ms = now_ms() - t0;
  row.bytes = 8.0 * G * E + 4.0 * G * S + 16.0 * cpu.quotas.size() + 8.0 * (2 * G + 1);
  row.note = std::to_string(cpu.quotas.size()) + " quotas, " +
             std::to_string(cpu.stats.num_inter_node_replicas) + "+" +
             std::to_string(cpu.stats.num_intra_node_replicas) + " replicas, " +
             std::to_string(cpu.stats.num_refinement_moves) + " moves";
  if (ctx.opt.dry_run) {
    finish(ctx, std::move(row), print);
    return;
  }
  guarded(ctx, row, [&] {
    DeviceBuffer<int64_t> demand;
    demand.upload(std::vector<int64_t>(in.demand.begin(), in.demand.end()));
    TopoEpDeviceInput din;
    din.num_nodes = in.topology.num_nodes();
    din.num_ranks = G;
    din.num_experts = E;
    din.slots_per_rank = S;
    din.token_bytes = in.token_bytes;
    din.expert_param_bytes = in.expert_param_bytes;
    din.demand = demand.get();
    // The CPU solver has no cap on refinement moves; the GPU's move log holds max_moves_per_node
    // per node (status 2 beyond): room for every move the CPU made, so the two are comparable.
    din.max_moves_per_node =
        std::max<int>(din.max_moves_per_node, static_cast<int>(cpu.stats.num_refinement_moves) + 1);
    const int64_t capacity = topoep_quota_capacity(G, S);
    DeviceBuffer<int32_t> slots(static_cast<size_t>(G) * S), status(1);
    DeviceBuffer<int64_t> offsets(G + 1), loads(G), stats(4);
    DeviceBuffer<TopoEpDeviceQuota> quotas(static_cast<size_t>(capacity));
    TopoEpDeviceOutput out;
    out.slots = slots.get();
    out.source_offsets = offsets.get();
    out.quotas = quotas.get();
    out.quota_capacity = capacity;
    out.rank_loads = loads.get();
    out.stats = stats.get();
    out.status = status.get();
    const size_t ws_bytes = topoep_workspace_bytes(din);
    DeviceBuffer<unsigned char> ws(ws_bytes);
    auto call = [&] { solve_topoep(din, out, ws.get(), ws_bytes, ctx.stream); };
    auto compare = [&] {
      cuda_ok(cudaStreamSynchronize(ctx.stream), "solve_topoep");
      const int32_t code = status.download()[0];
      int64_t bad = code != 0 ? 1 : 0;
      if (code != 0) std::fprintf(stderr, "  topoep status %d\n", code);
      bad += count_mismatches(slots.download(), cpu.slots, "slots") +
             count_mismatches(offsets.download(), cpu.source_offsets, "source_offsets") +
             count_mismatches(loads.download(), cpu.rank_loads, "rank_loads");
      const std::vector<int64_t> cpu_stats = {
          cpu.stats.num_inter_node_replicas, cpu.stats.num_intra_node_replicas,
          cpu.stats.num_refinement_moves, cpu.stats.num_dropped_replicas};
      bad += count_mismatches(stats.download(), cpu_stats, "stats");
      auto gq = quotas.download();
      gq.resize(std::min<size_t>(gq.size(), cpu.quotas.size()));
      int64_t bad_quotas = gq.size() == cpu.quotas.size() ? 0 : 1;
      for (size_t i = 0; i < gq.size(); ++i) {
        if (gq[i].expert != cpu.quotas[i].expert || gq[i].dst != cpu.quotas[i].dst ||
            gq[i].count != cpu.quotas[i].count) {
          if (bad_quotas < 3) {
            std::fprintf(stderr, "  quota %zu: gpu (%d,%d,%lld) cpu (%d,%d,%lld)\n", i,
                         gq[i].expert, gq[i].dst, static_cast<long long>(gq[i].count),
                         cpu.quotas[i].expert, cpu.quotas[i].dst,
                         static_cast<long long>(cpu.quotas[i].count));
          }
          ++bad_quotas;
        }
      }
      return bad + bad_quotas;
    };
    ws.poison();  // the solver must not read workspace it did not write
    slots.poison();
    offsets.poison();
    loads.poison();
    stats.poison();
    status.poison();
    quotas.poison();
    check_then_time(ctx, row, call, compare, timed);
  });
  finish(ctx, std::move(row), print);
}

plan::TopoEpInput topoep_input(const Topology& topo, int experts, int extra, double token_bytes,
                               double param_bytes, const std::vector<int64_t>& demand) {
  plan::TopoEpInput in;
  in.topology = topo;
  in.num_experts = experts;
  in.slots_per_rank = (experts + topo.num_ranks() - 1) / topo.num_ranks() + extra;
  in.token_bytes = token_bytes;
  in.expert_param_bytes = param_bytes;
  in.demand = demand;
  return in;
}

}  // namespace cobalt::cuda::check
