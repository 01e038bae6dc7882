// `cobalt bench`, run as the built binary: the table and the JSON of one timed batch, and exit
// codes with one-line messages for bad options (2 usage error, 1 runtime error).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cobalt/io/trace.hpp"
#include "testing/cli.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt {
namespace {

class BenchCli : public testing::CliTest {};

TEST_F(BenchCli, PrintsAndWritesEveryOperation) {
  const auto r =
      run("bench --preset coactivated-late --steps 3 --tokens-per-step 2048 --cluster 2x4 "
          "--step 2 --reps 2 --json " +
          path("bench.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("coactivated-late step 2 layer 0: 2048 tokens x top-8"), std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("measured, not modelled"), std::string::npos) << r.out;
  const auto doc = nlohmann::json::parse(testing::read_file(path("bench.json")));
  EXPECT_EQ(doc["num_tokens"].get<int64_t>(), 2048);
  EXPECT_EQ(doc["cluster"].get<std::string>(), "2x4");
  EXPECT_EQ(doc["reps"].get<int>(), 2);
  EXPECT_EQ(doc["model"].get<std::string>(), "glm-4.5-air");
  EXPECT_EQ(doc["rho"].get<double>(), 0.5);
  EXPECT_EQ(doc["steps"].get<int>(), 3);
  EXPECT_EQ(doc["tokens_per_step"].get<int64_t>(), 2048);
  ASSERT_EQ(doc["operations"].size(), 17u);
  for (const auto& op : doc["operations"]) {
    const std::string name = op["name"].get<std::string>();
    EXPECT_NE(r.out.find(name), std::string::npos) << name;
    EXPECT_EQ(op["reps"].get<int>(), 2) << name;
    EXPECT_LE(op["min_ms"].get<double>(), op["median_ms"].get<double>()) << name;
  }
  EXPECT_EQ(doc["operations"][4]["name"].get<std::string>(), "assign");
  EXPECT_GT(doc["operations"][4]["copy_ratio"].get<double>(), 0.0);
  EXPECT_EQ(doc["operations"][4]["items"].get<double>(), 2048);
  EXPECT_EQ(doc["operations"][13]["name"].get<std::string>(), "cobalt_step");
  EXPECT_TRUE(doc["operations"][13]["policy_step"].get<bool>());
  EXPECT_NE(r.out.find("whole policy steps"), std::string::npos) << r.out;
}

TEST_F(BenchCli, BadOptionsExitWithOneLine) {
  const std::string preset = "bench --preset coactivated-late --steps 2 --tokens-per-step 512 ";
  auto expect_error = [&](const std::string& args, int code, const std::string& words) {
    const auto r = run(args);
    EXPECT_EQ(r.exit_code, code) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(words), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << args << "\n" << r.err;
    EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
  };
  expect_error(preset + "--step 2", 2, "--step 2 out of range [0, 2)");
  expect_error(preset + "--layer 5", 2, "--layer 5 out of range");
  expect_error(preset + "--cluster 2x", 2, "2x");
  expect_error(preset + "--reps 0", 2, "--reps");
  expect_error(preset + "--max-seconds 0", 2, "--max-seconds");
  expect_error("bench --preset no-such-preset", 2, "unknown workload preset 'no-such-preset'");
  expect_error("bench", 2, "exactly one of --trace FILE or --preset NAME");
  expect_error(preset + "--model no-such-model", 2, "no-such-model");
  // A replica budget that cannot hold every expert: a runtime error naming the rho it needs.
  expect_error(preset + "--cluster 3x5 --rho 0", 1, "replica budget too small");
  // Outputs are checked before the run.
  expect_error(preset + "--json " + path("missing/dir/out.json"), 2, "--json");
  std::filesystem::create_directories(path("a_directory"));
  expect_error(preset + "--json " + path("a_directory"), 2, "--json");
}

TEST_F(BenchCli, AStepWithoutTokensIsAUsageError) {
  io::TraceData d;
  d.num_experts = 16;
  d.top_k = 2;
  d.num_layers = 1;
  d.num_tokens = 8;
  d.step_offsets = {0, 4, 4, 8};  // step 1 is empty
  for (int t = 0; t < 8; ++t) {
    d.topk_ids.push_back(t % 16);
    d.topk_ids.push_back((t + 5) % 16);
  }
  io::write_trace(path("gap.safetensors"), d);
  const auto ok = run("bench --trace " + path("gap.safetensors") + " --cluster 2x4 --reps 1");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("4 tokens x top-2"), std::string::npos) << ok.out;
  const auto r = run("bench --trace " + path("gap.safetensors") + " --cluster 2x4 --step 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("step 1 of layer 0 holds no tokens; choose a --step in [0, 3)"),
            std::string::npos)
      << r.err;
}

TEST_F(BenchCli, LoadOnlyTraceIsAUsageError) {
  const io::TraceData d = testing::load_only_trace(2, 8, 16, 2);
  io::write_trace(path("counts.safetensors"), d);
  const auto r = run("bench --trace " + path("counts.safetensors") + " --cluster 2x4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("load-only"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cobalt
