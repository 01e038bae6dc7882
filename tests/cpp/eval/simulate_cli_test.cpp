// `cobalt simulate` run as the built binary (COBALT_CLI_PATH): the JSON contract, the HTML report
// rendered in headless Chromium, re-chunking, hold-out, memory budget and usage errors. The --dump
// contract is in simulate_dump_cli_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cobalt/io/trace.hpp"
#include "simulate_cli_fixture.hpp"
#include "testing/cli.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt {
namespace {

namespace fs = std::filesystem;

using testing::read_file;
using testing::run_shell;
using testing::RunResult;
using testing::shared_traces;
using testing::SimulateCli;

TEST_F(SimulateCli, JsonFollowsTheSchema) {
  const auto r =
      run("simulate --preset coactivated-late --steps 4 --tokens-per-step 2048 --cluster 2x8 "
          "--policies static,cobalt --json " +
          path("sim.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("modelled"), std::string::npos);
  // 2048 tokens x K = 8 on 16 ranks: 1024 tasks each, so whole tasks do not bound the balance.
  EXPECT_NE(r.out.find("whole-task bound: no layout and assignment has a mean imbalance below "
                       "1.000"),
            std::string::npos)
      << r.out;
  const auto j = json("sim.json");
  const auto& s = j["scenario"];
  EXPECT_EQ(s["cluster"], "2x8");
  EXPECT_EQ(s["cluster_preset"], "4x8-b200");
  EXPECT_EQ(s["model"]["name"], "glm-4.5-air");  // E=128, K=8
  EXPECT_EQ(s["measured_steps"], nlohmann::json::array({1, 4}));
  EXPECT_TRUE(s["cost_model"]["note"].get<std::string>().find("modelled") != std::string::npos);
  // The planning term is measured wall time (the default scale is 1): the outputs say so.
  EXPECT_NE(s["cost_model"]["note"].get<std::string>().find("measured planner wall time"),
            std::string::npos);
  EXPECT_NE(r.out.find("note: planning is measured planner wall time x 1,"), std::string::npos)
      << r.out;
  ASSERT_EQ(j["policies"].size(), 2u);
  EXPECT_GT(j["policies"][1]["num_global_plans"].get<int>(), 0);
  for (const auto& p : j["policies"]) {
    for (const char* key :
         {"name", "cross_node_tokens", "cross_node_bytes", "cross_node_reduction_vs_static",
          "imbalance_mean", "imbalance_max", "imbalance_floor_mean", "imbalance_bound_mean",
          "maxvio_mean", "sim_step_time_s", "speedup_vs_static", "planner_wall_ms",
          "migration_bytes", "time_breakdown_s", "step_cross_node_tokens", "step_imbalance",
          "step_sim_time_s"}) {
      EXPECT_TRUE(p.contains(key)) << key;
    }
    const auto& t = p["time_breakdown_s"];
    const double sum = t["compute"].get<double>() + t["exchange"].get<double>() +
                       t["grad_sync"].get<double>() + t["migration"].get<double>() +
                       t["planning"].get<double>();
    EXPECT_NEAR(sum, p["sim_step_time_s"].get<double>(), 1e-12);
    EXPECT_EQ(p["step_cross_node_tokens"].size(), 4u);
  }
  EXPECT_EQ(j["policies"][0]["speedup_vs_static"], 1.0);
  EXPECT_EQ(s["layout_pricing"], false);
  EXPECT_EQ(r.out.find("priced layouts"), std::string::npos);
}

// 255 tokens x K = 8 on 16 ranks: the busiest rank carries at least 128 of 127.5 tasks, a bound of
// 1.0039 printed rounded down (1.003), so the sentence "no ... below" stays true.
TEST_F(SimulateCli, WholeTaskBoundIsPrintedRoundedDown) {
  const auto r =
      run("simulate --preset coactivated-late --steps 3 --tokens-per-step 255 --cluster 2x8 "
          "--policies static --json " +
          path("bound.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NEAR(json("bound.json")["policies"][0]["imbalance_bound_mean"].get<double>(),
              128.0 / 127.5, 1e-12);
  EXPECT_NE(r.out.find("has a mean imbalance below 1.003 "), std::string::npos) << r.out;
}

TEST_F(SimulateCli, LayoutPricingIsReported) {
  const auto r =
      run("simulate --preset coactivated-late --steps 4 --tokens-per-step 2048 --cluster 2x8 "
          "--policies static,cobalt+ --layout-pricing --json " +
          path("sim.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("priced layouts"), std::string::npos) << r.out;
  EXPECT_EQ(json("sim.json")["scenario"]["layout_pricing"], true);
  EXPECT_EQ(r.out.find("cobalt+ keeps only the replicas that pay"), std::string::npos);
}

// 2048 tokens per step on 16 GPUs: every replica's gradient synchronisation costs more than it
// saves, and the report says so for the policies that fill their replica slots; 262144 tokens per
// step pay for them, and the note goes. Planner time is left out of the model
// (--planner-time-scale 0): measured wall time, it would make the outcome depend on the machine
// (a sanitizer build plans several times slower).
TEST_F(SimulateCli, ReplicasThatDoNotPayAreNoted) {
  const auto small =
      run("simulate --preset coactivated-late --steps 4 --tokens-per-step 2048 --cluster 2x8 "
          "--planner-time-scale 0 --policies static,cobalt,cobalt+,topoep --json " +
          path("small.json") + " --report " + path("small.html"));
  ASSERT_EQ(small.exit_code, 0) << small.err;
  // The HTML report carries the same notes.
  EXPECT_NE(testing::read_file(path("small.html")).find("note: cobalt+ is modelled "),
            std::string::npos);
  const auto doc = json("small.json");  // kept: a range-for over a temporary's member dangles
  for (const auto& p : doc["policies"]) {
    const auto name = p["name"].get<std::string>();
    const auto& t = p["time_breakdown_s"];
    const double step = p["sim_step_time_s"].get<double>();
    const double speedup = p["speedup_vs_static"].get<double>();
    const double sync = t["grad_sync"].get<double>();
    const bool expected = (name == "cobalt" || name == "cobalt+") && speedup < 1 &&
                          sync >= 0.5 * (step - step * speedup) &&
                          sync >= t["migration"].get<double>() &&
                          sync >= t["planning"].get<double>();
    EXPECT_EQ(small.out.find("note: " + name + " is modelled") != std::string::npos, expected)
        << name << "\n"
        << small.out;
  }
  EXPECT_NE(small.out.find("note: cobalt+ is modelled"), std::string::npos) << small.out;
  const auto large =
      run("simulate --preset coactivated-late --steps 11 --warmup-steps 10 --tokens-per-step "
          "262144 --cluster 2x8 --planner-time-scale 0 --policies static,cobalt+");
  ASSERT_EQ(large.exit_code, 0) << large.err;
  EXPECT_EQ(large.out.find("note: cobalt+ is modelled"), std::string::npos) << large.out;
}

TEST_F(SimulateCli, OneStepTraceIsRechunkedSoPoliciesCanPlan) {
  const auto trace = shared_traces() / "olmoe-1b-7b_layer0.safetensors";
  if (!fs::exists(trace)) GTEST_SKIP() << "no shared trace " << trace;
  const auto r = run("simulate --trace '" + trace.string() +
                     "' --cluster 2x8 --policies static,cobalt --json " + path("sim.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("re-chunked into 8 steps"), std::string::npos) << r.out;
  const auto j = json("sim.json");
  EXPECT_EQ(j["scenario"]["num_steps"], 8);
  EXPECT_EQ(j["scenario"]["model"]["name"], "olmoe-1b-7b");
  EXPECT_EQ(j["scenario"]["chunking"]["mode"], "rechunked");
  const auto& cobalt = j["policies"][1];
  EXPECT_GT(cobalt["num_global_plans"].get<int>(), 0);
  EXPECT_LT(cobalt["cross_node_tokens"].get<int64_t>(),
            j["policies"][0]["cross_node_tokens"].get<int64_t>());
}

TEST_F(SimulateCli, HoldoutAndCycling) {
  const auto trace = shared_traces() / "olmoe-1b-7b_layer0.safetensors";
  if (!fs::exists(trace)) GTEST_SKIP() << "no shared trace " << trace;
  const auto r = run("simulate --trace '" + trace.string() +
                     "' --steps 20 --tokens-per-step 1000 --holdout 0.25 --policies static "
                     "--json " +
                     path("sim.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = json("sim.json");
  EXPECT_EQ(j["scenario"]["measured_steps"], nlohmann::json::array({5, 20}));
  EXPECT_EQ(j["scenario"]["chunking"]["mode"], "cycled");
  EXPECT_EQ(j["scenario"]["num_tokens"], 20000);
  EXPECT_EQ(j["scenario"]["holdout"], 0.25);
}

TEST_F(SimulateCli, HoldoutOnACycledTraceSaysItIsNotHeldOut) {
  const auto trace = shared_traces() / "olmoe-1b-7b_layer0.safetensors";
  if (!fs::exists(trace)) GTEST_SKIP() << "no shared trace " << trace;
  const auto r = run("simulate --trace '" + trace.string() +
                     "' --steps 4 --tokens-per-step 8000 --holdout 0.5 --policies static");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("not a held-out evaluation"), std::string::npos) << r.out;
}

// Empty steps are legal in a trace, but a measured window without tokens has nothing to compare:
// a usage error instead of every policy tying at imbalance 1.
TEST_F(SimulateCli, MeasuredStepsWithoutTokensAreRefused) {
  auto d = testing::id_trace(4, 2, 1, 16, [](int64_t t, int k) { return (t + k) % 4; });
  d.step_offsets = {0, 0, 0, 16, 16};  // steps 0, 1 and 3 are empty
  io::write_trace(path("empty_steps.st"), d);
  const std::string base = "simulate --trace '" + path("empty_steps.st") + "' --cluster 2x2 ";
  const auto refused = run(base + "--warmup-steps 3");
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_NE(refused.err.find("measured steps [3, 4) hold no tokens"), std::string::npos)
      << refused.err;
  EXPECT_EQ(run(base + "--warmup-steps 2").exit_code, 0);
}

// Modelled times include measured planner time, so they vary from run to run; without it they
// repeat exactly (everything but the measured planner_wall_ms).
TEST_F(SimulateCli, PlannerTimeScaleZeroMakesModelledTimesRepeat) {
  const std::string base =
      "simulate --preset realistic --steps 4 --tokens-per-step 20000 --layers 2 --cluster 2x4 "
      "--policies static,cobalt,cobalt+ --planner-time-scale 0 --json ";
  ASSERT_EQ(run(base + path("a.json")).exit_code, 0);
  ASSERT_EQ(run(base + path("b.json") + " --threads 2").exit_code, 0);
  auto a = json("a.json"), b = json("b.json");
  EXPECT_EQ(a["scenario"]["cost_model"]["planner_time_scale"], 0.0);
  EXPECT_EQ(a["scenario"]["cost_model"]["note"].get<std::string>().find("planner wall time"),
            std::string::npos);
  for (auto* j : {&a, &b}) {
    for (auto& p : (*j)["policies"]) p.erase("planner_wall_ms");
  }
  EXPECT_EQ(a["policies"], b["policies"]);
  EXPECT_EQ(a["best_policy"], b["best_policy"]);
  EXPECT_EQ(run("simulate --preset uniform --steps 2 --planner-time-scale -1").exit_code, 2);
}

TEST_F(SimulateCli, UsageErrors) {
  const std::string base = "simulate --preset uniform --steps 2 --tokens-per-step 100 ";
  for (const char* bad :
       {"--model gpt-5", "--cluster-preset 2x2-tpu", "--holdout 1.5",
        "--holdout 0.5 --warmup-steps 1", "--policies static,nope", "--overlap 2",
        "--warmup-steps 2", "--policies static,static", "--policies ,", "--policies static,,cobalt",
        "--cluster 4x1073741826", "--json /nonexistent-dir/x.json", "--dump /nonexistent-dir/d"}) {
    const auto r = run(base + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.err;
  }
  const auto measured = run(base + "--warmup-steps 2");
  EXPECT_NE(measured.err.find("--warmup-steps 2 leaves no step to measure"), std::string::npos)
      << measured.err;
  // Without static, the reduction against it is n/a (null), not 0.
  ASSERT_EQ(run(base + "--policies cobalt --json " + path("no_static.json")).exit_code, 0);
  EXPECT_TRUE(json("no_static.json")["policies"][0]["cross_node_reduction_vs_static"].is_null());
  const auto trace = shared_traces() / "olmoe-1b-7b_layer0.safetensors";
  if (fs::exists(trace)) {
    EXPECT_EQ(run("simulate --trace '" + trace.string() + "' --layers 2").exit_code, 2);
    EXPECT_EQ(run("simulate --trace '" + trace.string() + "' --steps 100000").exit_code, 2);
  }
}

// DESIGN.md §5 names clusters "4x8-h800": --cluster takes such a name as --cluster-preset (it
// was "not of the form NxM"), in plan and bench as the preset's shape.
TEST_F(SimulateCli, ClusterTakesAPresetName) {
  const std::string base =
      "simulate --preset uniform --steps 3 --tokens-per-step 256 --planner-time-scale 0 ";
  ASSERT_EQ(run(base + "--cluster 4x8-h800 --json " + path("named.json")).exit_code, 0);
  ASSERT_EQ(run(base + "--cluster-preset 4x8-h800 --json " + path("preset.json")).exit_code, 0);
  const auto named = json("named.json"), preset = json("preset.json");
  EXPECT_EQ(named["scenario"]["cluster_preset"], "4x8-h800");
  EXPECT_EQ(named["scenario"]["cluster"], "4x8");
  for (size_t i = 0; i < preset["policies"].size(); ++i) {
    EXPECT_EQ(named["policies"][i]["sim_step_time_s"], preset["policies"][i]["sim_step_time_s"]);
  }
  auto r = run(base + "--cluster 4x8-h800 --cluster-preset 4x8-b200");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--cluster 4x8-h800 is a cluster preset, and --cluster-preset 4x8-b200 "
                       "another: give one"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(run(base + "--cluster 4x8-h800 --cluster-preset 4x8-h800").exit_code, 0);
  for (const std::string command :
       {base, std::string("plan --preset uniform --steps 2 --tokens-per-step 256 "),
        std::string("bench --preset uniform --steps 2 --tokens-per-step 256 --reps 1 ")}) {
    r = run(command + "--cluster 4x8-b2000");
    EXPECT_EQ(r.exit_code, 2) << command << r.err;
    EXPECT_NE(r.err.find("cluster '4x8-b2000' is neither NxM (N nodes, M ranks per node, e.g. "
                         "4x8) nor a cluster preset (4x8-b200, 4x8-h800)"),
              std::string::npos)
        << command << r.err;
  }
  r = run("plan --preset uniform --steps 2 --tokens-per-step 256 --cluster 4x8-b200 --out " +
          path("plan.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(json("plan.json")["cluster"], "4x8");
  r = run("bench --preset uniform --steps 2 --tokens-per-step 256 --reps 1 --cluster 4x8-b200");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("cluster 4x8,"), std::string::npos) << r.out;
}

TEST_F(SimulateCli, LoadOnlyTraceSkipsTokenLevelPolicies) {
  io::write_trace(path("counts.safetensors"), testing::load_only_trace(3, 8, 16, 2));
  const auto r = run("simulate --trace " + path("counts.safetensors") +
                     " --cluster 2x4 --policies static,cobalt --json " + path("sim.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("skipped"), std::string::npos) << r.out;
  const auto j = json("sim.json");
  EXPECT_TRUE(j["scenario"]["load_only"].get<bool>());
  EXPECT_TRUE(j["policies"][0]["cross_node_tokens"].is_null());
  EXPECT_TRUE(j["policies"][0]["imbalance_mean"].is_number());
  EXPECT_TRUE(j["policies"][1].contains("skipped"));
  // A skipped policy's counts are null, not 0 (which would read as "ran and moved nothing").
  for (const char* field : {"migrated_replicas_cross_node", "migrated_replicas_intra_node",
                            "num_global_plans", "intra_node_moves", "cross_node_moves"}) {
    EXPECT_TRUE(j["policies"][0][field].is_number()) << field;
    EXPECT_TRUE(j["policies"][1][field].is_null()) << field;
  }
  // Counts, not tokens: no token count, and no planning-time note (there is no step time).
  EXPECT_TRUE(j["scenario"]["num_tokens"].is_null());
  EXPECT_NE(r.out.find("load-only counts"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("planner wall time"), std::string::npos) << r.out;
  EXPECT_EQ(j["scenario"]["cost_model"]["note"].get<std::string>().find("planner wall time"),
            std::string::npos);
}

bool can_create_in(const std::string& dir) {
  const std::string probe = dir + "/cobalt-probe-file";
  const bool ok = static_cast<bool>(std::ofstream(probe));
  std::error_code ec;
  fs::remove(probe, ec);
  return ok;
}

// A planner time scale of 1e308 made modelled times infinite: the table printed 300-digit
// numbers and the report's axis ticks dereferenced an empty vector (segfault). The scale is
// bounded now, and at its top the table and the report stay finite.
TEST_F(SimulateCli, PlannerTimeScaleIsBoundedAndReportsStayFinite) {
  const std::string base =
      "simulate --preset uniform --steps 3 --tokens-per-step 256 --cluster 2x2 ";
  const auto huge = run(base + "--planner-time-scale 1e308 --report " + path("x.html"));
  EXPECT_EQ(huge.exit_code, 2) << huge.err;
  EXPECT_NE(huge.err.find("--planner-time-scale: value 1e308 out of range [0, 1000]"),
            std::string::npos)
      << huge.err;
  EXPECT_TRUE(huge.out.empty()) << huge.out;
  EXPECT_FALSE(fs::exists(dir_ / "x.html"));
  const auto top = run(base + "--planner-time-scale 1000 --report " + path("x.html"));
  ASSERT_EQ(top.exit_code, 0) << top.err;
  std::istringstream lines(top.out);
  for (std::string line; std::getline(lines, line);) {
    EXPECT_LT(line.size(), 200u) << line;
    EXPECT_EQ(line.find("inf"), std::string::npos) << line;
    EXPECT_EQ(line.find("nan"), std::string::npos) << line;
  }
  const std::string html = read_file(dir_ / "x.html");
  for (const char* bad : {"\"nan", "\"inf", "\"-nan", "\"-inf", ",nan", ",inf"}) {
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  }
}

// The per-layer statistics of cobalt and cobalt+ (~19 E^2 bytes a layer each) were checked one
// matrix at a time: a 3.5 KB trace with L = 200, E = 1024 took 6.7 GB. The whole run's estimate
// is checked against the budget (COBALT_MEMORY_LIMIT here) before anything is allocated. The
// policies replay one at a time, each freed after its replay: the largest one counts.
TEST_F(SimulateCli, RunsBeyondTheMemoryBudgetAreRefusedUpFront) {
  auto d = testing::id_trace(1024, 1, 4, 4, [](int64_t i, int) { return i * 37 % 1024; });
  d.step_offsets = {0, 1, 2, 3, 4};
  io::write_trace(path("wide.safetensors"), d);
  const std::string sim = "simulate --trace " + path("wide.safetensors") + " --cluster 2x2 ";
  auto limited = [&](const std::string& limit, const std::string& args) {
    return run_shell(
        "COBALT_MEMORY_LIMIT=" + limit + " '" + std::string(COBALT_CLI_PATH) + "' " + args, dir_);
  };
  const auto r = limited("80M", sim + "--json " + path("o.json"));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  // 19 MiB a layer x 4 layers and 10 MiB of planner copies (the four 1-token steps add 64 bytes).
  EXPECT_NE(r.err.find("the largest policy, cobalt, 86 MiB: 19 MiB a layer x 4 layers + 10 MiB "
                       "once for E = 1024 experts on G = 4 ranks"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("needs 86 MiB, above the memory budget of 80 MiB (COBALT_MEMORY_LIMIT)"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--policies"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  EXPECT_FALSE(fs::exists(dir_ / "o.json"));
  // Without the cobalt family it fits; with it, a larger budget fits every policy (cobalt and
  // cobalt+ once counted twice: 162 MiB).
  EXPECT_EQ(limited("80M", sim + "--policies static,smartmoe,laer,topoep").exit_code, 0);
  EXPECT_EQ(limited("100M", sim).exit_code, 0);
  // The peers' [G, E] tables count: laer keeps a window of three int64 [G, E] demand matrices a
  // layer (25 x E x G bytes with its layout) and plans from ~19 x E x G bytes once: 60 MiB at
  // E = 1024 on G = 512.
  const std::string wide = "simulate --trace " + path("wide.safetensors") + " --cluster 8x64 ";
  const auto peer = limited("50M", wide + "--policies static,laer");
  EXPECT_EQ(peer.exit_code, 1) << peer.err;
  EXPECT_NE(peer.err.find("the largest policy, laer, 60 MiB: 12 MiB a layer x 4 layers + 10 MiB "
                          "once for E = 1024 experts on G = 512 ranks"),
            std::string::npos)
      << peer.err;
  EXPECT_EQ(limited("50M", wide + "--policies static,eplb").exit_code, 0);
  // Steps re-chunked from a trace are as large as --tokens-per-step says: 2^24 tokens x top-1
  // need ~160 MiB of per-step work (a top-8 trace took 1.2 GB unchecked).
  const auto big_steps = limited("100M", sim + "--policies static --steps 2 --tokens-per-step " +
                                             std::to_string(int64_t{1} << 24));
  EXPECT_EQ(big_steps.exit_code, 1) << big_steps.err;
  EXPECT_NE(big_steps.err.find("the largest step's work 160 MiB (16777216 tokens x top-1)"),
            std::string::npos)
      << big_steps.err;
  // A generated workload is checked before it is generated.
  const auto gen = limited("1M", "simulate --preset uniform --steps 100 --tokens-per-step 10000");
  EXPECT_EQ(gen.exit_code, 1) << gen.err;
  EXPECT_NE(gen.err.find("the generated trace (2 layers x 100 steps x 10000 tokens x top-8)"),
            std::string::npos)
      << gen.err;
  const auto trace_gen = limited("1M",
                                 "trace gen --preset uniform --steps 100 --tokens-per-step "
                                 "10000 --out " +
                                     path("t.st"));
  EXPECT_EQ(trace_gen.exit_code, 1) << trace_gen.err;
  EXPECT_FALSE(fs::exists(dir_ / "t.st"));
  const auto bad = limited("lots", sim);
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  EXPECT_NE(bad.err.find("COBALT_MEMORY_LIMIT 'lots' is not a memory size"), std::string::npos)
      << bad.err;
}

// CLI11 reads integers with strtoll(..., 0): "--steps 010" was octal 8, "--seed 010" seed 8 and
// "--steps 08" an error. Integer options are decimal now.
TEST_F(SimulateCli, IntegerOptionsAreDecimal) {
  const std::string base =
      "simulate --preset uniform --tokens-per-step 64 --cluster 2x2 "
      "--policies static --json " +
      path("o.json") + " ";
  ASSERT_EQ(run(base + "--steps 010 --seed 010").exit_code, 0);
  EXPECT_EQ(json("o.json")["scenario"]["num_steps"], 10);
  EXPECT_EQ(json("o.json")["scenario"]["seed"], 10);
  ASSERT_EQ(run(base + "--steps 08 --seed +09").exit_code, 0);
  EXPECT_EQ(json("o.json")["scenario"]["num_steps"], 8);
  EXPECT_EQ(json("o.json")["scenario"]["seed"], 9);
  for (const auto& [args, words] : std::vector<std::pair<std::string, std::string>>{
           {"--steps 0x10", "--steps: value '0x10' is not a decimal integer (valid range [1, "},
           {"--steps 1e3", "not a decimal integer"},
           {"--steps ' 5'", "not a decimal integer"},
           {"--seed -1", "--seed: value -1 out of range [0, 2^64 - 1]"},
           {"--threads 1e9",
            "--threads: value '1e9' is not a decimal integer (valid range [1, "
            "1024])"},
           {"--threads 9999999999", "--threads: value 9999999999 out of range [1, 1024]"},
           {"--layers 5000", "--layers: value 5000 out of range [1, 4096]"}}) {
    const auto r = run(base + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(words), std::string::npos) << args << "\n" << r.err;
  }
}

// Real-valued options are decimal too: std::stod took hex (--rho 0x10 was 16) and called a
// subnormal such as 1e-320 "not a number"; --holdout had no check, so '' was ignored.
TEST_F(SimulateCli, RealOptionsAreDecimal) {
  const std::string base =
      "simulate --preset uniform --steps 8 --tokens-per-step 64 --cluster 2x2 --policies static ";
  EXPECT_EQ(run(base + "--rho 1e-320").exit_code, 0);
  EXPECT_EQ(run(base + "--rho +0.5 --eps .2").exit_code, 0);
  // The option stores exactly the value checked: CLI11 alone rounds twice (strtold, then to
  // double), which turned a holdout just below 1 into 1; -0 is stored as 0.
  const auto near_one = run(base + "--holdout 0.99999999999999994448884876874217 --json " +
                            path("h.json") + " --rho -0");
  EXPECT_EQ(near_one.exit_code, 0) << near_one.err;
  const auto holdout = json("h.json")["scenario"];
  EXPECT_LT(holdout["holdout"].get<double>(), 1.0);
  EXPECT_FALSE(std::signbit(holdout["rho"].get<double>()));
  // A huge value written with a negative exponent is huge, not 0.
  const std::string huge = "1" + std::string(400, '0') + "e-5";
  for (const auto& [args, words] : std::vector<std::pair<std::string, std::string>>{
           {"--rho 0x10", "--rho: value '0x10' is not a number (valid: (a finite number >= 0))"},
           {"--rho +-1", "--rho: value '+-1' is not a number"},
           {"--rho ' 1'", "--rho: value ' 1' is not a number"},
           {"--rho 1e999", "--rho: value 1e999 out of range (a finite number >= 0)"},
           {"--eps " + huge,
            "--eps: value 1000000000000000000000000000000000000000... out of "
            "range [0, 1000000]"},
           {"--eps inf", "--eps: value inf out of range"},
           {"--holdout ''", "--holdout: value '' is not a number (valid: (0, 1))"},
           {"--holdout 1", "--holdout: value 1 out of range (0, 1)"},
           {"--holdout abc", "--holdout: value 'abc' is not a number (valid: (0, 1))"}}) {
    const auto r = run(base + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(words), std::string::npos) << args << "\n" << r.err;
  }
}

// An all-zero load-only trace was replayed (exit 0, every policy at imbalance 1.000): refused
// like a token trace without measured tokens. `trace info` said "pass --ranks G" with G known.
TEST_F(SimulateCli, ALoadOnlyTraceOfZerosIsRefused) {
  io::TraceData d = testing::load_only_trace(3, 4, 8, 2);
  std::fill(d.counts.begin(), d.counts.end(), 0);
  io::write_trace(path("zeros.safetensors"), d);
  const auto r = run("simulate --trace " + path("zeros.safetensors") + " --cluster 2x2");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("holds no tokens"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  // Zeros in the measured steps only: the usual hint.
  io::TraceData late = testing::load_only_trace(3, 4, 8, 2);
  std::fill(late.counts.begin() + 4 * 8, late.counts.end(), 0);  // steps 1 and 2
  io::write_trace(path("late.safetensors"), late);
  const auto w = run("simulate --trace " + path("late.safetensors") + " --cluster 2x2");
  EXPECT_EQ(w.exit_code, 2) << w.err;
  EXPECT_NE(w.err.find("the measured steps [1, 3) hold no tokens (every count is zero)"),
            std::string::npos)
      << w.err;
  const auto info = run("trace info " + path("zeros.safetensors"));
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("static-EP imbalance (G=4)  n/a (no step with tokens)"),
            std::string::npos)
      << info.out;
  EXPECT_EQ(info.out.find("pass --ranks"), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("source locality (TV)       n/a (no tokens)"), std::string::npos)
      << info.out;
}

// A trace with top-k > 16: static (and the rest) ran, then cobalt failed with "assignment: top-k
// 40 out of range [1, 16]". Every requested policy is checked before any runs.
TEST_F(SimulateCli, TopKAboveSixteenIsRefusedBeforeAnyPolicyRuns) {
  auto d = testing::id_trace(64, 40, 1, 16, [](int64_t t, int k) { return (t + k) % 64; });
  d.step_offsets = {0, 4, 8, 12, 16};
  io::write_trace(path("k40.safetensors"), d);
  const auto r = run("simulate --trace " + path("k40.safetensors") + " --cluster 2x2");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("the workload has top-k 40; policy cobalt, cobalt+ replays top-k <= 16"),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
  const auto others = run("simulate --trace " + path("k40.safetensors") +
                          " --cluster 2x2 --policies static,topoep,eplb");
  EXPECT_EQ(others.exit_code, 0) << others.err;
}

// Output directories that do not let us create files failed after the whole run (the table was
// printed, then the write failed). Checked before the run now, for every command's outputs.
TEST_F(SimulateCli, UnwritableOutputsAreRefusedBeforeTheRun) {
  if (!fs::is_directory("/sys") || can_create_in("/sys")) GTEST_SKIP() << "/sys is writable";
  const std::string preset = " --preset uniform --steps 2 --tokens-per-step 64 ";
  for (const std::string& args :
       {"simulate" + preset + "--cluster 2x2 --policies static --json /sys/x.json",
        "simulate" + preset + "--cluster 2x2 --policies static --report /sys/x.html",
        "simulate" + preset + "--cluster 2x2 --policies static --dump /sys/cobalt-dump",
        "bench" + preset + "--cluster 2x2 --reps 1 --json /sys/x.json",
        "plan" + preset + "--cluster 2x2 --out /sys/x.json",
        "trace gen" + preset + "--out /sys/x.st"}) {
    const auto r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("cannot create files in directory /sys"), std::string::npos)
        << args << "\n"
        << r.err;
    EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
  }
  // An existing file in such a directory: written in place only where the directory's
  // permissions refuse new files (the writer's own rule); /proc refuses them with ENOENT, so
  // `--out /proc/version` passed the check and failed after generating the trace.
  if (fs::exists("/proc/version") && !can_create_in("/proc")) {
    const auto r = run("trace gen" + preset + "--out /proc/version");
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("--out /proc/version: cannot create files in directory /proc"),
              std::string::npos)
        << r.err;
  }
  const auto empty_dump = run("simulate" + preset + "--cluster 2x2 --dump ''");
  EXPECT_EQ(empty_dump.exit_code, 2) << empty_dump.err;
  EXPECT_NE(empty_dump.err.find("--dump: empty path (give a directory)"), std::string::npos)
      << empty_dump.err;
}

// Headless Chromium (Debian `chromium`), skipped when absent.
std::string find_chromium() {
  for (const char* candidate : {"/usr/bin/chromium", "/usr/bin/chromium-browser"}) {
    if (fs::exists(candidate)) return candidate;
  }
  return "";
}

TEST_F(SimulateCli, HtmlReportRendersInHeadlessChromium) {
  const auto r =
      run("simulate --preset coactivated-late --steps 5 --tokens-per-step 4096 --cluster 2x8 "
          "--report " +
          path("report.html"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string html = read_file(dir_ / "report.html");
  for (const char* chart : {"pareto", "steps-cross-node", "steps-imbalance", "steps-time",
                            "breakdown", "ochiai", "layout"}) {
    EXPECT_NE(html.find(std::string("data-chart=\"") + chart + "\""), std::string::npos) << chart;
  }
  EXPECT_NE(html.find("modelled"), std::string::npos);
  EXPECT_NE(html.find("Whole-task bound: no layout and assignment"), std::string::npos);
  for (const char* external : {"http:", "https:", "src=", "href=", "@import"}) {
    EXPECT_EQ(html.find(external), std::string::npos) << "self-contained: found " << external;
  }
  const std::string chromium = find_chromium();
  if (chromium.empty()) GTEST_SKIP() << "chromium not installed (scripts/install-deps.sh)";
  const std::string flags =
      " --headless --no-sandbox --disable-gpu --disable-quic --no-first-run "
      "--disable-background-networking --disable-component-update --disable-sync "
      "--user-data-dir='" +
      path("profile") + "' ";
  const auto dom = run_shell(
      "timeout 120 " + chromium + flags + "--dump-dom 'file://" + path("report.html") + "'", dir_);
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  EXPECT_NE(dom.out.find("data-charts-rendered=\"7/7\""), std::string::npos)
      << "charts with an empty layout box: " << dom.out.substr(0, 300);
  const auto shot =
      run_shell("timeout 120 " + chromium + flags + "--screenshot='" + path("report.png") +
                    "' --window-size=1400,3000 'file://" + path("report.html") + "'",
                dir_);
  ASSERT_EQ(shot.exit_code, 0) << shot.err;
  ASSERT_TRUE(fs::exists(dir_ / "report.png"));
  EXPECT_GT(fs::file_size(dir_ / "report.png"), 20000u);
}

}  // namespace
}  // namespace cobalt
