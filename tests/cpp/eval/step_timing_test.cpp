// Step timing (`cobalt bench`): the operations run in order, each the number of times asked, on
// the inputs the policies give them (the reported results equal the library calls made directly),
// independent of the thread count; bad options are rejected by name.
#include "cobalt/eval/step_timing.hpp"

#include <gtest/gtest.h>

#include "cobalt/assign/node_cover.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/core/expert_layout.hpp"
#include "cobalt/eval/metrics.hpp"
#include "cobalt/plan/global_planner.hpp"
#include "cobalt/policy/policy.hpp"
#include "cobalt/stats/routing_stats.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::eval {
namespace {

StepTimingOptions options_for(const Topology& topo, int num_experts) {
  StepTimingOptions o;
  o.topology = topo;
  o.slots_per_rank = slots_for_rho(num_experts, topo.num_ranks(), 0.5);
  o.reps = 3;
  o.step = 4;
  o.layer = 1;
  o.seed = 9;
  return o;
}

TEST(StepTiming, TimesEveryOperationInOrderOnThePoliciesInputs) {
  const Topology topo(2, 8);
  const auto owned = testing::random_batch(3, 3000, 4, 32, topo.num_ranks(), 1.0);
  const RoutingBatch batch = owned.view();
  auto options = options_for(topo, 32);
  std::vector<std::string> announced;
  options.on_operation = [&](const std::string& name) { announced.push_back(name); };
  const auto ops = time_step_operations(batch, options);

  const std::vector<std::string> expected = {
      "copy_bound",      "stats_update", "plan_heuristic",   "pack_ranks",      "assign",
      "assign_portable", "rebalance",    "assign_balanced",  "dispatch_layout", "dispatch_fresh",
      "demand_matrix",   "topoep_solve", "cobalt_plan_step", "cobalt_step",     "cobalt+_plan_step",
      "cobalt+_step",    "topoep_step"};
  ASSERT_EQ(ops.size(), expected.size());
  EXPECT_EQ(announced, expected);
  for (size_t i = 0; i < ops.size(); ++i) {
    SCOPED_TRACE(ops[i].name);
    EXPECT_EQ(ops[i].name, expected[i]);
    EXPECT_EQ(ops[i].reps, 3);
    EXPECT_FALSE(ops[i].what.empty());
    const bool is_assignment = ops[i].name == "assign" || ops[i].name == "assign_portable" ||
                               ops[i].name == "assign_balanced";
    EXPECT_EQ(ops[i].copy_ratio > 0, is_assignment);
    EXPECT_EQ(ops[i].policy_step, i >= 12);
  }
  const auto op_named = [&](const std::string& name) -> const TimedOperation& {
    for (const auto& op : ops) {
      if (op.name == name) return op;
    }
    throw std::runtime_error("no row " + name);
  };
  EXPECT_EQ(ops[0].items, 3000);      // tokens
  EXPECT_EQ(ops[8].items, 3000 * 4);  // tasks
  EXPECT_EQ(ops[9].items, 3000 * 4);
  EXPECT_EQ(ops[2].items, 0);  // planning has no per-item rate

  // The reported cross-node transfers are those of the library calls the cobalt policy makes:
  // stage 1 (restarts + the incremental one from static EP), packing, Algorithm 1 keyed by the
  // batch's (step, layer).
  RoutingStats stats(32, 0.9);
  stats.update(batch);
  const plan::GlobalPlanInput input{
      topo, 32, options.slots_per_rank, 0.15, stats.expert_load(), stats.coactivation(), {}, 0.0};
  const ExpertLayout static_layout = ExpertLayout::static_ep(topo, 32, options.slots_per_rank);
  const plan::NodePlan current = plan::node_plan_of(static_layout, stats.expert_load());
  plan::HeuristicOptions heuristic;
  heuristic.num_restarts = 8;
  heuristic.seed = 9;
  heuristic.initial = &current;
  const auto planned = plan::plan_global_heuristic(input, heuristic);
  const ExpertLayout layout = plan::pack_ranks(input, planned.plan, &static_layout, nullptr);
  std::vector<RankId> exec(batch.num_tasks());
  assign::assign_node_cover(batch, layout, {9, 4, 1, 0}, {}, exec);
  const auto metrics = step_metrics(batch, exec, topo);
  EXPECT_EQ(ops[4].note.rfind(fmt::format("V {},", metrics.transfers.dedup), 0), 0u) << ops[4].note;
  EXPECT_NE(ops[4].note.find(fmt::format("(layout floor {:.3f})",
                                         imbalance_floor(metrics.expert_counts, layout))),
            std::string::npos)
      << ops[4].note;
  EXPECT_EQ(ops[3].note, fmt::format("{} replicas for 32 experts", layout.num_replicas()));

  // The policy rows run the registered policies as the simulator does: the plan step is the
  // second step a fresh policy sees, an ordinary step comes after it; their assignments match.
  policy::PolicyConfig config;
  config.topology = topo;
  config.num_experts = 32;
  config.top_k = 4;
  config.num_layers = 2;
  config.slots_per_rank = options.slots_per_rank;
  config.seed = 9;
  for (const std::string name : {"cobalt", "cobalt+"}) {
    auto pol = policy::make_policy(name, config);
    std::vector<RankId> policy_exec(batch.num_tasks());
    pol->run(4, 1, batch, policy_exec);
    const auto planned_layout = pol->run(5, 1, batch, policy_exec);
    const auto plan_step = step_metrics(batch, policy_exec, topo);
    const auto& row = op_named(name + "_plan_step");
    EXPECT_EQ(row.note.rfind(fmt::format("V {}, imbalance {:.3f} (layout floor {:.3f})",
                                         plan_step.transfers.dedup, plan_step.imbalance,
                                         imbalance_floor(plan_step.expert_counts, *planned_layout)),
                             0),
              0u)
        << name << ": " << row.note;
    EXPECT_NE(row.note.find("planning (both stages)"), std::string::npos) << row.note;
  }
  auto topoep = policy::make_policy("topoep", config);
  std::vector<RankId> topoep_exec(batch.num_tasks());
  topoep->run(4, 1, batch, topoep_exec);
  const auto& topoep_row = op_named("topoep_step");
  EXPECT_EQ(topoep_row.note.rfind(
                fmt::format("V {},", step_metrics(batch, topoep_exec, topo).transfers.dedup), 0),
            0u)
      << topoep_row.note;
}

TEST(StepTiming, StopsRepeatingWhenTheTimeBudgetRunsOut) {
  const Topology topo(2, 8);
  const auto owned = testing::random_batch(3, 2000, 4, 32, topo.num_ranks());
  auto options = options_for(topo, 32);
  options.reps = 100000;
  options.max_seconds = 1e-9;  // every row stops after its first timed run
  for (const auto& op : time_step_operations(owned.view(), options)) {
    EXPECT_EQ(op.reps, 1) << op.name;
    EXPECT_EQ(op.median_ms, op.min_ms) << op.name;
  }
}

TEST(StepTiming, ResultsDoNotDependOnTheThreadCount) {
  const Topology topo(4, 16);
  // 40000 tokens: the assignments split them into several chunks per thread.
  const auto owned = testing::random_batch(5, 40000, 8, 64, topo.num_ranks(), 2.0);
  auto options = options_for(topo, 64);
  options.reps = 1;
  const auto one = time_step_operations(owned.view(), options);
  options.num_threads = 2;
  const auto two = time_step_operations(owned.view(), options);
  ASSERT_EQ(one.size(), two.size());
  // The notes' results, not their measured times ("; planning ... ms").
  auto results = [](const std::string& note) { return note.substr(0, note.find(';')); };
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(results(one[i].note), results(two[i].note)) << one[i].name;
  }
}

TEST(StepTiming, RejectsBadOptions) {
  const Topology topo(2, 8);
  const auto owned = testing::random_batch(3, 100, 4, 32, topo.num_ranks());
  const RoutingBatch batch = owned.view();
  auto expect_rejected = [&](StepTimingOptions o, const std::string& words) {
    try {
      time_step_operations(batch, o);
      ADD_FAILURE() << "accepted: " << words;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  auto o = options_for(topo, 32);
  o.topology = Topology(2, 4);
  expect_rejected(o, "the cluster has 4 ranks, the batch was mapped to 8");
  o = options_for(topo, 32);
  o.slots_per_rank = 1;
  expect_rejected(o, "1 slots per rank out of range [4, 32]");
  o = options_for(topo, 32);
  o.reps = 0;
  expect_rejected(o, "reps 0 out of range");
  o = options_for(topo, 32);
  o.num_threads = 0;
  expect_rejected(o, "threads 0 must be >= 1");
  o = options_for(topo, 32);
  o.planner_restarts = 0;
  expect_rejected(o, "planner restarts 0 must be >= 1");
  o = options_for(topo, 32);
  o.layer = -1;
  expect_rejected(o, "layer -1 out of range");
  o = options_for(topo, 32);
  o.max_seconds = 0;
  expect_rejected(o, "max seconds 0 out of range");
  o = options_for(topo, 32);
  o.reps = 100001;
  expect_rejected(o, "reps 100001 out of range [1, 100000]");
  o = options_for(topo, 32);
  o.eps = 1e7;  // refused up front, not by the planner after the first rows were timed
  expect_rejected(o, "eps 10000000 out of range [0, 1000000]");
  const testing::OwnedBatch empty{{}, {}, 4, 32, 8};
  try {
    time_step_operations(empty.view(), options_for(topo, 32));
    ADD_FAILURE() << "an empty batch was timed";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("holds no tokens"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cobalt::eval
