// UltraEP's per-microbatch quota placement (github.com/Dots-Infra/UltraEP,
// csrc/kernels/placement.cu, quota_placement_solve_kernel with its defaults), on the CPU.
//
// Every NVLink domain (a node here) is solved independently; replicas never leave the domain of
// their expert's master. Per domain (M ranks; each rank's masters are experts e with
// floor(e G / E) == rank; N_red = slots_per_rank - (its masters) replica slots on each rank: the
// kernel's slots_per_rank - E / G when G divides E; otherwise ranks hold floor or ceil(E / G)
// masters, and those with fewer get a replica slot more, which the kernel, assuming G | E, has no
// case for):
//   loads[e]     = tasks choosing e from every source rank (the exact post-gating load);
//   rank_load[r] = sum of the loads of r's masters.
//   Threshold search for the smallest per-rank cap T the greedy export oracle can meet:
//     lo = ceil(sum(rank_load) / M * max(balance_threshold, 1)), hi = max(max rank_load, lo)
//     (float32 arithmetic as in the kernel);
//     fast oracle: T = ceil(lo * (1 + oracle_eps)), up to 3 tries with the dynamic per-replica
//       floor, T += ceil(hi / 100) after each failure (capped at hi);
//     otherwise: binary search for the smallest T with total excess <= total slack, one try at
//       it, then the kernel's 4-probe (5-ary) search over [T + 1, hi] with the fixed floor
//       min_tokens_per_replica, and the plan at the threshold found.
//   Export oracle at T: excess[r] = max(rank_load - T, 0), slack[r] = max(T - rank_load, 0).
//     Source ranks in descending rank_load (ties: lower rank), each source's masters in
//     descending load (ties: lower id); while the source still has excess and the master has
//     tokens left (a master keeps >= 1 token unless allow_zero_master_quota), export
//     q = min(need, slack[t], available) tokens to the target t with the most slack among ranks
//     with free replica slots that do not hold the expert yet (ties: lower rank), provided
//     q >= the floor (fixed: min_tokens_per_replica; dynamic: ceil(need / feasible targets)).
//     Fails when a source keeps excess or total excess exceeds the remaining slack.
//   Instance quotas: the master keeps loads[e] - exported, each replica its q (integers).
//   Per-source split (quota_locality_aware = true, the default): each instance first takes its
//     host rank's own tokens (up to its quota); every source splits its remaining tokens over the
//     other instances in proportion to their remaining capacity, largest remainder first (ties:
//     lower host rank, then instance order). Each source rounds independently, so the realised
//     instance loads can differ from the quotas by a few tasks, as in UltraEP.
//   Token -> instance (reroute.cu, quota_reroute_interleave = true): the k-th task (index order)
//     of source s on expert e takes slot (k * stride + e mod n) mod n of its n tasks, where
//     stride is the first integer >= n / 2 + 1 coprime with n, and runs on the instance whose
//     prefix range of the source's allocations contains that slot.
//
// Simplifications (also in docs/peers.md): one CPU thread runs the kernel's warp-parallel search
// sequentially (same probes, same decisions); the kernel's size limits (512 experts, 72 GPUs, 512
// replicas per domain) are not imposed; E need not be a multiple of G (masters follow
// floor(e G / E), every rank gets N_red replica slots); only the default settings are reproduced
// (locality-aware split, interleaved reroute, batch of one target per export step).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/ids.hpp"
#include "cobalt/core/topology.hpp"

namespace cobalt::plan {

// UltraEP's tuning knobs (ultra_ep/config.py), with its defaults.
struct UltraEpOptions {
  double balance_threshold = 1.0;         // ULTRA_EP_BALANCE_THRESHOLD
  int64_t min_tokens_per_replica = 1024;  // ULTRA_EP_QUOTA_MIN_TOKENS_PER_REPLICA
  bool allow_zero_master_quota = false;   // ULTRA_EP_QUOTA_ALLOW_ZERO_MASTER_QUOTA
  double oracle_eps = 0.01;               // ULTRA_EP_QUOTA_ORACLE_EPS
};

struct UltraEpInput {
  Topology topology{1, 1};
  int num_experts = 0;
  int slots_per_rank = 0;           // masters + replica slots per rank
  std::span<const int64_t> demand;  // Omega [G, E]: tasks from rank s choosing expert e (>= 0)
  UltraEpOptions options;
};

struct UltraEpInstance {
  RankId rank;
  int64_t quota;
};

struct UltraEpPlan {
  int num_ranks = 0, num_experts = 0, slots_per_rank = 0;
  std::vector<ExpertId> slots;  // [G, S]: masters (ascending), then replicas in export order
  // Instances of expert e: instances[instance_offsets[e] .. instance_offsets[e + 1]), the master
  // first, then replicas in export order. instance_offsets: [E + 1].
  std::vector<int32_t> instance_offsets;
  std::vector<UltraEpInstance> instances;
  // Per-(source, expert) split over the expert's instances, for experts with > 1 instance:
  // alloc[alloc_index[s * E + e] + j] = tasks of (s, e) for instance j; alloc_index is -1 when
  // s sends nothing to e or e has a single instance (everything runs on the master).
  std::vector<int64_t> alloc_index;  // [G, E]
  std::vector<int64_t> alloc;
  std::vector<int64_t> rank_loads;  // [G] realised task counts
  std::vector<int64_t> thresholds;  // [N] the cap T each domain met
  int64_t num_replicas = 0;         // exports (temporary replicas) in all domains
  int64_t num_fast_oracle = 0;      // domains solved by the fast oracle
};

// The interleaved reroute of one (source, expert) pair with n tasks.
struct UltraEpInterleave {
  int64_t stride = 1, offset = 0, total = 0;
  // Slot of the task with this ordinal (0-based, index order) in [0, total).
  int64_t slot(int64_t ordinal) const {
    return total > 1 ? (ordinal * stride + offset) % total : ordinal;
  }
};
UltraEpInterleave ultraep_interleave(ExpertId expert, int64_t total);

// Throws cobalt::Error (kInvalidArgument) when num_experts < 1, demand is not [G, E], holds a
// negative value or sums past 2^52 tasks, slots_per_rank < ceil(E / G), or an option is out of
// range (balance_threshold not finite; oracle_eps not finite or < 0; min_tokens_per_replica < 0).
UltraEpPlan solve_ultraep(const UltraEpInput& input);

}  // namespace cobalt::plan
