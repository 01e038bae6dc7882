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

// What replacing `current` (main instances current_mains [E]) by `candidate` gains, in modelled
// seconds, over amortisation_steps (>= 1) steps: the busiest rank's tasks it saves per step
// (saved_tasks_per_step) times the compute time of a task, less the gradient synchronisation it
// adds per step, times amortisation_steps, less the time of its copies (replica parameters, and
// optimizer state of moved main instances).
double change_gain_s(const ExpertLayout& current, std::span<const RankId> current_mains,
                     const ExpertLayout& candidate, double saved_tasks_per_step,
                     int64_t amortisation_steps, const eval::CostParams& params);

// change_gain_s > 0: cobalt+'s test for its stage-2 moves (amortised over the re-layout period)
// and stage-2b swaps (over their own step).
bool change_pays(const ExpertLayout& current, std::span<const RankId> current_mains,
                 const ExpertLayout& candidate, double saved_tasks_per_step,
                 int64_t amortisation_steps, const eval::CostParams& params);

// An upper bound of change_pays over every candidate that copies at least one replica and saves
// at most max_saved_tasks_per_step: it assumes the candidate removes all of current's gradient
// synchronisation and copies one expert's parameters over the faster link. false: no such
// candidate pays, so a search for one can be skipped (cobalt+ skips stage 2b's swap search with
// max_saved = the step's floor - ceil(tasks / G), the whole-task bound). Cost O(G S).
bool some_change_may_pay(const ExpertLayout& current, std::span<const RankId> current_mains,
                         double max_saved_tasks_per_step, int64_t amortisation_steps,
                         const eval::CostParams& params);

// The same layout with `slots_per_rank` >= layout.slots_per_rank() slots per rank: every slot
// keeps its position, the extra slots are empty.
ExpertLayout widen_slots(const ExpertLayout& layout, int slots_per_rank);

}  // namespace cobalt::policy
