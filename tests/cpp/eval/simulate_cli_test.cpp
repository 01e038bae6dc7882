// `cobalt simulate` run as the built binary (COBALT_CLI_PATH): the JSON contract, the --dump
// contract with an independent recomputation of every metric (tests/cpp/eval/recompute_metrics.py,
// numpy), the HTML report rendered in headless Chromium, re-chunking, hold-out and usage errors.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cobalt/io/safetensors.hpp"
#include "cobalt/io/trace.hpp"
#include "testing/cli.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt {
namespace {

namespace fs = std::filesystem;

using testing::read_file;
using testing::run_shell;
using testing::RunResult;

fs::path shared_traces() { return fs::path(COBALT_SHARED_DIR) / "data" / "traces"; }
fs::path recompute_script() { return fs::path(__FILE__).parent_path() / "recompute_metrics.py"; }

bool have_numpy() { return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0; }

class SimulateCli : public testing::CliTest {
 protected:
  nlohmann::json json(const std::string& name) const {
    return nlohmann::json::parse(read_file(dir_ / name));
  }
  // Simulates with --json and --dump, then recomputes every metric independently.
  void expect_recomputed(const std::string& workload_args) {
    if (!have_numpy())
      GTEST_SKIP() << "/usr/bin/python3 with numpy is needed for the recomputation";
    const auto r = run(workload_args + " --json " + path("sim.json") + " --dump " + path("dump"));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const std::string check = "/usr/bin/python3 '" + recompute_script().string() + "' '" +
                              path("dump") + "' '" + path("sim.json") + "'";
    const auto ok = run_shell(check, dir_);
    EXPECT_EQ(ok.exit_code, 0) << ok.err << ok.out;
    EXPECT_NE(ok.out.find("agree exactly"), std::string::npos) << ok.out;
    // The check can fail: a reported value off by one is caught.
    auto report = json("sim.json");
    report["policies"][0]["cross_node_tokens"] =
        report["policies"][0]["cross_node_tokens"].get<int64_t>() + 1;
    std::ofstream(path("sim.json")) << report.dump();
    const auto bad = run_shell(check, dir_);
    EXPECT_EQ(bad.exit_code, 1) << bad.out;
    EXPECT_NE(bad.err.find("cross_node_tokens"), std::string::npos) << bad.err;
  }
};

TEST_F(SimulateCli, JsonFollowsTheSchema) {
  const auto r =
      run("simulate --preset coactivated-late --steps 4 --tokens-per-step 2048 --cluster 2x8 "
          "--policies static,cobalt --json " +
          path("sim.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("modelled"), std::string::npos);
  const auto j = json("sim.json");
  const auto& s = j["scenario"];
  EXPECT_EQ(s["cluster"], "2x8");
  EXPECT_EQ(s["cluster_preset"], "4x8-b200");
  EXPECT_EQ(s["model"]["name"], "glm-4.5-air");  // E=128, K=8
  EXPECT_EQ(s["measured_steps"], nlohmann::json::array({1, 4}));
  EXPECT_TRUE(s["cost_model"]["note"].get<std::string>().find("modelled") != std::string::npos);
  ASSERT_EQ(j["policies"].size(), 2u);
  for (const auto& p : j["policies"]) {
    for (const char* key :
         {"name", "cross_node_tokens", "cross_node_bytes", "cross_node_reduction_vs_static",
          "imbalance_mean", "imbalance_max", "imbalance_floor_mean", "maxvio_mean",
          "sim_step_time_s", "speedup_vs_static", "planner_wall_ms", "migration_bytes",
          "time_breakdown_s", "step_cross_node_tokens", "step_imbalance", "step_sim_time_s"}) {
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

TEST_F(SimulateCli, LayoutPricingIsReported) {
  const auto r =
      run("simulate --preset coactivated-late --steps 4 --tokens-per-step 2048 --cluster 2x8 "
          "--policies static,cobalt+ --layout-pricing --json " +
          path("sim.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("priced layouts"), std::string::npos) << r.out;
  EXPECT_EQ(json("sim.json")["scenario"]["layout_pricing"], true);
}

TEST_F(SimulateCli, DumpRecomputedIndependentlyOnASyntheticPreset) {
  expect_recomputed(
      "simulate --preset realistic --steps 5 --tokens-per-step 3000 --layers 2 --cluster 4x4");
}

TEST_F(SimulateCli, DumpRecomputedIndependentlyOnARealTrace) {
  const auto trace = shared_traces() / "qwen15-moe-a2.7b_gsm8k_5layers.safetensors";
  if (!fs::exists(trace)) GTEST_SKIP() << "no shared trace " << trace;
  expect_recomputed("simulate --trace '" + trace.string() + "' --steps 6 --cluster 2x8");
}

TEST_F(SimulateCli, DumpFilesHaveTheContractShapes) {
  const auto r =
      run("simulate --preset uniform --steps 3 --tokens-per-step 500 --layers 2 --cluster 2x4 "
          "--policies static,cobalt --dump " +
          path("d"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name : {"static", "cobalt"}) {
    const fs::path file = dir_ / "d" / (std::string(name) + ".safetensors");
    io::MappedFile mapped(file.string(), "test");
    const auto header = io::parse_safetensors_header(mapped.bytes(), "test");
    const auto* exec = header.find("exec_rank");
    const auto* layout = header.find("layout");
    ASSERT_TRUE(exec && layout) << name;
    EXPECT_EQ(exec->dtype, io::Dtype::kI32);
    EXPECT_EQ(exec->shape, (std::vector<int64_t>{2, 1500, 8}));  // uniform: K = 8
    EXPECT_EQ(layout->dtype, io::Dtype::kI32);
    // S = 3, L = 2, G = 8, slots = floor(1.5 x 64 / 8) = 12.
    EXPECT_EQ(layout->shape, (std::vector<int64_t>{3, 2, 8, 12}));
    EXPECT_EQ(header.metadata.at("policy"), name);
  }
}

// A second dump into the same directory replaces the first one's files, including those of
// policies the second run does not have; other files stay.
TEST_F(SimulateCli, DumpDirectoryHoldsOnlyTheLatestRun) {
  const std::string base =
      "simulate --preset uniform --steps 2 --tokens-per-step 200 --cluster 2x4 ";
  ASSERT_EQ(run(base + "--policies static,cobalt --dump " + path("d")).exit_code, 0);
  std::ofstream(dir_ / "d" / "notes.safetensors") << "not ours";
  ASSERT_EQ(run(base + "--policies static --dump " + path("d")).exit_code, 0);
  EXPECT_TRUE(fs::exists(dir_ / "d" / "static.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "d" / "routing.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "d" / "cobalt.safetensors"));
  EXPECT_TRUE(fs::exists(dir_ / "d" / "notes.safetensors"));
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
  io::TraceData d;
  d.num_experts = 4;
  d.top_k = 2;
  d.num_layers = 1;
  d.num_tokens = 16;
  for (int t = 0; t < 16; ++t) {
    d.topk_ids.push_back(t % 4);
    d.topk_ids.push_back((t + 1) % 4);
  }
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
