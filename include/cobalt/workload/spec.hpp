// WorkloadSpec: the knobs of the synthetic routing-trace generator (workload/synthetic.hpp). Each
// knob is documented with the measured statistic it controls (statistics as defined in DESIGN.md
// §3.3 and computed by eval/trace_stats.hpp); docs/workloads.md has measured values.
//
// The generative model, per MoE layer (each layer has its own structure):
//   * popularity: expert weights pi_e follow a Zipf profile (rank i has weight (i+1)^-a); which
//     expert holds which rank is a permutation that drifts between steps (hot-set drift).
//   * co-activation groups: experts are partitioned into groups of `group_size` experts.
//   * data domains: the groups are split over `num_domains` domains (balanced by popularity);
//     source rank r belongs to domain floor(r * D / R).
//   * a token from source r picks a group j (weight sum_{e in j} pi_e; from its domain's groups
//     with probability `domain_locality`, else from all groups), then K distinct experts: each
//     pick comes from group j (weighted by pi, without replacement) with probability
//     `group_affinity`, otherwise from the popularity distribution (from its domain's experts with
//     probability `domain_locality`). A group with no unpicked member left falls back to the
//     popularity draw.
// Every random choice is a counter-based hash of (seed, step, layer, token, ...), so generation is
// deterministic per seed and independent of the thread count.
#pragma once

#include <cstdint>
#include <string>

namespace cobalt::workload {

// How popularity ranks map to expert ids at step 0.
enum class PopularityOrder {
  kShuffled,  // a random permutation per layer: hot experts are spread over the id space
  kById,  // expert i holds popularity rank i: hot experts are contiguous ids, so under static EP
          // (expert e on rank floor(e G / E)) they land on the same ranks (TopoEP-style
          // "expert-specific bias" synthetic routing: high rank-load imbalance)
};

struct WorkloadSpec {
  std::string name = "custom";  // recorded in the trace metadata (`workload`)

  // --- Shape ---
  int num_experts = 64;             // E in [2, 65536]
  int top_k = 8;                    // K in [1, min(E, 64)]
  int num_layers = 2;               // L in [1, 4096]: MoE layers, each with its own structure
  int num_steps = 20;               // S in [1, 10^6]
  int64_t tokens_per_step = 16384;  // T_s in [1, 2^31): tokens per step (all source ranks together)
  int num_sources = 8;              // R in [1, 65536]: source ranks; token i of a step comes from
                                    // rank floor(i * R / T_s) (contiguous blocks, data parallelism)
  uint64_t seed = 0;                // any value; same spec + seed => bitwise-identical trace

  // --- Expert-load skew ---
  // Zipf exponent a in [0, 4] of the popularity profile. Controls expert-load max/mean. Measured
  // per step with E=128, K=8, no groups, no drift: a=0.25 -> 2.4, 0.5 -> 5.3, 0.75 -> 9.5,
  // 1.0 -> 13.4, 1.5 -> 15.9 (capped at E/K = 16: a token picks an expert at most once); with
  // E=64: 0.5 -> 3.7, 0.75 -> 5.6, 1.0 -> 7.1. 0 = uniform (max/mean ~1 + noise). Heavy skew also
  // raises chance co-activation (hot experts meet often). Drift and co-activation lower the
  // whole-trace value (see group_mixing).
  double zipf_exponent = 0.0;
  // Per-layer spread s in [0, 1): layer l uses exponent a * (1 + s * u_l), with u_l in [-1, 1)
  // drawn per (seed, layer) from a Latin hypercube over the L layers (each layer its own stratum,
  // so the mean over layers is stable). Controls the spread of per-layer max/mean (TopoEP: 5-13
  // across 48 layers).
  double layer_skew_spread = 0.0;
  PopularityOrder popularity_order = PopularityOrder::kShuffled;
  // Hot block: the `hot_block_size` most popular ranks (in [0, E]) get `hot_block_weight` (in
  // [1, 1000]) times their Zipf weight. With kById order and hot_block_size = E / G this
  // concentrates load on static EP's first rank (TopoEP Fig. 10: no-balancing imbalance 8.39 on 32
  // ranks). 0 = off.
  int hot_block_size = 0;
  double hot_block_weight = 1.0;

  // --- Hot-set drift ---
  // Controls hot-set churn (fraction of the H hottest experts that change between adjacent steps;
  // TopoEP measures 0.16-0.20 for H = 8): measured churn ~ hot_churn plus sampling noise among
  // near-tied experts. Between adjacent steps about H * hot_churn of the H = `hot_count` most
  // popular ranks (a stratified count, so the mean over steps is exact) swap their expert with one
  // of the next min(2 H, E - H) ranks. Ranks are distinct; hot rank i is drawn with weight i + 1,
  // so the boundary of the hot set churns most and the hottest experts persist (whole-trace skew
  // stays close to the per-step skew). The two experts trade popularity and co-activation group, so
  // group and domain weights stay put and the hot set churns even when co-activation dominates the
  // loads.
  double hot_churn = 0.0;
  int hot_count = 8;  // H in [1, E] (H = E: no rank outside the hot set, so no drift)

  // --- Co-activation ---
  // Experts per co-activation group, in [1, E] (the last group may be smaller). Around K: a token
  // that takes all its picks from its group then selects (nearly) the whole group.
  int group_size = 8;
  // m in [0, 1]: how groups relate to popularity. Experts are sorted by (1 - m) * (popularity rank)
  // + m * E * u_e (u_e uniform) and cut into groups: m = 0 groups experts of neighbouring
  // popularity (hot experts co-activate with hot ones), m = 1 is a random partition. Controls how
  // much load skew survives strong co-activation: a token that takes its whole group gives every
  // member the group's load, so with m = 1 and p -> 1 load max/mean falls towards that of group
  // weights (~1-2).
  double group_mixing = 1.0;
  // Probability p in [0, 1] that each of a token's K picks comes from its group. Controls both
  // Ochiai summaries: with group_size = K, top-partner Ochiai ~ max(p^2, chance) and count-weighted
  // ~ p^4 + (1 - p^2) * chance, chance ~ (K - 1) / (E - 1) (more with heavy skew); hot-set drift
  // and group churn dilute the whole-trace values a little. 0 = independent picks.
  double group_affinity = 0.0;
  // Value of group_affinity at the last step, in [0, 1], or < 0 for "constant": p ramps linearly
  // from group_affinity (step 0) to this (step S-1) — co-activation strengthening over training
  // (Cobalt: Ochiai 0.3-0.4 -> 0.86-0.89).
  double final_group_affinity = -1.0;
  // Probability q in [0, 1] per expert and step of swapping groups with a random expert: about q*E
  // experts change group between adjacent steps (co-activated pairs change during training).
  double group_churn = 0.0;

  // --- Data-domain locality ---
  // D in [1, min(R, number of groups)]: data domains; source rank r belongs to domain
  // floor(r D / R) (neighbouring ranks share a domain, as when micro-batches are packed from one
  // domain).
  int num_domains = 1;
  // lambda in [0, 1]: probability that a token's group and each popularity pick come from its
  // domain's experts. Controls source locality (total-variation distance between a source's expert
  // distribution and the global one): ~ lambda * (1 - 1/D) for balanced domains; 0 = none.
  double domain_locality = 0.0;

  // Number of groups: ceil(E / group_size).
  int num_groups() const { return (num_experts + group_size - 1) / group_size; }
  // Total tokens T = S * T_s.
  int64_t num_tokens() const { return static_cast<int64_t>(num_steps) * tokens_per_step; }
  // group_affinity in force at `step` (the linear ramp when final_group_affinity >= 0).
  double affinity_at(int step) const;
};

// Throws cobalt::Error(kInvalidArgument) naming the first bad field, its value and the valid range;
// also rejects specs whose trace would exceed 2^32 expert ids (16 GiB).
void validate(const WorkloadSpec& spec);

const char* popularity_order_name(PopularityOrder order);

}  // namespace cobalt::workload
