// TopoEP's per-microbatch solver on the GPU: the same plan as plan::TopoEpSolver::solve (rules and
// tie-breaks in cobalt/plan/topoep_solver.hpp), bitwise: slots, quotas (grouped by source rank,
// sorted by (expert, dst)), source offsets, rank loads and stats equal the CPU plan's.
//
// Kernels (all on one stream, no host synchronisation):
//   1. one block per node: node demand D, stage (1) candidates ranked by (D desc, id asc), as
//      many as the node has free slots placed where "least occupied rank (mains included), ties
//      lower" puts them: one on each rank with fewer mains, then round-robin over the node's
//      ranks; main instances initialised;
//   2. one thread per expert: stage (2) routing (instance loads, rank loads);
//   3. one warp per node: stage (3) refinement, the node's state in shared memory; each step the
//      warp scores all (expert on the busiest rank, target) candidates and reduces with the CPU's
//      total order, and records the move;
//   4. one warp per expert: its (src, instance) quota matrix, regenerating stage (2)'s quotas and
//      replaying the expert's moves with the CPU's source-selection passes over the same work
//      list; replicas left without tasks dropped;
//   5.-6. one warp per source rank: its non-zero quotas counted, then written at its offset;
//   7. one thread per rank: the slot table.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cobalt/cuda/common.hpp"

namespace cobalt::cuda {

struct TopoEpDeviceInput {
  int num_nodes = 1;
  int num_ranks = 1;  // G, a multiple of num_nodes
  int num_experts = 0;
  int slots_per_rank = 0;           // S >= ceil(E / G)
  double token_bytes = 0;           // S_tok
  double expert_param_bytes = 0;    // |W_e|
  const int64_t* demand = nullptr;  // Omega [G, E] (device)
  int max_moves_per_node = 4096;    // capacity of the stage (3) move log (status 2 when exceeded)
};

// Same layout as plan::TopoEpQuota (the source is implied by the group).
struct TopoEpDeviceQuota {
  int32_t expert;
  int32_t dst;
  int64_t count;
};

// Status codes written to TopoEpDeviceOutput::status.
enum TopoEpStatus : int32_t {
  kTopoEpOk = 0,
  kTopoEpNegativeDemand = 1,  // Omega holds a negative value (the CPU throws kInvalidArgument)
  kTopoEpMovesOverflow = 2,   // more refinement moves on a node than max_moves_per_node
  kTopoEpQuotasOverflow = 4,  // more quotas than quota_capacity
  kTopoEpInternal = 8,        // an invariant failed (a bug)
};

struct TopoEpDeviceOutput {
  int32_t* slots = nullptr;             // [G, S]
  int64_t* source_offsets = nullptr;    // [G + 1]: source s owns quotas[o[s] .. o[s + 1])
  TopoEpDeviceQuota* quotas = nullptr;  // [quota_capacity]
  int64_t quota_capacity = 0;           // topoep_quota_capacity() always suffices
  int64_t* rank_loads = nullptr;        // [G]
  int64_t* stats = nullptr;             // [4]: inter-node replicas, intra-node replicas,
                                        //      refinement moves, dropped replicas
  int32_t* status = nullptr;            // [1]: bitwise OR of TopoEpStatus codes, 0 when the
                                        //      plan is valid (read it before using the plan)
};

// An upper bound on the number of quotas: G * G * S.
int64_t topoep_quota_capacity(int num_ranks, int slots_per_rank);

size_t topoep_workspace_bytes(const TopoEpDeviceInput& input);

// Throws kInvalidArgument for shapes the CPU solver rejects (E < 1, S < ceil(E / G), G not a
// multiple of N, N > 64) or a too-small workspace. Value errors found on the device (negative
// demand) are reported through output.status.
void solve_topoep(const TopoEpDeviceInput& input, const TopoEpDeviceOutput& output, void* workspace,
                  size_t workspace_bytes, Stream stream);

}  // namespace cobalt::cuda
