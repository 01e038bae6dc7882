// Cost model (DESIGN.md §5): presets, hand-computed times and byte counts.
#include "cobalt/eval/cost_model.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "cobalt/core/error.hpp"
#include "cobalt/core/expert_layout.hpp"

namespace cobalt::eval {
namespace {

TEST(CostModel, ClusterPresetsCarryTheDesignNumbers) {
  const auto& b200 = cluster_preset("4x8-b200");
  EXPECT_EQ(b200.topology().to_string(), "4x8");
  EXPECT_DOUBLE_EQ(b200.nvlink_bytes_per_s, 900e9);
  EXPECT_DOUBLE_EQ(b200.ib_bytes_per_s_per_node, 400e9);
  EXPECT_GT(b200.achievable_flops_per_gpu(), 0);
  EXPECT_LT(b200.achievable_flops_per_gpu(), b200.peak_flops_per_gpu);
  const auto& h800 = cluster_preset("4x8-h800");
  EXPECT_DOUBLE_EQ(h800.nvlink_bytes_per_s, 200e9);
  EXPECT_DOUBLE_EQ(h800.ib_bytes_per_s_per_node, 8 * 50e9);
  EXPECT_DOUBLE_EQ(h800.topology().links().nvlink_bytes_per_s, 200e9);
  EXPECT_THROW(cluster_preset("8x8-a100"), Error);
}

TEST(CostModel, ModelPresetsAreComplete) {
  const std::vector<std::string> names = {"glm-4.5-air",      "deepseek-v3",      "qwen3-30b-a3b",
                                          "deepseek-v2",      "deepseek-v2-lite", "olmoe-1b-7b",
                                          "qwen1.5-moe-a2.7b"};
  ASSERT_EQ(model_presets().size(), names.size());
  for (const auto& name : names) {
    const auto& m = model_preset(name);
    EXPECT_GT(m.hidden_size, 0) << name;
    EXPECT_GT(m.expert_ffn_size, 0) << name;
    EXPECT_GE(m.num_experts, m.top_k) << name;
    EXPECT_GT(m.num_moe_layers, 0) << name;
    EXPECT_EQ(m.bytes_per_element, 2) << name;
    EXPECT_NE(m.source.find("config.json"), std::string::npos) << name;
  }
  // Spot checks against the public configs.
  EXPECT_EQ(model_preset("glm-4.5-air").hidden_size, 4096);
  EXPECT_EQ(model_preset("deepseek-v3").num_experts, 256);
  EXPECT_EQ(model_preset("qwen1.5-moe-a2.7b").top_k, 4);
  EXPECT_THROW(model_preset("mixtral"), Error);
}

TEST(CostModel, GuessesTheModelFromMetadataThenShape) {
  EXPECT_EQ(guess_model_preset("Qwen/Qwen1.5-MoE-A2.7B-Chat", 60, 4), "qwen1.5-moe-a2.7b");
  EXPECT_EQ(guess_model_preset("allenai/OLMoE-1B-7B-0924", 1, 1), "olmoe-1b-7b");
  EXPECT_EQ(guess_model_preset("", 160, 6), "deepseek-v2");
  EXPECT_EQ(guess_model_preset("deepseek-ai/DeepSeek-V2-Lite", 64, 6), "deepseek-v2-lite");
  EXPECT_EQ(guess_model_preset("deepseek-ai/DeepSeek-V2-Chat", 160, 6), "deepseek-v2");
  EXPECT_EQ(guess_model_preset("", 64, 6), "deepseek-v2-lite");
  EXPECT_EQ(guess_model_preset("unknown", 256, 8), "deepseek-v3");
  EXPECT_FALSE(guess_model_preset("unknown", 7, 3).has_value());
}

CostParams simple_params() {
  CostParams p;
  p.nvlink_bytes_per_s = 100;
  p.ib_bytes_per_s_per_node = 10;
  p.achievable_flops = 1000;
  p.hidden_size = 2;
  p.expert_ffn_size = 5;
  p.bytes_per_element = 2;
  return p;
}

TEST(CostModel, ComputeAndLayerTime) {
  const CostParams p = simple_params();
  // 3 matmuls x 2 x hidden 2 x FFN 5 x 3 (fwd + bwd) = 180 FLOPs per task.
  EXPECT_DOUBLE_EQ(p.flops_per_task(), 180);
  EXPECT_DOUBLE_EQ(p.token_bytes(), 4);
  EXPECT_DOUBLE_EQ(p.expert_params(), 30);
  EXPECT_DOUBLE_EQ(p.expert_param_bytes(), 60);
  const std::vector<int64_t> loads = {3, 10, 4};
  EXPECT_DOUBLE_EQ(compute_time(loads, p), 10 * 180 / 1000.0);
  // No overlap: compute + 4 x exchange.
  EXPECT_DOUBLE_EQ(layer_time(2.0, 0.25, p), 3.0);
  CostParams half = p;
  half.overlap_fraction = 0.5;
  // 2 + 1 - 0.5 * min(2, 1).
  EXPECT_DOUBLE_EQ(layer_time(2.0, 0.25, half), 2.5);
}

TEST(CostModel, ExchangeTimeIsTheSlowerOfTheBusiestNodeAndRank) {
  const CostParams p = simple_params();
  ExchangeVolume v;
  v.node_out = {5, 1};
  v.node_in = {1, 7};
  v.nvlink_out = {0, 30, 0, 0};
  v.nvlink_in = {10, 0, 0, 20};
  const LinkBytes bytes = exchange_bytes(v, p.token_bytes());
  EXPECT_DOUBLE_EQ(bytes.total_inter(), 6 * 4);
  EXPECT_DOUBLE_EQ(bytes.total_intra(), 30 * 4);
  const LinkTime t = link_time(bytes, p);
  EXPECT_DOUBLE_EQ(t.inter_s, 7 * 4 / 10.0);    // node 1 receives 7 copies
  EXPECT_DOUBLE_EQ(t.intra_s, 30 * 4 / 100.0);  // rank 1 sends 30
  EXPECT_DOUBLE_EQ(t.time_s(), 2.8);
}

TEST(CostModel, GradientSyncSendsEveryExtraReplicaToItsMain) {
  CostParams p = simple_params();
  const Topology topo(2, 4);  // node 0 = ranks 0, 1; node 1 = ranks 2, 3
  // Expert 0 on ranks 0, 1, 2; expert 1 on rank 3 only.
  const ExpertLayout layout = ExpertLayout::from_rank_lists(topo, 2, 2, {{0}, {0}, {0}, {1}});
  const auto mains = initial_main_ranks(layout);
  EXPECT_EQ(mains, (std::vector<RankId>{0, 3}));  // homes: floor(e * 4 / 2) = 0 and 2 -> 3
  const LinkBytes b = grad_sync_bytes(layout, mains, p);
  // Per extra replica: gradients 30 params x 2 bytes = 60 to the main, parameters 60 back.
  EXPECT_DOUBLE_EQ(b.rank_out[1], 60);  // rank 1 -> 0 (NVLink)
  EXPECT_DOUBLE_EQ(b.rank_out[0], 60);  // rank 0 -> 1
  EXPECT_DOUBLE_EQ(b.node_out[1], 60);  // rank 2 -> 0 over IB
  EXPECT_DOUBLE_EQ(b.node_out[0], 60);  // refresh back to rank 2
  EXPECT_DOUBLE_EQ(b.rank_out[3], 0);
  p.param_refresh = false;
  EXPECT_DOUBLE_EQ(grad_sync_bytes(layout, mains, p).node_out[0], 0);
}

// Replicas on a remote node reduce into the node's lowest holder over NVLink; one copy crosses
// the fabric per (expert, node), in each direction.
TEST(CostModel, GradientSyncCrossesTheFabricOncePerRemoteNode) {
  const CostParams p = simple_params();  // 60 gradient bytes, 60 parameter bytes per replica
  const Topology topo(2, 8);             // node 0 = ranks 0..3, node 1 = ranks 4..7
  // Expert 0: main on rank 0, replicas on ranks 1 (same node) and 4, 5, 6 (node 1).
  const ExpertLayout layout =
      ExpertLayout::from_rank_lists(topo, 2, 2, {{0}, {0}, {}, {}, {0}, {0}, {0}, {1}});
  const std::vector<RankId> mains = {0, 7};
  const LinkBytes b = grad_sync_bytes(layout, mains, p);
  EXPECT_DOUBLE_EQ(b.node_out[1], 60);  // rank 4's reduced gradient, once
  EXPECT_DOUBLE_EQ(b.node_in[0], 60);
  EXPECT_DOUBLE_EQ(b.node_out[0], 60);      // the refreshed parameters, once
  EXPECT_DOUBLE_EQ(b.rank_in[4], 2 * 60);   // gradients of ranks 5 and 6
  EXPECT_DOUBLE_EQ(b.rank_out[4], 2 * 60);  // their refreshed parameters
  EXPECT_DOUBLE_EQ(b.rank_out[1], 60);      // rank 1 -> its main over NVLink
  EXPECT_DOUBLE_EQ(b.rank_in[0], 60);
  EXPECT_DOUBLE_EQ(b.total_inter(), 2 * 60);
  // Brute-force reference: per remote node, one leader exchange plus one NVLink exchange per other
  // holder; on the main's node one NVLink exchange per holder.
  double nvlink = 0;
  for (RankId r : layout.ranks_of(0)) nvlink += r == 0 || r == 4 ? 0 : 2 * 60;
  EXPECT_DOUBLE_EQ(b.total_intra(), nvlink);
}

TEST(CostModel, MigrationCrossesTheFabricOncePerExpertAndNode) {
  const CostParams p = simple_params();
  const Topology topo(2, 8);
  const ExpertLayout from =
      ExpertLayout::from_rank_lists(topo, 2, 2, {{0}, {1}, {}, {}, {}, {}, {}, {}});
  // Expert 0 gains three replicas on node 1 (no holder there): one IB copy, two NVLink copies from
  // the first of them; mains stay.
  const ExpertLayout to =
      ExpertLayout::from_rank_lists(topo, 2, 2, {{0}, {1}, {}, {}, {0}, {0}, {0}, {}});
  const LayoutDiff d = diff(from, to);
  EXPECT_EQ(d.num_cross_node, 1);
  EXPECT_EQ(d.num_intra_node, 2);
  ASSERT_EQ(d.moves.size(), 3u);
  EXPECT_TRUE(d.moves[0].cross_node);
  EXPECT_EQ(d.moves[0].src_rank, 0);
  EXPECT_EQ(d.moves[1].src_rank, 4);
  EXPECT_EQ(d.moves[2].src_rank, 4);
  const auto mains = initial_main_ranks(from);
  const LinkBytes b = migration_bytes(d, mains, next_main_ranks(to, mains), topo, p);
  EXPECT_DOUBLE_EQ(b.total_inter(), 60);
  EXPECT_DOUBLE_EQ(b.rank_out[4], 2 * 60);
}

TEST(CostModel, MainsStayPutAndMigrationMovesStateOnlyWithTheMain) {
  const CostParams p = simple_params();  // parameters 60 bytes, optimizer state 6 x 60 = 360
  const Topology topo(2, 4);
  const ExpertLayout from = ExpertLayout::from_rank_lists(topo, 2, 2, {{0}, {}, {1}, {}});
  // Expert 0 gains a replica on rank 1 (NVLink parameter copy) and keeps its main on rank 0;
  // expert 1 leaves rank 2 for rank 3 (same node): its main follows with the optimizer state.
  const ExpertLayout to = ExpertLayout::from_rank_lists(topo, 2, 2, {{0}, {0}, {}, {1}});
  const auto old_mains = initial_main_ranks(from);
  EXPECT_EQ(old_mains, (std::vector<RankId>{0, 2}));
  const auto new_mains = next_main_ranks(to, old_mains);
  EXPECT_EQ(new_mains, (std::vector<RankId>{0, 3}));
  const LinkBytes b = migration_bytes(diff(from, to), old_mains, new_mains, topo, p);
  EXPECT_DOUBLE_EQ(b.rank_in[1], 60);
  EXPECT_DOUBLE_EQ(b.rank_in[3], 60 + 360);
  EXPECT_DOUBLE_EQ(b.total_inter(), 0);
  // Moving expert 1 to node 0: parameters and optimizer state cross the fabric.
  const ExpertLayout away = ExpertLayout::from_rank_lists(topo, 2, 2, {{0, 1}, {}, {}, {}});
  const auto away_mains = next_main_ranks(away, old_mains);
  EXPECT_EQ(away_mains, (std::vector<RankId>{0, 0}));
  const LinkBytes c = migration_bytes(diff(from, away), old_mains, away_mains, topo, p);
  EXPECT_DOUBLE_EQ(c.node_out[1], 60 + 360);
  EXPECT_DOUBLE_EQ(c.node_in[0], 60 + 360);
}

TEST(CostModel, PlanningAndValidation) {
  CostParams p = simple_params();
  EXPECT_DOUBLE_EQ(planning_time(20, p), 0.02);
  p.planner_overlap = 0.75;
  EXPECT_DOUBLE_EQ(planning_time(20, p), 0.005);
  // Background plans: the wait is hidden up to the previous step's modelled time.
  p = CostParams{};
  EXPECT_DOUBLE_EQ(step_planning_time(3, 0, 1.0, p), 0.003);     // synchronous: in full
  EXPECT_DOUBLE_EQ(step_planning_time(0, 30, 0.010, p), 0.020);  // 30 ms wait, 10 ms step
  EXPECT_DOUBLE_EQ(step_planning_time(2, 30, 0.050, p), 0.002);  // wait hidden entirely
  EXPECT_DOUBLE_EQ(step_planning_time(2, 30, 0.0, p), 0.032);    // nothing to hide behind
  EXPECT_NO_THROW(p.validate());
  p.overlap_fraction = 1.5;
  EXPECT_THROW(p.validate(), Error);
  p = simple_params();
  p.achievable_flops = 0;
  EXPECT_THROW(p.validate(), Error);
  // Infinite rates and factors made modelled times infinite or zero.
  const double inf = std::numeric_limits<double>::infinity();
  for (double CostParams::*field :
       {&CostParams::nvlink_bytes_per_s, &CostParams::ib_bytes_per_s_per_node,
        &CostParams::achievable_flops, &CostParams::fwd_bwd_flops_factor,
        &CostParams::grad_bytes_per_element, &CostParams::optimizer_factor}) {
    p = simple_params();
    p.*field = inf;
    try {
      p.validate();
      ADD_FAILURE() << "accepted an infinite field";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("inf must be finite"), std::string::npos) << e.what();
    }
  }
}

// Main ranks index the links: a wrong count or a rank outside [0, G) is an invalid argument, not
// a write past the link vectors.
TEST(CostModel, MainRanksAreValidated) {
  const CostParams p = simple_params();
  const Topology topo(2, 4);
  const ExpertLayout layout = ExpertLayout::from_rank_lists(topo, 2, 2, {{0}, {0}, {0}, {1}});
  const auto mains = initial_main_ranks(layout);
  EXPECT_THROW(grad_sync_bytes(layout, std::vector<RankId>{0}, p), Error);
  EXPECT_THROW(grad_sync_bytes(layout, std::vector<RankId>{4, 3}, p), Error);
  EXPECT_THROW(grad_sync_bytes(layout, std::vector<RankId>{-1, 3}, p), Error);
  EXPECT_THROW(migration_bytes(LayoutDiff{}, mains, std::vector<RankId>{0}, topo, p), Error);
  EXPECT_THROW(migration_bytes(LayoutDiff{}, std::vector<RankId>{0, 9}, mains, topo, p), Error);
  LayoutDiff bad_move;
  bad_move.moves.push_back({0, 0, 4, true});
  EXPECT_THROW(migration_bytes(bad_move, mains, mains, topo, p), Error);
  try {
    grad_sync_bytes(layout, std::vector<RankId>{4, 3}, p);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("main rank 4 of expert 0 out of range [0, 4)"),
              std::string::npos)
        << e.what();
  }
}

TEST(CostModel, ParamsFromPresets) {
  const CostParams p = make_cost_params(cluster_preset("4x8-b200"), model_preset("glm-4.5-air"));
  EXPECT_DOUBLE_EQ(p.token_bytes(), 4096 * 2);
  EXPECT_DOUBLE_EQ(p.flops_per_task(), 3.0 * 2 * 4096 * 1408 * 3);
  EXPECT_DOUBLE_EQ(p.achievable_flops, cluster_preset("4x8-b200").achievable_flops_per_gpu());
}

// On the main's node the gradient sync goes to the main itself, not to the node's lowest holder
// (expert 0 on ranks 0, 1 and 2 with its main on rank 2).
TEST(CostModel, GradSyncOnTheMainsNodeGoesToTheMain) {
  const Topology topo(1, 4);
  const auto layout = ExpertLayout::from_rank_lists(topo, 2, 2, {{0, 1}, {0}, {0}, {}});
  CostParams p;
  const double grad = p.expert_params() * p.grad_bytes_per_element;
  const double refresh = p.expert_param_bytes();
  const std::vector<RankId> mains{2, 1};  // expert 0's main is its last holder
  const auto bytes = grad_sync_bytes(layout, mains, p);
  EXPECT_DOUBLE_EQ(bytes.rank_in[2], 2 * grad);
  EXPECT_DOUBLE_EQ(bytes.rank_out[2], 2 * refresh);
  EXPECT_DOUBLE_EQ(bytes.rank_in[0], refresh);
  EXPECT_DOUBLE_EQ(bytes.rank_out[0], grad);
}

// The first main of an expert is its static-EP home rank when that rank holds it, not the lowest
// holder.
TEST(CostModel, InitialMainIsTheHomeRankWhenHeld) {
  const auto layout = ExpertLayout::from_rank_lists(Topology(1, 2), 2, 2, {{0, 1}, {1}});
  const auto mains = initial_main_ranks(layout);
  EXPECT_EQ(mains[0], 0);
  EXPECT_EQ(mains[1], 1);  // home rank 1 * 2 / 2 = 1 holds it
}

}  // namespace
}  // namespace cobalt::eval
