// RoutingStats: running statistics of routing decisions for one MoE layer —
//   w_e   expert task counts                  [E]
//   c_ij  tokens selecting both i and j        [E, E] symmetric, zero diagonal
// either as an exponential moving average over updates (ema = decay * ema + (1 - decay) * batch;
// the first update initialises ema = batch so early estimates are not biased towards zero) or as
// exact sums (for tests and offline analysis). Memory is O(E^2), independent of the tokens per
// update (an update with several threads also holds their count matrices while it runs:
// count_routing).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/routing_batch.hpp"

namespace cobalt {

// Exact counts of one batch: loads [E] and co-activation [E, E] (symmetric, zero diagonal).
// Multithreaded over tokens (num_threads 0: one per core; negative: kInvalidArgument); integer
// sums, so the result is identical for any thread count. Each thread after the first takes
// 65536 tokens or more and its own [E, E] int64 matrix (fewer threads when these would pass half
// of memory_budget_bytes(), core/memory.hpp).
void count_routing(const RoutingBatch& batch, std::span<int64_t> expert_counts,
                   std::span<int64_t> coactivation, int num_threads = 1);
// The same counts by the definition (every ordered pair of a token's experts, one thread): what
// count_routing is tested against.
void count_routing_reference(const RoutingBatch& batch, std::span<int64_t> expert_counts,
                             std::span<int64_t> coactivation);

class RoutingStats {
 public:
  // decay in [0, 1): weight of history per update. exact = true ignores decay and sums.
  RoutingStats(int num_experts, double decay, bool exact = false);
  static RoutingStats exact_counts(int num_experts) { return RoutingStats(num_experts, 0.0, true); }

  // Adds a batch's counts. A batch without tasks is no observation: nothing changes and
  // num_updates() does not count it.
  void update(const RoutingBatch& batch, int num_threads = 1);
  // Adds a batch's counts to the last update's observation instead of making a new one: the
  // micro-batches of one step folded into that step (ema = decay * ema_before + (1 - decay) *
  // (c_1 + c_2 + ...), or their plain sum for the first observation and exact counts), which is
  // what update() with their concatenation gives, up to rounding. num_updates() is unchanged.
  // With no update yet, the same as update().
  void fold_into_last_update(const RoutingBatch& batch, int num_threads = 1);
  // Adds pre-computed batch counts (same shapes as count_routing's outputs; all-zero: ignored).
  // Throws kInvalidArgument for a negative count, an asymmetric co-activation matrix, a non-zero
  // diagonal, or c_ij above min(w_i, w_j) (counts no batch can make), naming the first such entry.
  void update_counts(std::span<const int64_t> expert_counts, std::span<const int64_t> coactivation);

  int num_experts() const { return num_experts_; }
  int64_t num_updates() const { return num_updates_; }
  double decay() const { return decay_; }
  bool exact() const { return exact_; }
  std::span<const double> expert_load() const { return expert_load_; }    // [E]
  std::span<const double> coactivation() const { return coactivation_; }  // [E, E]
  double coactivation(ExpertId i, ExpertId j) const {
    return coactivation_[static_cast<size_t>(i) * num_experts_ + j];
  }
  // Ochiai(i, j) = c_ij / sqrt(w_i w_j); 0 when either load is 0.
  double ochiai(ExpertId i, ExpertId j) const;

 private:
  // A batch's counts into scratch_loads_ / scratch_coact_ (update and fold_into_last_update).
  void count_into_scratch(const RoutingBatch& batch, int num_threads);
  // The EMA (or exact sum) step of update and update_counts, on counts known to be valid; `fold`
  // adds to the last observation (fold_into_last_update).
  void add_counts(std::span<const int64_t> expert_counts, std::span<const int64_t> coactivation,
                  bool fold = false);

  int num_experts_;
  double decay_;
  bool exact_;
  int64_t num_updates_ = 0;
  double last_add_ = 1.0;  // the weight of the last observation's counts
  std::vector<double> expert_load_;
  std::vector<double> coactivation_;
  std::vector<int64_t> scratch_loads_;
  std::vector<int64_t> scratch_coact_;
};

// The two co-activation summaries of DESIGN.md §3.3 (plain mean over pairs is dominated by chance).
struct OchiaiSummary {
  double count_weighted = 0;  // sum_{i<j} c_ij Ochiai(i,j) / sum_{i<j} c_ij (0 without pairs)
  double top_partner = 0;     // sum_i w_i max_j Ochiai(i,j) / sum_i w_i
};
// Loads and co-activations must be finite and >= 0 (kInvalidArgument naming the first that is not).
OchiaiSummary summarize_ochiai(std::span<const double> expert_load,
                               std::span<const double> coactivation);

// Fraction of the `hot_count` most loaded experts of `prev` that are not among those of `next`
// (TopoEP's hot-set churn). Ties broken by lower expert id; a hot_count above E takes all E.
// kInvalidArgument when the sizes differ, hot_count < 1 or a load is not finite and >= 0.
double hot_set_churn(std::span<const double> prev_load, std::span<const double> next_load,
                     int hot_count);

// EMA loads of replicas, keyed by (rank, slot) of the layout in force: the quantity Cobalt's
// stage 2 balances (the `cobalt` policy keeps the same average in its own per-layer state; this
// class serves callers outside a policy, e.g. the Python bindings). kInvalidArgument for G outside
// [1, 8192], S outside [1, 65536], a decay outside [0, 1), a load that is not finite and >= 0 or a
// negative count.
class ReplicaLoads {
 public:
  ReplicaLoads(int num_ranks, int slots_per_rank, double decay);
  // Initialise (or re-key after a layout change) from expected per-replica loads [G, S].
  void reset(std::span<const double> expected_loads);
  // Adds one step's task counts per replica [G, S].
  void update(std::span<const int64_t> replica_counts);
  std::span<const double> loads() const { return loads_; }  // [G, S]

 private:
  int num_ranks_;
  int slots_per_rank_;
  double decay_;
  std::vector<double> loads_;
};

// Task counts per replica slot [G, S] of an assignment on a layout: task (t, e) on rank r counts
// for the slot of r holding e. kInvalidArgument when the sizes or E disagree, or naming the first
// task whose rank is out of range or does not hold its expert.
std::vector<int64_t> replica_task_counts(const RoutingBatch& batch, const ExpertLayout& layout,
                                         std::span<const RankId> exec_rank);

}  // namespace cobalt
