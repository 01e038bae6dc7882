// LayerModel (private to the generator): the evolving structure of one MoE layer of a synthetic
// workload — popularity profile and its drifting rank -> expert permutation, co-activation groups,
// data domains — and StepSampler, the alias tables one step's tokens are drawn from.
#pragma once

#include <cstdint>
#include <vector>

#include "alias_table.hpp"
#include "cobalt/core/ids.hpp"
#include "cobalt/workload/spec.hpp"

namespace cobalt::workload {

// Everything a token of one (step, layer) needs; read-only while tokens are drawn.
struct StepSampler {
  double affinity = 0;       // p: probability a pick comes from the token's group
  double locality = 0;       // lambda: probability a draw is domain-local
  bool use_domains = false;  // lambda > 0 and D > 1
  AliasTable experts;        // popularity over all experts
  AliasTable groups;         // group ids weighted by the sum of their members' popularity
  std::vector<AliasTable> group_members;   // [num_groups] members weighted by popularity
  std::vector<int32_t> group_of;           // [E] group of each expert
  std::vector<int32_t> slot_in_group;      // [E] index of each expert in its group's table
  std::vector<AliasTable> domain_experts;  // [D] experts of the domain's groups (when use_domains)
  std::vector<AliasTable> domain_groups;   // [D] the domain's groups (when use_domains)
  std::vector<int32_t> domain_of_source;   // [R]
};

class LayerModel {
 public:
  // The structure of `layer` at step 0 (spec must be valid and outlive the model).
  LayerModel(const WorkloadSpec& spec, int layer);

  // Applies the drift between step - 1 and `step` (hot-set swaps, group churn). Call for steps
  // 1, 2, ... in order; the state after step s depends only on (spec, layer, s).
  void drift_to(int step);

  // Fills `out` for `step` from the current state.
  void build_sampler(int step, StepSampler& out) const;

  double zipf_exponent() const { return zipf_exponent_; }
  // Popularity weight of each expert in the current state: [E].
  std::vector<double> expert_weights() const;

 private:
  const WorkloadSpec& spec_;
  int layer_;
  double zipf_exponent_;
  std::vector<double> profile_;           // [E] weight of popularity rank i, decreasing
  std::vector<ExpertId> rank_expert_;     // [E] expert holding popularity rank i
  std::vector<int32_t> group_of_;         // [E] co-activation group of each expert
  std::vector<int32_t> domain_of_group_;  // [num_groups]
};

}  // namespace cobalt::workload
