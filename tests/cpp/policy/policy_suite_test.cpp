// The shared policy suite: every registered policy must pass these invariants on random and real
// traces.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <numeric>
#include <span>

#include "cobalt/core/assignment.hpp"
#include "cobalt/core/error.hpp"
#include "cobalt/eval/cost_model.hpp"
#include "cobalt/eval/metrics.hpp"
#include "cobalt/eval/step_source.hpp"
#include "cobalt/io/trace.hpp"
#include "cobalt/plan/replica_routing.hpp"
#include "cobalt/policy/policy.hpp"
#include "plan/max_flow.hpp"
#include "testing/policy_config.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt::policy {
namespace {

struct ReplayResult {
  std::vector<std::vector<RankId>> exec;     // per (step, layer)
  std::vector<std::vector<ExpertId>> slots;  // layout in force per (step, layer)
  std::vector<int64_t> moves;                // global plans, cross-node and intra-node copies
};

// A suite parameter: a registered policy name, optionally with "@priced" (the configuration then
// carries a cost model, which cobalt+ uses to price its layouts).
struct Spec {
  std::string policy;
  bool priced = false;
};
Spec parse_spec(const std::string& param) {
  const auto at = param.find('@');
  if (at == std::string::npos) return {param, false};
  return {param.substr(0, at), param.substr(at + 1) == "priced"};
}
std::vector<std::string> suite_params() {
  auto params = policy_names();
  params.push_back("cobalt+@priced");
  return params;
}

// Replays `source` through `name`, checking the invariants at every (step, layer).
ReplayResult replay(const std::string& param, PolicyConfig config, const eval::StepSource& source) {
  const Spec spec = parse_spec(param);
  const std::string& name = spec.policy;
  if (spec.priced) config.cost_model = eval::CostParams{};
  auto policy = make_policy(name, config);
  EXPECT_EQ(policy->name(), name);
  ReplayResult run;
  eval::StepScratch scratch;
  for (int s = 0; s < source.num_steps(); ++s) {
    for (int l = 0; l < source.num_layers(); ++l) {
      auto batch = source.batch(s, l, config.topology.num_ranks(), scratch);
      std::vector<RankId> exec(batch.num_tasks(), -1);
      auto layout = policy->run(s, l, batch, exec);
      EXPECT_EQ(layout->slots_per_rank(), config.slots_per_rank) << name;
      EXPECT_EQ(layout->num_experts(), config.num_experts);
      // Every task on a rank holding its expert (throws otherwise).
      EXPECT_NO_THROW(validate_assignment(batch, *layout, exec))
          << name << " step " << s << " layer " << l;
      // Slots respected and no duplicates: re-validate the layout from its raw slots.
      EXPECT_NO_THROW(
          ExpertLayout(layout->topology(), layout->num_experts(), layout->slots_per_rank(),
                       std::vector<ExpertId>(layout->slots().begin(), layout->slots().end())));
      // Loads add up to T * K.
      auto loads = eval::rank_loads(exec, config.topology.num_ranks());
      int64_t total = 0;
      for (auto v : loads) total += v;
      EXPECT_EQ(total, batch.num_tasks());
      run.exec.push_back(std::move(exec));
      run.slots.emplace_back(layout->slots().begin(), layout->slots().end());
    }
  }
  const PolicyCounters& counters = policy->counters();
  run.moves = {counters.num_global_plans, counters.cross_node_moves, counters.intra_node_moves};
  return run;
}

class PolicySuite : public ::testing::TestWithParam<std::string> {};

PolicyConfig config_for(const eval::StepSource& source, const Topology& topo, int threads) {
  PolicyConfig config;
  config.topology = topo;
  config.num_experts = source.num_experts();
  config.top_k = source.top_k();
  config.num_layers = source.num_layers();
  config.slots_per_rank = slots_for_rho(config.num_experts, topo.num_ranks(), 0.5);
  config.steps_per_global_plan = 3;
  config.seed = 17;
  config.num_threads = threads;
  config.planner_restarts = 2;
  return config;
}

TEST_P(PolicySuite, InvariantsDeterminismAndThreadIndependenceOnRandomTraces) {
  const std::string name = GetParam();
  auto data = testing::random_trace(3, 7, 3000, 2, 32, 4, 8);
  auto source = eval::make_step_source(data);
  const Topology topo(2, 8);
  auto first = replay(name, config_for(*source, topo, 1), *source);
  auto again = replay(name, config_for(*source, topo, 1), *source);
  auto threaded = replay(name, config_for(*source, topo, 4), *source);
  EXPECT_EQ(first.exec, again.exec) << name << " is not deterministic for a fixed seed";
  EXPECT_EQ(first.slots, again.slots);
  EXPECT_EQ(first.exec, threaded.exec) << name << " depends on the thread count";
  EXPECT_EQ(first.slots, threaded.slots);
}

TEST_P(PolicySuite, InvariantsOnFourNodes) {
  auto data = testing::random_trace(8, 5, 2000, 1, 64, 8, 32);
  auto source = eval::make_step_source(data);
  replay(GetParam(), config_for(*source, Topology(4, 32), 2), *source);
}

TEST_P(PolicySuite, InvariantsOnRealTraces) {
  const std::filesystem::path dir = std::filesystem::path(COBALT_SHARED_DIR) / "data" / "traces";
  if (!std::filesystem::exists(dir)) GTEST_SKIP() << "no shared traces at " << dir;
  for (const char* file :
       {"qwen15-moe-a2.7b_gsm8k_5layers.safetensors", "olmoe-1b-7b_layer0.safetensors"}) {
    io::TraceReader reader((dir / file).string());
    auto source = eval::make_step_source(reader);
    replay(GetParam(), config_for(*source, Topology(2, 8), 1), *source);
  }
}

// Whether `rank_loads` [G] is a split of `counts` [G, E] over the ranks holding each expert: the
// flow source -> expert e (its tasks) -> every rank holding e -> sink (that rank's load) carries
// every task.
bool loads_split_over_holders(std::span<const int64_t> counts, const ExpertLayout& layout,
                              std::span<const int64_t> rank_loads) {
  const int num_experts = layout.num_experts(), num_ranks = layout.topology().num_ranks();
  const int source = num_experts + num_ranks, sink = source + 1;
  plan::MaxFlow flow(num_experts + num_ranks + 2);
  int64_t total = 0;
  for (ExpertId e = 0; e < num_experts; ++e) {
    int64_t count = 0;
    for (RankId s = 0; s < num_ranks; ++s)
      count += counts[static_cast<size_t>(s) * num_experts + e];
    total += count;
    flow.add_edge(source, e, static_cast<double>(count));
    for (RankId r : layout.ranks_of(e))
      flow.add_edge(e, num_experts + r, static_cast<double>(count));
  }
  for (RankId r = 0; r < num_ranks; ++r) {
    if (rank_loads[r] < 0) return false;
    flow.add_edge(num_experts + r, sink, static_cast<double>(rank_loads[r]));
  }
  return std::llround(flow.run(source, sink, 0.5)) == total &&
         std::accumulate(rank_loads.begin(), rank_loads.end(), int64_t{0}) == total;
}

// Load-only replays (Policy::run_loads): each rank executes only tasks of experts it holds in the
// returned layout, and the loads add up, at every step of a drifting, skewed workload, with E = 36
// on 8 ranks (ranks hold 4 or 5 mains, so the ones with fewer have a spare slot). Policies that
// need token ids refuse load-only input (kFailedPrecondition) and are skipped.
TEST_P(PolicySuite, RunLoadsSplitsTheCountsOverTheRanksHoldingEachExpert) {
  const Spec spec = parse_spec(GetParam());
  const Topology topo(2, 8);
  PolicyConfig config =
      testing::small_policy_config(topo, 36, 4, slots_for_rho(36, topo.num_ranks(), 0.5));
  config.steps_per_global_plan = 2;
  if (spec.priced) config.cost_model = eval::CostParams{};
  auto policy = make_policy(spec.policy, config);
  std::vector<int64_t> rank_loads(topo.num_ranks());
  for (int step = 0; step < 6; ++step) {
    auto owned = testing::random_batch(300 + step, 1500, 4, 36, topo.num_ranks(), 2.0);
    const auto counts = plan::count_demand(owned.view());
    std::shared_ptr<const ExpertLayout> layout;
    try {
      layout = policy->run_loads(step, 0, counts, rank_loads);
    } catch (const Error& error) {
      if (step == 0 && error.code() == ErrorCode::kFailedPrecondition) {
        GTEST_SKIP() << spec.policy << " needs token ids: " << error.what();
      }
      throw;
    }
    EXPECT_TRUE(loads_split_over_holders(counts, *layout, rank_loads))
        << spec.policy << " step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(AllPolicies, PolicySuite, ::testing::ValuesIn(suite_params()),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

TEST(CobaltPolicy, AsyncPlanningIsDeterministic) {
  auto data = testing::random_trace(4, 8, 2000, 1, 32, 4, 8);
  auto source = eval::make_step_source(data);
  auto config = config_for(*source, Topology(2, 8), 1);
  config.async_planning = true;
  for (const char* name : {"cobalt", "cobalt+"}) {
    auto a = replay(name, config, *source);
    auto b = replay(name, config, *source);
    EXPECT_EQ(a.exec, b.exec) << name;
    EXPECT_EQ(a.slots, b.slots) << name;
  }
}

// The suite's random traces are a few thousand tokens per batch: one chunk for every parallel
// pass, so they cannot tell a chunk merge from a serial pass. Here batches of 140,000 tokens
// split everywhere the policies use threads: the routing statistics (chunks of 65,536 tokens),
// Algorithm 1 and the balanced assignment (8,192), the chain spill (2 x 4,096), and the planner's
// restarts. 1, 2 and 3 threads must give the same tasks' ranks, layouts and moves, with a plan
// every step and with background planning. (The peers read no thread count: the suite above.)
TEST(CobaltPolicy, ChunkedPassesGiveTheSameRunForAnyThreadCount) {
  constexpr int64_t kTokens = 140000;
  auto data = testing::random_trace(8, 3, kTokens, 1, 32, 4, 16);
  auto source = eval::make_step_source(data);
  static_assert(kTokens >= 2 * 65536, "every parallel pass must split into chunks");
  for (const char* param : {"cobalt", "cobalt+", "cobalt+@priced"}) {
    for (const bool async : {false, true}) {
      std::vector<ReplayResult> runs;
      for (const int threads : {1, 2, 3}) {
        auto config = config_for(*source, Topology(4, 16), threads);
        config.steps_per_global_plan = 1;
        config.async_planning = async;
        runs.push_back(replay(param, config, *source));
      }
      for (size_t i = 1; i < runs.size(); ++i) {
        EXPECT_EQ(runs[0].exec, runs[i].exec) << param << " async " << async << ", run " << i;
        EXPECT_EQ(runs[0].slots, runs[i].slots) << param << " async " << async << ", run " << i;
        EXPECT_EQ(runs[0].moves, runs[i].moves) << param << " async " << async << ", run " << i;
      }
    }
  }
}

// 2 nodes x 4 ranks, E = 8, top-2, 3 slots per rank: the small shape of the tests below.
PolicyConfig small_config() {
  PolicyConfig config;
  config.topology = Topology(2, 4);
  config.num_experts = 8;
  config.top_k = 2;
  config.slots_per_rank = 3;
  return config;
}

TEST(PolicyRegistry, UnknownNameListsValidOnes) {
  PolicyConfig config = small_config();
  try {
    make_policy("nope", config);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid: static"), std::string::npos) << e.what();
  }
  config.slots_per_rank =
      1;  // 8 ranks x 1 slot = 8 >= 8 experts is fine; 7 experts... make it too small:
  config.num_experts = 9;
  EXPECT_THROW(make_policy("static", config), Error);
  config.num_experts = 8;
  config.slots_per_rank = 2;  // 4 ranks x 2 slots = 8 experts
  EXPECT_NO_THROW(make_policy("static", config));
  for (double bad : {0.0, -1.0, std::nan("")}) {
    PolicyConfig c = config;
    c.token_bytes = bad;
    EXPECT_THROW(make_policy("topoep", c), Error) << "token bytes " << bad;
    c = config;
    c.expert_param_bytes = bad;
    EXPECT_THROW(make_policy("topoep", c), Error) << "expert bytes " << bad;
  }
  PolicyConfig c = config;
  c.num_threads = -1;
  EXPECT_THROW(make_policy("cobalt", c), Error);
}

// Every registered policy has a memory estimate; it grows with the layers, experts and ranks as
// its state does (E x E statistics for the cobalt family, [G, E] tables for the peers).
TEST(PolicyRegistry, EveryPolicyHasAMemoryEstimate) {
  PolicyConfig config = small_config();
  config.num_layers = 2;
  for (const auto& name : policy_names()) {
    const PolicyMemory one = policy_memory(name, config);
    EXPECT_EQ(one.num_layers, 2) << name;
    EXPECT_DOUBLE_EQ(one.total_bytes(), 2 * one.per_layer_bytes + one.working_bytes) << name;
    PolicyConfig more_ranks = config;
    more_ranks.topology = Topology(2, 8);
    PolicyConfig more_experts = config;
    more_experts.num_experts = 16;
    if (name == "static") {
      EXPECT_EQ(one.total_bytes(), 0) << name;  // one layout for every layer, O(G S + E)
      continue;
    }
    EXPECT_GT(one.per_layer_bytes, 0) << name;  // a layout per layer at least
    EXPECT_GT(policy_memory(name, more_ranks).total_bytes(), one.total_bytes()) << name;
    EXPECT_GT(policy_memory(name, more_experts).total_bytes(), one.total_bytes()) << name;
    PolicyConfig async = config;
    async.async_planning = true;
    const bool snapshots = name == "cobalt" || name == "cobalt+";
    EXPECT_EQ(policy_memory(name, async).per_layer_bytes > one.per_layer_bytes, snapshots) << name;
  }
  // E = 65536 on 64 x 128 ranks: laer's demand windows for two layers and its routing tables
  // need ~36 GB (it took that until the kernel killed it; now the estimate refuses it up front).
  PolicyConfig huge = config;
  huge.num_experts = 65536;
  huge.topology = Topology(64, 8192);
  EXPECT_GT(policy_memory("laer", huge).total_bytes(), 3e10);
  try {
    policy_memory("nope", config);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("valid: static"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cobalt::policy

namespace cobalt::policy {
namespace {

// A step without tokens is no observation: a run that starts with one decides as if it had not
// happened (statistics, demand windows and plans alike; plan periods count from the first step
// with tasks, so the run without it starts one step later).
TEST(PolicyRun, AStepWithoutTokensIsNoObservation) {
  PolicyConfig config = testing::small_policy_config(Topology(2, 8), 16, 2, 3);
  config.steps_per_global_plan = 2;
  std::vector<testing::OwnedBatch> batches;
  for (int s = 0; s < 6; ++s) batches.push_back(testing::random_batch(40 + s, 64, 2, 16, 8, 1.0));
  const auto empty = testing::random_batch(1, 0, 2, 16, 8);
  for (const auto& name : policy_names()) {
    auto with_empty = make_policy(name, config), without = make_policy(name, config);
    std::vector<RankId> none;
    with_empty->run(0, 0, empty.view(), none);
    for (int s = 0; s < 6; ++s) {
      std::vector<RankId> a(batches[s].view().num_tasks()), b(a.size());
      const auto layout_a = with_empty->run(s + 1, 0, batches[s].view(), a);
      const auto layout_b = without->run(s, 0, batches[s].view(), b);
      EXPECT_EQ(a, b) << name << " step " << s;
      EXPECT_TRUE(*layout_a == *layout_b) << name << " step " << s;
    }
  }
}

// On one node every layout moves no token across nodes (V = 0), so Cobalt's choice by V alone kept
// the layout in force (static EP) for ever; the expected busiest rank decides there.
TEST(PolicyRun, CobaltPlansOnOneNode) {
  PolicyConfig config = testing::small_policy_config(Topology(1, 8), 64, 2, 12);
  config.steps_per_global_plan = 5;
  double imbalance[3] = {0, 0, 0};
  const char* names[3] = {"static", "cobalt", "cobalt+"};
  for (int i = 0; i < 3; ++i) {
    auto policy = make_policy(names[i], config);
    for (int s = 0; s < 20; ++s) {
      const auto batch = testing::random_batch(900 + s, 2048, 2, 64, 8, 2.0);  // skewed
      std::vector<RankId> exec(batch.view().num_tasks());
      policy->run(s, 0, batch.view(), exec);
      if (s < 10) continue;
      const auto loads = eval::rank_loads(exec, 8);
      const double mean = static_cast<double>(exec.size()) / 8;
      imbalance[i] += static_cast<double>(*std::max_element(loads.begin(), loads.end())) / mean;
    }
    if (i > 0) EXPECT_GE(policy->counters().num_global_plans, 1) << names[i];
  }
  EXPECT_LT(imbalance[1], 0.8 * imbalance[0]) << "cobalt vs static";
  EXPECT_LT(imbalance[2], 0.8 * imbalance[0]) << "cobalt+ vs static";
}

// run_loads refuses negative counts before the policy changes any state.
TEST(PolicyRun, NegativeCountsAreRefusedBeforeAnyStateChanges) {
  const PolicyConfig config = testing::small_policy_config(Topology(2, 8), 8, 2, 3);
  std::vector<int64_t> good(8 * 8), bad, huge;
  for (size_t i = 0; i < good.size(); ++i) good[i] = static_cast<int64_t>((i * 7) % 13);
  bad = good;
  bad[9] = -5;
  huge = good;  // counts summing past 2^52 gave loads of -2^63 or 0
  huge[3] = huge[4] = int64_t{1} << 62;
  for (const auto& name : policy_names()) {
    auto policy = make_policy(name, config), fresh = make_policy(name, config);
    std::vector<int64_t> loads(8), fresh_loads(8);  // G = 8
    try {  // policies that need token ids refuse load-only input altogether
      std::vector<int64_t> probe(8);
      make_policy(name, config)->run_loads(0, 0, good, probe);
    } catch (const Error& error) {
      if (error.code() == ErrorCode::kFailedPrecondition) continue;
      throw;
    }
    try {
      policy->run_loads(0, 0, bad, loads);
      ADD_FAILURE() << name << " accepted a negative count";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("counts[1][1] = -5 is negative"), std::string::npos)
          << error.what();
    }
    try {
      policy->run_loads(0, 0, huge, loads);
      ADD_FAILURE() << name << " accepted counts summing past 2^52";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(error.what()).find("the counts sum past 2^52 tasks (at counts[0][3]"),
                std::string::npos)
          << error.what();
    }
    EXPECT_EQ(policy->counters().num_global_plans, 0) << name;
    const auto layout = policy->run_loads(1, 0, good, loads);
    const auto fresh_layout = fresh->run_loads(1, 0, good, fresh_loads);
    EXPECT_EQ(loads, fresh_loads) << name;
    EXPECT_TRUE(*layout == *fresh_layout) << name;
  }
}

TEST(PolicyRun, RejectsBatchesThatDoNotMatchTheConfiguration) {
  PolicyConfig config = small_config();
  for (const auto& name : policy_names()) {
    auto policy = make_policy(name, config);
    auto wrong_experts = testing::random_batch(1, 10, 2, 16, 4);  // E = 16, configured 8
    std::vector<RankId> exec(20);
    EXPECT_THROW(policy->run(0, 0, wrong_experts.view(), exec), Error) << name;
    auto ok = testing::random_batch(1, 10, 2, 8, 4);
    EXPECT_THROW(policy->run(0, 1, ok.view(), exec), Error) << name << ": layer out of range";
    std::vector<RankId> short_exec(5);
    EXPECT_THROW(policy->run(0, 0, ok.view(), short_exec), Error) << name;
  }
}

// Steps start at 0 and never go back within a layer (a step may repeat: micro-batches); a step
// out of order is refused with its layer and the previous step named, and changes nothing: the
// next in-order step gives what it gives without the refused call.
TEST(PolicyRun, StepsMustNotDecreasePerLayer) {
  PolicyConfig config = small_config();
  config.num_layers = 2;
  config.steps_per_global_plan = 2;
  const auto batch = testing::random_batch(3, 40, 2, 8, 4);
  for (const auto& name : policy_names()) {
    auto policy = make_policy(name, config), twin = make_policy(name, config);
    std::vector<RankId> exec(80), twin_exec(80);
    for (int64_t step : {0, 0, 1, 3}) {  // repeats and gaps are fine
      policy->run(step, 0, batch.view(), exec);
      twin->run(step, 0, batch.view(), twin_exec);
    }
    policy->run(0, 1, batch.view(), exec);  // layers keep their own order
    twin->run(0, 1, batch.view(), twin_exec);
    try {
      policy->run(2, 0, batch.view(), exec);
      ADD_FAILURE() << name << ": accepted step 2 after step 3";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << name;
      EXPECT_NE(std::string(e.what()).find("step 2 of layer 0 after step 3"), std::string::npos)
          << e.what();
    }
    EXPECT_THROW(policy->run(-1, 1, batch.view(), exec), Error) << name;
    const auto layout = policy->run(4, 0, batch.view(), exec);
    const auto twin_layout = twin->run(4, 0, batch.view(), twin_exec);
    EXPECT_EQ(exec, twin_exec) << name;
    EXPECT_TRUE(*layout == *twin_layout) << name;
  }
}

// Micro-batches (gradient accumulation: a step given in several calls). Every policy but the
// per-call ones keeps the layout decided at a step's first call for the whole step. The
// history-based ones (and static) also fold the later calls into one observation of the step,
// so a step given as two micro-batches is the step given whole: the same layouts over the
// following steps and the same re-layout counters (decay 0.5 keeps every EMA sum exact).
// cobalt+ keeps one layout per step but runs stage 2b on the first micro-batch's counts, so its
// layouts may differ from the whole step's (CobaltPolicy tests). The per-call ones plan from each
// call's own counts: fastermoe shadows per forward pass, topoep and ultraep solve per microbatch.
TEST(PolicyRun, MicroBatchesOfAStepKeepItsLayout) {
  const std::vector<std::string> per_call = {"fastermoe", "topoep", "ultraep"};
  const std::vector<std::string> step_equals_whole = {"static",   "cobalt",  "eplb",
                                                      "smartmoe", "flexmoe", "laer"};
  const std::vector<std::string> step_keeps_layout = {"cobalt+"};
  PolicyConfig config = testing::small_policy_config(Topology(4, 16), 32, 4, 3);
  config.steps_per_global_plan = 2;
  config.ema_decay = 0.5;
  config.seed = 5;
  const ExpertLayout static_ep =
      ExpertLayout::static_ep(config.topology, config.num_experts, config.slots_per_rank);
  auto in = [](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  for (const auto& name : policy_names()) {
    ASSERT_TRUE(in(per_call, name) || in(step_equals_whole, name) || in(step_keeps_layout, name))
        << name << ": say how this policy treats micro-batches";
    auto halves = make_policy(name, config), whole = make_policy(name, config);
    int relaid_steps = 0;
    for (int64_t step = 0; step < 7; ++step) {
      // The hot experts move every other step, so the history-based policies re-lay out.
      auto batch = testing::random_batch(40 + step, 2000, 4, 32, 16, 1.5);
      for (auto& e : batch.topk_ids) e = static_cast<ExpertId>((e + 7 * (step / 2)) % 32);
      const auto first = testing::token_range(batch, 0, 1300);
      const auto second = testing::token_range(batch, 1300, 700);
      std::vector<RankId> exec_first(first.topk_ids.size()), exec_second(second.topk_ids.size());
      std::vector<RankId> exec_whole(batch.topk_ids.size());
      const auto layout_first = halves->run(step, 0, first.view(), exec_first);
      const auto layout_second = halves->run(step, 0, second.view(), exec_second);
      const auto layout_whole = whole->run(step, 0, batch.view(), exec_whole);
      if (in(per_call, name)) continue;
      EXPECT_TRUE(layout_first.get() == layout_second.get())
          << name << ": the layout moved within step " << step;
      if (!in(step_equals_whole, name)) continue;
      if (!(*layout_first == *layout_whole)) {
        ADD_FAILURE() << name << ": step " << step << "'s layout differs from the step given whole";
        break;
      }
      relaid_steps += !(*layout_whole == static_ep);
    }
    if (!in(step_equals_whole, name)) continue;
    const PolicyCounters& a = halves->counters();
    const PolicyCounters& b = whole->counters();
    EXPECT_EQ(a.num_global_plans, b.num_global_plans) << name;
    EXPECT_EQ(a.intra_node_moves, b.intra_node_moves) << name;
    EXPECT_EQ(a.cross_node_moves, b.cross_node_moves) << name;
    if (name != "static") EXPECT_GT(relaid_steps, 0) << name << ": never left static EP";
  }
}

}  // namespace
}  // namespace cobalt::policy
