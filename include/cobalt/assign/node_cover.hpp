// Cobalt's communication-aware task assignment (paper §3.3, Algorithm 1; DESIGN.md §4).
//
// Per token t with source node s: experts with a replica on s run on s. For the rest, U_t, pick the
// smallest set of remote nodes covering U_t (minimum set cover), run each e in U_t on a node of
// that set holding it (uniform), then on a rank uniformly sampled from R_{e,n}. Every draw comes
// from the counter-based RNG keyed by (seed, step, layer, token_offset + t, k), so any token
// subset, thread count or device reproduces the same ranks.
//
// When several minimum covers tie, the paper does not say which to take. Taking the first in
// (popcount, value) order, as earlier versions did, sends the ties to the lowest node ids (node 0
// carried 1.2-1.36x its share on 4-node clusters; docs/cobalt-improvements.md). The cover is
// instead drawn uniformly among the tied ones:
//   - the mask search (kMaskEnumeration, and kAuto on N <= 8): the minimum feasible remote masks
//     in value order, the r-th taken, r = uniform_below(cover_hash_from_token(token hash), count)
//     (core/rng.hpp; no draw when one cover is minimum);
//   - the subset search (kSubsetDp, and kAuto above 8 nodes): the same draw when one node covers
//     U_t (among the nodes that do); above that its own order (the first minimum combination of
//     the distinct, non-dominated node sets at their lowest nodes) on node ids relabelled
//     cyclically from a remote node drawn with the same hash (start = src + 1 +
//     uniform_below(h, N - 1)), so no node is favoured, though the draw is not uniform among the
//     minimum covers.
// The number of remote nodes per token, and so every cross-node transfer, does not depend on it.
#pragma once

#include <cstdint>
#include <span>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/routing_batch.hpp"

namespace cobalt::assign {

// The largest top-k the node cover (and so assign_node_cover, assign_balanced_cover and the
// cobalt / cobalt+ policies) takes: the subset DP indexes a token's uncovered experts with 16-bit
// sets. A larger top-k is refused with kInvalidArgument.
inline constexpr int kMaxNodeCoverTopK = 16;

enum class CoverSearch {
  kMaskEnumeration,  // the paper's enumeration of (N-1)-bit node masks, O(2^(N-1)) per token
  kSubsetDp,         // exact DP over subsets of the <= K uncovered experts, O(2^|U_t| * covers)
  kAuto,             // masks for N <= 8, subset DP above
};

struct AssignKey {
  uint64_t seed = 0;
  int64_t step = 0;
  int layer = 0;
  int64_t token_offset = 0;  // index of the batch's first token within its step
};

// Which CPU code runs the assignment. Every choice writes the same ranks, bit for bit.
// The environment variable COBALT_CPU_KERNEL=portable makes kAuto choose kPortable (as oneDNN's
// ONEDNN_MAX_CPU_ISA caps its ISA), e.g. on CPUs that lower their clock for 512-bit work: measure
// both with `cobalt bench` (rows assign and assign_portable). Unset, empty or "auto": the default.
// Any other value makes kAuto throw kInvalidArgument naming it. The variable is read when the
// library loads and by reload_environment() (core/environment.hpp), not at each call.
enum class CpuKernel {
  kAuto,      // kAvx512 where it applies and the CPU has it, else kPortable
  kPortable,  // the loop compiled for the build's baseline target (x86-64-v2 by default)
  kAvx512,    // AVX-512: with the mask search (N <= 8 only), one token's tasks per register;
              // with the subset search (kSubsetDp, or kAuto above 8 nodes), the cover's
              // candidate sets in byte lanes. Needs K <= 8 and avx512_kernel_available(), else
              // assign_node_cover throws
};

struct AssignOptions {
  CoverSearch search = CoverSearch::kAuto;
  int num_threads =
      1;  // 0: one per core; negative: kInvalidArgument; the ranks do not depend on it
  CpuKernel kernel = CpuKernel::kAuto;
};

// True when this build has the AVX-512 assignment kernel and this CPU and OS run it (AVX-512 F,
// DQ, VL and BW, BMI2, and the OS saves the zmm state).
bool avx512_kernel_available();

// The kernel assign_node_cover runs for `options` on N = num_nodes, K = top_k: kPortable or
// kAvx512, never kAuto. Throws kInvalidArgument for N outside [1, 64] or K outside [1, 16], and as
// assign_node_cover does for an explicit kAvx512 it cannot run.
CpuKernel resolve_kernel(const AssignOptions& options, int num_nodes, int top_k);

// Writes exec_rank [T, K]. Throws kInvalidArgument when sizes disagree, the layout's E or G
// differ from the batch's, or options.kernel is kAvx512 for a shape or search it does not cover;
// kFailedPrecondition when options.kernel is kAvx512 and avx512_kernel_available() is false.
void assign_node_cover(const RoutingBatch& batch, const ExpertLayout& layout, const AssignKey& key,
                       const AssignOptions& options, std::span<RankId> exec_rank);

// Step 1 of Algorithm 1 alone: the remote nodes chosen for each token, covers [T] as node masks (0
// when every expert of the token is on its source node). The same covers assign_node_cover uses
// with the same key (ties drawn as there); options.kernel is resolved (and rejected) as there, and
// as there the mask search is refused above 20 nodes and a layout whose E or G differ from the
// batch's is rejected.
void remote_node_covers(const RoutingBatch& batch, const ExpertLayout& layout, const AssignKey& key,
                        const AssignOptions& options, std::span<uint64_t> covers);

// The simple reference of the faithful variant (what kMaskEnumeration must reproduce bit for bit):
// per token, enumerate every node mask in numeric order, collect the feasible ones with the fewest
// nodes and draw one as above; single-threaded, N <= 20. For tests and for checking other
// implementations (GPU kernels).
void assign_node_cover_reference(const RoutingBatch& batch, const ExpertLayout& layout,
                                 const AssignKey& key, std::span<RankId> exec_rank);

// Size of a minimum set of remote nodes covering the experts of `experts` not held on `src_node`
// (exact, by the subset DP). For tests and analysis. Throws kInvalidArgument for more than
// kMaxNodeCoverTopK experts, an expert outside [0, E) or a node outside [0, N). Runs the kernel
// kAuto resolves to, so it reads COBALT_CPU_KERNEL (and throws kInvalidArgument for a value that
// names no kernel).
int min_remote_cover_size(std::span<const ExpertId> experts, NodeId src_node,
                          const ExpertLayout& layout);

}  // namespace cobalt::assign
