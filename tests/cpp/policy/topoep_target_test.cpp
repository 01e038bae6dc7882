// TopoEP's Figure 10 (32 ranks on 4 nodes of 8, 640 experts, top-8): rank imbalance with N extra
// replica slots per rank. Two workloads:
//
// 1. Hot block at the paper's microbatch size: 4096 tokens per rank per step (the Qwen3 sequence
//    length of the paper's EP-32 runs), the 20 experts of rank 0 twelve times as likely as the
//    rest (static EP imbalance ~8.6; the paper: 8.39). This is the load shape Fig. 10's numbers
//    imply — with one slot TopoEP is far from balanced (paper: 3.79), with two it is balanced
//    (paper: 1.30) and more slots add little — and `topoep` reproduces that shape.
//
// 2. The `paper-topoep-640x8` preset, which now has that shape (hot block of 20 experts 13x as
// likely,
//    4096 tokens per rank per step, TopoEP's hot-set churn; static EP ~8.4). An earlier version
//    (Zipf 0.74 over contiguous ids, 512 tokens per rank) put ~63% of all tasks on node 0, which no
//    faithful TopoEP can balance with 2 slots (measured 2.63): see docs/peers.md.
#include <gtest/gtest.h>

#include "cobalt/core/rng.hpp"
#include "cobalt/eval/simulator.hpp"
#include "cobalt/io/trace.hpp"
#include "cobalt/workload/presets.hpp"
#include "cobalt/workload/synthetic.hpp"

namespace cobalt {
namespace {

constexpr int kExperts = 640, kTopK = 8, kRanks = 32;
// GLM-4.5-Air (the simulator's default model): hidden 4096 in BF16; 3 x 4096 x 1408 BF16 weights.
constexpr double kTokenBytes = 4096 * 2;
constexpr double kExpertParamBytes = 3.0 * 4096 * 1408 * 2;

// One layer, `steps` steps of 4096 tokens per rank (contiguous source blocks); every token picks
// 8 distinct experts, experts 0-19 with weight 12 and the others with weight 1.
io::TraceData hot_block_trace(int steps) {
  constexpr int kHot = kExperts / kRanks;
  constexpr double kHotWeight = 12.0, kTotal = kHot * kHotWeight + (kExperts - kHot);
  constexpr int64_t kTokensPerStep = int64_t{kRanks} * 4096;
  io::TraceData data;
  data.num_experts = kExperts;
  data.top_k = kTopK;
  data.num_layers = 1;
  data.num_tokens = steps * kTokensPerStep;
  data.topk_ids.reserve(data.num_tokens * kTopK);
  SplitMix64 rng(2024);
  for (int64_t t = 0; t < data.num_tokens; ++t) {
    ExpertId row[kTopK];
    for (int n = 0; n < kTopK;) {
      const double u = rng.unit() * kTotal;
      ExpertId e = u < kHot * kHotWeight ? static_cast<ExpertId>(u / kHotWeight)
                                         : static_cast<ExpertId>(kHot + (u - kHot * kHotWeight));
      e = std::min(e, kExperts - 1);
      bool dup = false;
      for (int i = 0; i < n; ++i) dup = dup || row[i] == e;
      if (!dup) row[n++] = e;
    }
    data.topk_ids.insert(data.topk_ids.end(), row, row + kTopK);
  }
  for (int s = 0; s <= steps; ++s) data.step_offsets.push_back(s * kTokensPerStep);
  return data;
}

eval::SimulationResult simulate(const eval::StepSource& source, int extra_slots,
                                std::vector<std::string> policies) {
  eval::SimulationOptions options;
  auto& config = options.policy_config;
  config.topology = Topology::parse("4x8");
  config.num_experts = source.num_experts();
  config.top_k = source.top_k();
  config.num_layers = source.num_layers();
  config.slots_per_rank = slots_for_extra(config.num_experts, kRanks, extra_slots);
  config.token_bytes = kTokenBytes;
  config.expert_param_bytes = kExpertParamBytes;
  options.policies = std::move(policies);
  options.warmup_steps = 1;
  return eval::simulate(source, options);
}

TEST(TopoEpTarget, Figure10ShapeOnHotBlockWorkload) {
  const auto data = hot_block_trace(2);
  auto source = eval::make_step_source(data);
  const auto two = simulate(*source, 2, {"static", "topoep"});
  const auto& stat = two.policies[0];
  const auto& topoep = two.policies[1];
  EXPECT_GE(stat.imbalance_mean, 8.0);  // paper: 8.39
  EXPECT_LE(topoep.imbalance_mean, 1.35) << "paper: 1.30 with two slots";
  // Topology-aware: hot tasks run on replicas in their own node, so fewer tasks cross nodes (the
  // cold experts stay spread over all nodes, so most tokens still touch a remote node).
  EXPECT_LT(topoep.cross_node_tokens_no_dedup, stat.cross_node_tokens_no_dedup * 0.8);
  EXPECT_LE(topoep.cross_node_tokens, stat.cross_node_tokens);
  // One slot is not enough (paper: 3.79); three add little (paper: 1.30 again).
  const auto one = simulate(*source, 1, {"topoep"});
  EXPECT_GE(one.policies[0].imbalance_mean, 1.8);
  const auto three = simulate(*source, 3, {"topoep"});
  EXPECT_LE(three.policies[0].imbalance_mean, topoep.imbalance_mean);
}

TEST(TopoEpTarget, PaperTopoEpPreset) {
  workload::PresetOverrides overrides;
  overrides.num_steps = 4;
  overrides.num_layers = 1;
  const auto data =
      workload::generate_trace(workload::workload_preset("paper-topoep-640x8", overrides));
  auto source = eval::make_step_source(data);
  const auto result = simulate(*source, 2, {"static", "topoep"});
  const auto& stat = result.policies[0];
  const auto& topoep = result.policies[1];
  EXPECT_GE(stat.imbalance_mean, 8.0);
  // The target (paper: 1.30 with two replica slots per rank; measured 1.09 with the full
  // preset: `cobalt simulate --preset paper-topoep-640x8 --cluster 4x8 --replica-slots 2`).
  EXPECT_LE(topoep.imbalance_mean, 1.35);
  EXPECT_LE(topoep.cross_node_tokens, stat.cross_node_tokens);
}

}  // namespace
}  // namespace cobalt
