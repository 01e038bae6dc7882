#include "cobalt/plan/fastermoe_planner.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/eval/cost_model.hpp"
#include "cobalt/policy/policy.hpp"

namespace cobalt::plan {
namespace {

// comp = 0, feat = 1, model = 10: lat(k) = 4 B_k + 10 k, so the k-th hottest is shadowed while
// 4 (B_k - B_{k+1}) > 10, i.e. while the gap to the next expert exceeds 2.5 tasks.
ShadowModel toy_model() {
  ShadowModel m;
  m.compute_s_per_token = 0;
  m.feature_s_per_token = 1;
  m.model_s = 10;
  return m;
}

TEST(FasterMoeShadowing, ShadowsWhileTheModelledLatencyDrops) {
  // Sorted: 100 (e2), 90 (e0), 50 (e3), 48 (e1), 10 (e4).
  // lat: 400 -> 4*90+10 = 370 (shadow e2) -> 4*50+20 = 220 (shadow e0) -> 4*48+30 = 222: stop.
  const std::vector<double> load{90, 48, 100, 50, 10};
  EXPECT_EQ(choose_shadows(load, toy_model()), (std::vector<ExpertId>{2, 0}));
}

TEST(FasterMoeShadowing, StopsAtTheFirstStepThatDoesNotImprove) {
  // Gap 100 -> 99 saves 4 < 10: nothing is shadowed even though 99 -> 10 would pay off.
  EXPECT_TRUE(choose_shadows(std::vector<double>{100, 99, 10}, toy_model()).empty());
  // Exactly break-even (4 * 2.5 = 10) is not an improvement.
  EXPECT_TRUE(choose_shadows(std::vector<double>{12.5, 10, 0}, toy_model()).empty());
  EXPECT_EQ(choose_shadows(std::vector<double>{12.6, 10, 9}, toy_model()),
            (std::vector<ExpertId>{0}));
  // The last expert is never shadowed.
  EXPECT_TRUE(choose_shadows(std::vector<double>{1000}, toy_model()).empty());
}

TEST(FasterMoeShadowing, ModelConstantsFromCostParams) {
  PeerCostParams cost;
  cost.token_bytes = 1000;
  cost.expert_param_bytes = 4e6;  // 2e6 BF16 parameters -> 4e6 FLOPs per token
  cost.gemm_flops_per_s = 1e12;
  cost.net_bytes_per_s = 1e9;
  const auto m = ShadowModel::from(cost);
  EXPECT_DOUBLE_EQ(m.feature_s_per_token, 1e-6);
  EXPECT_DOUBLE_EQ(m.model_s, 4e-3);
  EXPECT_DOUBLE_EQ(m.compute_s_per_token, 4e-6);
  EXPECT_DOUBLE_EQ(m.latency(100, 2), (3 * 4e-6 + 4 * 1e-6) * 100 + 2 * 4e-3);
  // From a topology: the per-GPU share of the node's IB bandwidth.
  const auto p = PeerCostParams::from(Topology(2, 8, {900e9, 400e9}), 10, 20);
  EXPECT_DOUBLE_EQ(p.net_bytes_per_s, 100e9);
  EXPECT_DOUBLE_EQ(p.nvlink_bytes_per_s, 900e9);
}

// One default model across the library: the peers' sizes default to the cost model's.
TEST(PeerCostParams, DefaultSizesAreTheCostModelDefaults) {
  EXPECT_EQ(PeerCostParams{}.token_bytes, eval::CostParams{}.token_bytes());
  EXPECT_EQ(PeerCostParams{}.expert_param_bytes, eval::CostParams{}.expert_param_bytes());
  EXPECT_EQ(policy::PolicyConfig{}.token_bytes, eval::CostParams{}.token_bytes());
  EXPECT_EQ(policy::PolicyConfig{}.expert_param_bytes, eval::CostParams{}.expert_param_bytes());
}

TEST(FasterMoeShadowing, ShadowsMustFitTheReplicaBudget) {
  // 4 ranks, 4 experts, 2 slots: one free slot per rank.
  const auto base = ExpertLayout::static_ep(Topology(1, 4), 4, 2);
  const std::vector<ExpertId> shadows{0, 1};
  EXPECT_EQ(fitting_shadow_prefix(base, shadows), 1);
  const auto layout = shadow_layout(base, std::span(shadows).first(1));
  EXPECT_EQ(layout.num_replicas_of(0), 4);
  EXPECT_EQ(layout.num_replicas_of(1), 1);
  EXPECT_THROW(shadow_layout(base, shadows), Error);
  // Shadowing an expert needs no slot on its own rank: with 3 slots two shadows fit.
  const auto roomy = ExpertLayout::static_ep(Topology(1, 4), 4, 3);
  EXPECT_EQ(fitting_shadow_prefix(roomy, shadows), 2);
  // Shadows are distinct experts of the layout: an id out of range read past the layout's
  // tables (a crash), a repeated one failed as "do not fit".
  for (const std::vector<ExpertId>& bad : {std::vector<ExpertId>{99999}, {-1}, {1, 1}}) {
    for (const auto& call : {std::function<void()>([&] { fitting_shadow_prefix(roomy, bad); }),
                             std::function<void()>([&] { shadow_layout(roomy, bad); })}) {
      try {
        call();
        ADD_FAILURE() << "accepted shadows " << bad[0];
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
        const std::string what = e.what();
        EXPECT_TRUE(what.find("out of range [0, 4)") != std::string::npos ||
                    what.find("expert 1 is shadowed twice") != std::string::npos)
            << what;
      }
    }
  }
}

// A shadow takes a slot only on ranks that do not hold the expert: two experts on two ranks with
// one spare slot each can shadow both.
TEST(FasterMoeShadowing, ShadowsUseNoSlotWhereTheExpertAlreadyLives) {
  const auto base = ExpertLayout::static_ep(Topology(1, 2), 2, 2);
  const std::vector<ExpertId> shadows{0, 1};
  EXPECT_EQ(fitting_shadow_prefix(base, shadows), 2);
}

}  // namespace
}  // namespace cobalt::plan
