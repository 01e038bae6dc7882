// The hardware constants the peers' own cost models read (FasterMoE's shadowing model, LAER-MoE's
// candidate selection). Each published system profiles them on its cluster; here they come from
// the topology's link parameters and the model sizes in PolicyConfig, plus one named compute
// constant. Only ratios matter to the decisions (e.g. FasterMoE shadows an expert when the token
// time it saves exceeds one parameter broadcast).
#pragma once

#include "cobalt/core/topology.hpp"

namespace cobalt::plan {

// Achievable dense BF16 GEMM throughput of one GPU used by the peers' models when nothing says
// otherwise (about 40% of an H800's 989 TFLOP/s peak; FasterMoE's own default, 11.5 TFLOP/s, is a
// V100's). `cobalt simulate` passes its cluster preset's figure (PolicyConfig::gemm_flops_per_s).
inline constexpr double kAchievableGemmFlopsPerS = 4.0e14;
// Bytes per parameter of expert weights (BF16), used to turn parameter bytes into FLOPs.
inline constexpr double kParamBytesPerElement = 2.0;

struct PeerCostParams {
  // One token's hidden state and one expert's parameters, bytes; defaults: GLM-4.5-Air in BF16
  // (4096 x 2 and 3 x 4096 x 1408 x 2), eval::CostParams{}'s (policies fill both from their
  // PolicyConfig: PeerCostParams::from).
  double token_bytes = 8192;
  double expert_param_bytes = 34603008;
  double gemm_flops_per_s = kAchievableGemmFlopsPerS;
  double nvlink_bytes_per_s = 900e9;  // per GPU, one way
  double net_bytes_per_s = 50e9;      // per GPU inter-node share: IB per node / ranks per node

  // Forward FLOPs of one token through one expert: 2 per parameter.
  double flops_per_token() const { return 2.0 * expert_param_bytes / kParamBytesPerElement; }
  // Forward compute seconds of one token through one expert.
  double compute_s_per_token() const { return flops_per_token() / gemm_flops_per_s; }

  static PeerCostParams from(const Topology& topology, double token_bytes,
                             double expert_param_bytes,
                             double gemm_flops_per_s = kAchievableGemmFlopsPerS) {
    PeerCostParams p;
    p.token_bytes = token_bytes;
    p.expert_param_bytes = expert_param_bytes;
    p.gemm_flops_per_s = gemm_flops_per_s;
    p.nvlink_bytes_per_s = topology.links().nvlink_bytes_per_s;
    p.net_bytes_per_s = topology.links().ib_bytes_per_s_per_node / topology.ranks_per_node();
    return p;
  }
};

}  // namespace cobalt::plan
