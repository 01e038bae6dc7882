// Prices a candidate layout in modelled seconds per training step (one layer), with the
// simulator's cost model (cobalt/eval/cost_model.hpp), from a sample of recent routing:
//   layer      compute (busiest rank) and the 4 exchanges of the sample's assignment, scaled from
//              the sample's tokens to a full step's;
//   grad sync  the candidate's extra replicas reducing gradients into (and refreshing from) their
//              main instances, every step;
//   migration  the copies turning the layout in force into the candidate (replica parameters and,
//              for moved main instances, optimizer state), amortised over the re-layout period.
// cobalt+ uses it to choose among layouts planned with different replica budgets: a replica is
// worth its slot only when the transfers and imbalance it saves outweigh its gradient traffic.
#pragma once

#include <span>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/routing_batch.hpp"
#include "cobalt/eval/cost_model.hpp"

namespace cobalt::policy {

struct LayoutPrice {
  double layer_s = 0;      // compute + exchanges (with the cost model's overlap)
  double grad_sync_s = 0;  // per step
  double migration_s = 0;  // one-off, before amortisation
  double per_step_s = 0;   // layer + grad sync + migration / amortisation_steps
};

// sample: recent tokens, exec_rank [T', K] their assignment under `candidate`; step_scale: tokens
// of one real step / tokens in the sample (>= 0; the sample may span several steps); current_mains
// [E]: the main instance of every expert under `current` (eval::initial_main_ranks /
// next_main_ranks, as the simulator tracks them); amortisation_steps >= 1.
LayoutPrice price_layout(const RoutingBatch& sample, std::span<const RankId> exec_rank,
                         double step_scale, const ExpertLayout& current,
                         std::span<const RankId> current_mains, const ExpertLayout& candidate,
                         const eval::CostParams& params, int amortisation_steps);

// The same layout with `slots_per_rank` >= layout.slots_per_rank() slots per rank: every slot
// keeps its position, the extra slots are empty.
ExpertLayout widen_slots(const ExpertLayout& layout, int slots_per_rank);

}  // namespace cobalt::policy
