// Internal to cobalt_gpu_check: each function runs one kernel on `b` (or the TopoEP input),
// compares every output element with the CPU reference (poisoned outputs catch unwritten elements),
// adds a row to ctx's table and, when `timed`, times it against the memory floor.
#pragma once

#include "gpu_check_support.hpp"

namespace cobalt::cuda::check {

const char* search_name(assign::CoverSearch s);
const char* method_name(StatsMethod m);

// Runs and checks the assignment; returns the CPU result (exec ranks) for later kernels.
std::vector<int32_t> check_assign(Context& ctx, const Batch& b, const ExpertLayout& layout,
                                  assign::CoverSearch search, bool timed, int64_t token_offset = 0,
                                  bool misaligned = false);
// The launchers' contract for an error left pending by an earlier CUDA call: refused with
// kFailedPrecondition naming it, before anything is enqueued, the error cleared; the retry then
// matches the CPU (check only).
void check_pending_error(Context& ctx, const Batch& b, const ExpertLayout& layout);
void check_stats(Context& ctx, const Batch& b, std::vector<StatsMethod> methods, bool timed);
void check_dispatch(Context& ctx, const Batch& b, const std::vector<int32_t>& exec,
                    const Topology& topo, bool timed, bool optional_outputs = true);
void check_topoep(Context& ctx, const std::string& name, const plan::TopoEpInput& in, bool timed,
                  bool print = true);
plan::TopoEpInput topoep_input(const Topology& topo, int experts, int extra, double token_bytes,
                               double param_bytes, const std::vector<int64_t>& demand);

}  // namespace cobalt::cuda::check
