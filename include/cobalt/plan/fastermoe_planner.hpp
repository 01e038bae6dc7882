// FasterMoE's dynamic shadowing (He et al., PPoPP'22; laekov/fastmoe,
// fmoe/fastermoe/shadow_policy.py `global_policy`). After gating, every worker knows every
// expert's task count. Sort experts by count, descending: B_0 >= B_1 >= ... The modelled latency
// with the k hottest experts shadowed (their parameters broadcast to every worker, so each worker
// computes its own tokens for them locally) is
//   lat(k) = 3 * comp * B_k + 4 * feat * B_k + k * model
// (B_k: the busiest remaining expert bounds the busiest worker; 3 = forward + two backward GEMMs,
// 4 = dispatch and combine, forward and backward). Walk k = 0, 1, ...: shadow the k-th hottest
// while lat(k + 1) < lat(k), stop at the first step that does not improve. The last expert is never
// shadowed (the loop in the original stops there).
//
// Simplifications (named; docs/peers.md): (1) counts are per-expert totals over sources, as in
// SmartMoE-AE's copy of the policy (upstream sums the gathered [workers, experts] matrix over
// experts, which indexes workers, not experts); (2) the constants come from PeerCostParams instead
// of FasterMoE's environment variables; (3) shadows must fit the shared replica budget: a shadow
// needs a free slot on every rank that lacks the expert, so only the longest prefix of the chosen
// list that fits is applied (FasterMoE itself has no slot limit).
#pragma once

#include <span>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/plan/peer_cost.hpp"

namespace cobalt::plan {

struct ShadowModel {
  double compute_s_per_token = 0;  // comp: forward GEMM time of one token through one expert
  double feature_s_per_token = 0;  // feat: one token's features over the per-GPU network share
  double model_s = 0;              // model: one expert's parameters over the network

  static ShadowModel from(const PeerCostParams& cost);
  // lat(k) above for a count B_k of the busiest remaining expert and k shadows.
  double latency(double busiest_remaining, int num_shadows) const {
    return (3 * compute_s_per_token + 4 * feature_s_per_token) * busiest_remaining +
           num_shadows * model_s;
  }
};

// The experts the cost model shadows, hottest first (ties: lower expert id first). expert_load [E].
std::vector<ExpertId> choose_shadows(std::span<const double> expert_load, const ShadowModel& model);

// Longest prefix of `shadows` that fits `base`: for each shadowed expert, every rank not holding
// it needs a free slot. Throws kInvalidArgument unless `shadows` are distinct experts of `base`
// (as shadow_layout does too).
int fitting_shadow_prefix(const ExpertLayout& base, std::span<const ExpertId> shadows);

// `base` plus a replica of each of `shadows` on every rank lacking it. Throws kFailedPrecondition
// when they do not fit (see fitting_shadow_prefix).
ExpertLayout shadow_layout(const ExpertLayout& base, std::span<const ExpertId> shadows);

}  // namespace cobalt::plan
