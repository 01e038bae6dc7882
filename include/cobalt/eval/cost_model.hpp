// Cost model of the simulator (DESIGN.md §5): modelled time of one training step's MoE layers from
// the replay's rank loads, exchange volumes and layout changes. Every constant is a named field of
// ClusterPreset / ModelPreset / CostParams below. Simulated time is a model, not a measurement;
// reports label it "modelled".
//
// Per MoE layer per step (one replayed (step, layer)):
//   compute   = max_r L_r * flops_per_task / achievable_flops
//               flops_per_task = matmuls_per_expert (3: SwiGLU gate, up, down) x 2 (multiply-add)
//                                x hidden x expert_ffn x fwd_bwd_flops_factor (3: forward 1x,
//                                backward 2x for input and weight gradients)
//   exchange  = max(inter, intra) for each of exchanges_per_layer (4: dispatch + combine, forward
//               and backward) exchanges, with the copies of eval::exchange_volume (x token_bytes):
//               inter = max over nodes of max(bytes out, bytes in) / ib_bytes_per_s_per_node
//               intra = max over ranks of max(bytes out, bytes in) / nvlink_bytes_per_s
//   layer     = compute + 4 exchange - overlap_fraction * min(compute, 4 exchange)
//   grad sync = every expert's extra replicas send their gradients (grad_bytes_per_element per
//               parameter) to the expert's main instance (the rank holding its optimizer state)
//               and, with param_refresh, receive the updated parameters back, hierarchically like
//               the token exchange: replicas on the main's node over NVLink; on another node they
//               reduce into the node's lowest holder (NVLink), which exchanges one copy with the
//               main over IB. Timed like an exchange (IB per node, NVLink per rank).
//   migration = layout changes between consecutive (step, layer) layouts (core::diff; the first
//               layout of a replay is the initial placement and free): every added replica copies
//               the expert's parameters from its source holder (one IB copy per (expert, node)
//               without a holder, NVLink from there), and every expert whose main
//               instance moves also copies its optimizer state (optimizer_factor x parameter
//               bytes) from the old main to the new one, so a global re-layout that moves an
//               expert across nodes costs parameters x (1 + optimizer_factor) over IB. Copies
//               between nodes use IB (global re-layouts), within a node NVLink (intra-node
//               rebalancing); timed like an exchange, never overlapped (training pauses while a
//               re-layout is applied).
//   Main instances (main_ranks): initially the expert's static-EP home rank floor(e G / E) when it
//               holds the expert, else its lowest-numbered holder; after a change a main stays
//               while its rank still holds the expert, else moves to the lowest holder on the
//               same node, else to the lowest holder.
//   planning  = planner wall time measured around each policy's planning on the replay thread
//               x planner_time_scale x (1 - planner_overlap). A policy that plans in the
//               background (cobalt, cobalt+ with asynchronous planning) reports the plans' own run
//               time apart (PolicyCounters::async_plan_ms); the simulator charges only what of it
//               exceeds the previous step's modelled time (the plan ran while that step trained).
// Step time = sum over the replayed layers of (layer + grad sync + migration) + planning: the MoE
// part of the step for the replayed layers only (attention, dense layers and the rest of the model
// are not modelled; they would add the same time to every policy).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/core/topology.hpp"
#include "cobalt/eval/metrics.hpp"

namespace cobalt::eval {

// A modelled cluster: shape and per-link bandwidths (one way) and achievable GPU throughput.
struct ClusterPreset {
  std::string name;
  int num_nodes = 0;
  int ranks_per_node = 0;
  double nvlink_bytes_per_s = 0;       // per GPU, one way
  double ib_bytes_per_s_per_node = 0;  // per node, one way (sum of the node's NICs)
  double peak_flops_per_gpu = 0;       // dense BF16 tensor-core peak
  double achievable_fraction = 0;      // of the peak reached by the grouped expert GEMMs
  std::string note;                    // where the numbers come from
  double achievable_flops_per_gpu() const { return peak_flops_per_gpu * achievable_fraction; }
  Topology topology() const;
};

// "4x8-b200", "4x8-h800" (see cost_model.cpp for the sources of every number).
const std::vector<ClusterPreset>& cluster_presets();
// Throws kInvalidArgument listing the valid names when `name` is unknown.
const ClusterPreset& cluster_preset(std::string_view name);

// Sizes of a public MoE model (its config.json; cost_model.cpp cites each one).
struct ModelPreset {
  std::string name;
  int hidden_size = 0;        // d_model: a token's hidden state has this many elements
  int expert_ffn_size = 0;    // intermediate size of one routed expert (SwiGLU)
  int num_experts = 0;        // routed experts E
  int top_k = 0;              // experts per token K
  int num_moe_layers = 0;     // MoE layers (all layers minus the leading dense ones)
  int bytes_per_element = 0;  // of activations and parameters (2: BF16 training)
  std::string source;         // config.json it comes from
};

// glm-4.5-air, deepseek-v3, qwen3-30b-a3b, deepseek-v2, olmoe-1b-7b, qwen1.5-moe-a2.7b.
const std::vector<ModelPreset>& model_presets();
// Throws kInvalidArgument listing the valid names when `name` is unknown.
const ModelPreset& model_preset(std::string_view name);
// The preset a trace most likely comes from: the one whose name matches the trace's `model`
// metadata (case and punctuation ignored, e.g. "Qwen/Qwen1.5-MoE-A2.7B-Chat" -> qwen1.5-moe-a2.7b;
// the longest matching name when several match), else the first with the trace's E and K, else
// nullopt.
std::optional<std::string> guess_model_preset(std::string_view model_metadata, int num_experts,
                                              int top_k);

// The largest CostParams::planner_time_scale (a host 1000x slower than this one): larger factors
// only overflow modelled times to infinity.
inline constexpr double kMaxPlannerTimeScale = 1000.0;

struct CostParams {
  // Hardware.
  double nvlink_bytes_per_s = 900e9;
  double ib_bytes_per_s_per_node = 400e9;
  double achievable_flops = 1.125e15;  // per GPU
  // Model sizes.
  int hidden_size = 4096;
  int expert_ffn_size = 1408;
  int bytes_per_element = 2;
  // Step structure.
  int matmuls_per_expert = 3;         // SwiGLU expert: gate, up and down projections
  double fwd_bwd_flops_factor = 3.0;  // forward 1x + backward 2x
  int exchanges_per_layer = 4;        // dispatch + combine, forward + backward
  double overlap_fraction = 0.0;      // in [0, 1]: part of min(compute, exchanges) hidden
  // Replicas and migration.
  double grad_bytes_per_element = 2.0;  // BF16 gradients reduced into the main instance
  bool param_refresh = true;            // updated parameters go back to every extra replica
  // Optimizer state per parameter relative to the parameter bytes: Adam keeps FP32 master
  // weights, m and v = 12 bytes per parameter = 6 x the 2 BF16 bytes.
  double optimizer_factor = 6.0;
  // Planning.
  // Multiplies measured planner wall time (0 ignores it), in [0, kMaxPlannerTimeScale].
  double planner_time_scale = 1.0;
  double planner_overlap = 0.0;  // in [0, 1]: part of the measured planner time hidden

  // Throws kInvalidArgument naming the field when a value is out of range or infinite.
  void validate() const;
  double token_bytes() const { return static_cast<double>(hidden_size) * bytes_per_element; }
  double flops_per_task() const {
    return matmuls_per_expert * 2.0 * hidden_size * expert_ffn_size * fwd_bwd_flops_factor;
  }
  double expert_params() const {
    return static_cast<double>(matmuls_per_expert) * hidden_size * expert_ffn_size;
  }
  double expert_param_bytes() const { return expert_params() * bytes_per_element; }
};

// Cost parameters of a cluster preset and a model preset.
CostParams make_cost_params(const ClusterPreset& cluster, const ModelPreset& model);

// Bytes moved over each link by one transfer pattern.
struct LinkBytes {
  std::vector<double> node_out, node_in;  // [N] over the inter-node fabric
  std::vector<double> rank_out, rank_in;  // [G] over NVLink
  explicit LinkBytes(const Topology& topology)
      : LinkBytes(topology.num_nodes(), topology.num_ranks()) {}
  LinkBytes(int num_nodes, int num_ranks);
  double total_inter() const;  // sum of node_out
  double total_intra() const;  // sum of rank_out
};
LinkBytes exchange_bytes(const ExchangeVolume& volume, double token_bytes);

struct LinkTime {
  double inter_s = 0;  // max over nodes of max(out, in) / IB bandwidth
  double intra_s = 0;  // max over ranks of max(out, in) / NVLink bandwidth
  double time_s() const { return inter_s > intra_s ? inter_s : intra_s; }
};
LinkTime link_time(const LinkBytes& bytes, const CostParams& params);

// max_r L_r * flops_per_task / achievable_flops.
double compute_time(std::span<const int64_t> rank_loads, const CostParams& params);

// compute + exchanges_per_layer * exchange - overlap_fraction * min(compute, exchanges).
double layer_time(double compute_s, double exchange_s, const CostParams& params);

// Main instance of every expert [E] (see the header comment): initial_main_ranks for a replay's
// first layout, next_main_ranks after a layout change (previous: [E]).
std::vector<RankId> initial_main_ranks(const ExpertLayout& layout);
std::vector<RankId> next_main_ranks(const ExpertLayout& layout, std::span<const RankId> previous);

// Gradient synchronisation of one layer's replicas for one step (main_ranks: [E]).
LinkBytes grad_sync_bytes(const ExpertLayout& layout, std::span<const RankId> main_ranks,
                          const CostParams& params);

// Copies turning one layout into the next: parameters for every move of `diff`, optimizer state
// for every expert whose main rank changes (old_mains, new_mains: [E]).
LinkBytes migration_bytes(const LayoutDiff& diff, std::span<const RankId> old_mains,
                          std::span<const RankId> new_mains, const Topology& topology,
                          const CostParams& params);

// Planner time on the critical path for `planner_ms` of measured planning wall time.
double planning_time(double planner_ms, const CostParams& params);
// Planner time on one step's critical path: synchronous planning (sync_ms) in full; of a
// background plan's run time (async_plan_ms), only what exceeds previous_busy_s, the previous
// step's modelled time without planning (the plan ran while that step trained).
double step_planning_time(double sync_ms, double async_plan_ms, double previous_busy_s,
                          const CostParams& params);

}  // namespace cobalt::eval
