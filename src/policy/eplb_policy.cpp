// DeepSeek-EPLB as deployed by vLLM: every P steps (steps_per_global_plan), plan the layout with
// rebalance_experts (plan/eplb.hpp) from the EMA of expert loads; between plans the layout is
// fixed and tokens are split over an expert's replicas by vLLM's rule.
//
// Choices (named, with their reasons):
//   - Loads: EMA of per-step expert task counts (decay = ema_decay; the first update initialises,
//     as RoutingStats does). vLLM sums a sliding window of recent steps instead; both are "recent
//     history", the EMA is what every history-based policy here uses.
//   - Budget: num_replicas = G * slots_per_rank, i.e. every slot holds a physical expert (EPLB
//     requires num_replicas % gpus == 0; this is the largest such count the slots allow).
//   - Groups: 1. vLLM and SGLang pass the model's expert-group count and 1 for models without
//     groups; our traces carry no groups, so the global policy applies on multi-node clusters (on
//     one node, one group over one node is the same computation).
//   - Placement: physical expert p lives on GPU p / (R / G). EPLB can put two replicas of one
//     expert on one GPU (it packs by load only); a rank holds at most one replica of an expert
//     here, so such a pair becomes one replica (the spare slot stays empty) that runs both shares
//     — the same rank loads as EPLB's physical experts.
//   - Token split (vLLM's default, eplb_map_to_physical): a task's replica index is its flat
//     position in its source rank's local top-k array modulo the expert's replica count:
//     replica = (local_token_index * K + k) mod logcnt[e], physical = log2phy[e][replica]. Here
//     local_token_index counts the call's tokens of the same source rank in index order (per
//     forward pass, as vLLM's: micro-batches of a step each count from 0).
//   - Load-only traces: each (source, expert) count is split evenly over the replicas,
//     floor(c / n) each and the c mod n leftover tasks to replicas (s + i) mod n, i < c mod n.
//   - Before the first plan (step 0, no history) the layout is static EP with one replica each.
//   - Micro-batches (a step given in several calls): a plan is due only at a step's first call, so
//     the layout does not move within a step, and the later calls fold their counts into the
//     step's EMA update (one observation per step, whatever its number of calls).
#include <algorithm>
#include <numeric>

#include "cobalt/core/error.hpp"
#include "cobalt/plan/eplb.hpp"
#include "demand_matrix.hpp"
#include "policy_registry.hpp"
#include "wall_timer.hpp"

namespace cobalt::policy {
namespace {

class EplbPolicy final : public Policy {
 public:
  explicit EplbPolicy(const PolicyConfig& config) : config_(config) {
    const int num_experts = config.num_experts;
    for (int l = 0; l < config.num_layers; ++l) {
      LayerState st;
      st.ema_load.assign(num_experts, 0.0);
      st.layout = std::make_shared<const ExpertLayout>(
          ExpertLayout::static_ep(config.topology, num_experts, config.slots_per_rank));
      st.replica_offsets.resize(num_experts + 1);
      for (ExpertId e = 0; e <= num_experts; ++e) st.replica_offsets[e] = e;
      for (ExpertId e = 0; e < num_experts; ++e) {
        st.replica_ranks.push_back(st.layout->ranks_of(e)[0]);
      }
      layers_.push_back(std::move(st));
    }
  }

  std::string name() const override { return "eplb"; }
  bool needs_token_ids() const override { return false; }

  std::shared_ptr<const ExpertLayout> do_run(int64_t step, int layer, const RoutingBatch& batch,
                                             std::span<RankId> exec_rank) override {
    LayerState& st = state(layer);
    COBALT_CHECK_ARG(batch.num_experts() == config_.num_experts &&
                         batch.num_ranks() == config_.topology.num_ranks(),
                     "policy eplb: batch has {} experts on {} ranks, configured for {} on {}",
                     batch.num_experts(), batch.num_ranks(), config_.num_experts,
                     config_.topology.num_ranks());
    begin_call(st, step);
    // vLLM: replica = (local flat position) mod replica count.
    const int top_k = batch.top_k();
    local_index_.assign(config_.topology.num_ranks(), 0);
    expert_counts_.assign(config_.num_experts, 0);
    for (TokenIdx t = 0; t < batch.num_tokens(); ++t) {
      const int64_t base = local_index_[batch.source_of(t)]++ * top_k;
      auto experts = batch.experts_of(t);
      for (int k = 0; k < top_k; ++k) {
        const ExpertId e = experts[k];
        const int32_t begin = st.replica_offsets[e];
        const int32_t count = st.replica_offsets[e + 1] - begin;
        exec_rank[static_cast<size_t>(t) * top_k + k] =
            st.replica_ranks[begin + static_cast<int32_t>((base + k) % count)];
        expert_counts_[e] += 1;
      }
    }
    update_ema(st, step);
    return st.layout;
  }

  std::shared_ptr<const ExpertLayout> do_run_loads(int64_t step, int layer,
                                                   std::span<const int64_t> counts,
                                                   std::span<int64_t> rank_loads) override {
    LayerState& st = state(layer);
    const int num_ranks = config_.topology.num_ranks(), num_experts = config_.num_experts;
    check_counts(counts, num_ranks, num_experts, "eplb");
    COBALT_CHECK_ARG(rank_loads.size() == static_cast<size_t>(num_ranks),
                     "policy eplb: rank_loads has {} entries, expected {}", rank_loads.size(),
                     num_ranks);
    begin_call(st, step);
    std::fill(rank_loads.begin(), rank_loads.end(), 0);
    expert_counts_.assign(num_experts, 0);
    for (RankId s = 0; s < num_ranks; ++s) {
      for (ExpertId e = 0; e < num_experts; ++e) {
        const int64_t c = counts[static_cast<size_t>(s) * num_experts + e];
        if (c == 0) continue;
        expert_counts_[e] += c;
        const int32_t begin = st.replica_offsets[e];
        const int32_t n = st.replica_offsets[e + 1] - begin;
        for (int32_t j = 0; j < n; ++j) {
          const int64_t extra = ((j - s % n) + n) % n < c % n ? 1 : 0;
          rank_loads[st.replica_ranks[begin + j]] += c / n + extra;
        }
      }
    }
    update_ema(st, step);
    return st.layout;
  }

 private:
  struct LayerState {
    std::vector<double> ema_load;  // [E]
    int64_t num_updates = 0;
    int64_t last_plan_step = -1;
    int64_t last_call_step = -1;    // the step of the last call
    int64_t last_update_step = -1;  // the step of the last EMA update
    double last_update_keep = 0.0;  // the decay that update applied
    std::shared_ptr<const ExpertLayout> layout;
    // Replica ranks per expert in log2phy order: replica_ranks[replica_offsets[e] + j] is the GPU
    // of log2phy[e][j]. replica_offsets: [E + 1].
    std::vector<int32_t> replica_offsets;
    std::vector<RankId> replica_ranks;
  };

  LayerState& state(int layer) {
    COBALT_CHECK_ARG(layer >= 0 && layer < config_.num_layers,
                     "policy eplb: layer {} out of range [0, {})", layer, config_.num_layers);
    return layers_[layer];
  }

  void update_ema(LayerState& st, int64_t step) {
    // A call without tasks is no observation (the first update initialises the EMA).
    if (std::all_of(expert_counts_.begin(), expert_counts_.end(),
                    [](int64_t c) { return c == 0; })) {
      return;
    }
    if (st.last_update_step == step) {
      // A later micro-batch of the step: keep * prev + (1 - keep) * (c + d) is the update so far
      // plus (1 - keep) * d.
      for (size_t e = 0; e < st.ema_load.size(); ++e) {
        st.ema_load[e] += (1.0 - st.last_update_keep) * static_cast<double>(expert_counts_[e]);
      }
      return;
    }
    const double keep = st.num_updates == 0 ? 0.0 : config_.ema_decay;
    for (size_t e = 0; e < st.ema_load.size(); ++e) {
      st.ema_load[e] =
          keep * st.ema_load[e] + (1.0 - keep) * static_cast<double>(expert_counts_[e]);
    }
    st.num_updates += 1;
    st.last_update_step = step;
    st.last_update_keep = keep;
  }

  // Replans when due, at a step's first call only. The layer's state changes only once the plan
  // is made (a plan that throws, e.g. past the memory budget, leaves it due for a retry).
  void begin_call(LayerState& st, int64_t step) {
    const bool first_call = step != st.last_call_step;
    const bool due =
        first_call && st.num_updates > 0 &&
        (st.last_plan_step < 0 || step - st.last_plan_step >= config_.steps_per_global_plan);
    if (due) replan(st, step);
    st.last_call_step = step;
  }

  void replan(LayerState& st, int64_t step) {
    WallTimer timer(counters_.planner_wall_ms);
    const Topology& topo = config_.topology;
    const int num_ranks = topo.num_ranks(), num_experts = config_.num_experts;
    const int slots = config_.slots_per_rank, num_replicas = num_ranks * slots;
    const auto r = plan::rebalance_experts(st.ema_load, 1, num_experts, num_replicas, 1,
                                           topo.num_nodes(), num_ranks);
    // Layout: GPU g holds physical experts [g * slots, (g + 1) * slots), duplicates merged.
    std::vector<ExpertId> layout_slots(static_cast<size_t>(num_ranks) * slots, kEmptySlot);
    for (RankId g = 0; g < num_ranks; ++g) {
      int used = 0;
      for (int p = g * slots; p < (g + 1) * slots; ++p) {
        const ExpertId e = r.phy2log_at(0, p);
        ExpertId* row = layout_slots.data() + static_cast<size_t>(g) * slots;
        if (std::find(row, row + used, e) == row + used) row[used++] = e;
      }
    }
    auto layout =
        std::make_shared<const ExpertLayout>(topo, num_experts, slots, std::move(layout_slots));
    std::vector<int32_t> replica_offsets(num_experts + 1, 0);
    std::vector<RankId> replica_ranks;
    for (ExpertId e = 0; e < num_experts; ++e) {
      const int cnt = r.logcnt_at(0, e);
      for (int j = 0; j < cnt; ++j) replica_ranks.push_back(r.log2phy_at(0, e, j) / slots);
      replica_offsets[e + 1] = replica_offsets[e] + cnt;
    }
    st.replica_offsets = std::move(replica_offsets);
    st.replica_ranks = std::move(replica_ranks);
    st.last_plan_step = step;
    if (!(*layout == *st.layout)) {
      const LayoutDiff moves = diff(*st.layout, *layout);
      counters_.cross_node_moves += moves.num_cross_node;
      counters_.intra_node_moves += moves.num_intra_node;
      counters_.num_global_plans += 1;
    }
    st.layout = std::move(layout);
  }

  PolicyConfig config_;
  std::vector<LayerState> layers_;
  std::vector<int64_t> local_index_;    // [G] tokens seen per source rank this call
  std::vector<int64_t> expert_counts_;  // [E] this step's task counts
};

}  // namespace

std::unique_ptr<Policy> make_eplb_policy(const PolicyConfig& config) {
  return std::make_unique<EplbPolicy>(config);
}

}  // namespace cobalt::policy
