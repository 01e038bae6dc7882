// `cobalt bench`, run as the built binary: the table and the JSON of one timed batch, and exit
// codes with one-line messages for bad options (2 usage error, 1 runtime error).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "cobalt/eval/step_timing.hpp"
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
  ASSERT_EQ(doc["operations"].size(), static_cast<size_t>(eval::kNumTimedOperations));
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
  auto d = testing::id_trace(16, 2, 1, 8, [](int64_t t, int k) { return (t + 5 * k) % 16; });
  d.step_offsets = {0, 4, 4, 8};  // step 1 is empty
  io::write_trace(path("gap.safetensors"), d);
  const auto ok = run("bench --trace " + path("gap.safetensors") + " --cluster 2x4 --reps 1");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.out.find("4 tokens x top-2"), std::string::npos) << ok.out;
  const auto r = run("bench --trace " + path("gap.safetensors") + " --cluster 2x4 --step 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("step 1 of layer 0 holds no tokens; choose a --step in [0, 3) that has "
                       "some (e.g. 0, 2)"),
            std::string::npos)
      << r.err;
}

// The progress bar (on when stderr is a terminal, or with COBALT_PROGRESS=1) counted 15 rows of
// 17: past 100% it built a string of negative length and the run failed with
// "basic_string::_M_create".
TEST_F(BenchCli, ProgressBarRunsToOneHundredPercent) {
  const auto r = testing::run_shell(std::string("COBALT_PROGRESS=1 '") + COBALT_CLI_PATH +
                                        "' bench --preset uniform --steps 2 --tokens-per-step 256 "
                                        "--cluster 2x2 --reps 1",
                                    dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("bench [####################] 100%"), std::string::npos) << r.err;
  // The preset's generation has its own bar (steps x layers), finished before the rows start.
  EXPECT_NE(r.err.find("generating uniform [####################] 100%\n"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("101%"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("error"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("topoep_step"), std::string::npos) << r.out;
}

// Algorithm 1 takes top-k <= 16: refused before the first row, not after timing half of them.
TEST_F(BenchCli, TopKAboveSixteenIsRefusedUpFront) {
  const auto d = testing::id_trace(64, 20, 1, 8, [](int64_t t, int k) { return (t + 3 * k) % 64; });
  io::write_trace(path("k20.safetensors"), d);
  const auto r = run("bench --trace " + path("k20.safetensors") + " --cluster 2x2 --reps 1");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("top-k 20 out of range [1, 16]"), std::string::npos) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

// The cobalt rows hold statistics for layers 0..--layer (policy::policy_memory: ~19 E^2 bytes a
// layer, one policy at a time): a deep layer of a wide trace took gigabytes unchecked.
TEST_F(BenchCli, DeepLayersOfAWideTraceAreCheckedAgainstTheMemoryBudget) {
  const auto d = testing::id_trace(1024, 1, 4, 4, [](int64_t i, int) { return i * 37 % 1024; });
  io::write_trace(path("wide.safetensors"), d);
  auto bench = [&](int layer) {
    return testing::run_shell("COBALT_MEMORY_LIMIT=50M '" + std::string(COBALT_CLI_PATH) +
                                  "' bench --trace " + path("wide.safetensors") +
                                  " --cluster 2x2 --reps 1 --layer " + std::to_string(layer),
                              dir_);
  };
  const auto deep = bench(3);
  EXPECT_EQ(deep.exit_code, 1) << deep.err;
  EXPECT_NE(deep.err.find("4 layers x 1024 x 1024 experts needs 86 MiB, above the memory budget "
                          "of 50 MiB"),
            std::string::npos)
      << deep.err;
  EXPECT_NE(deep.err.find("choose a lower --layer"), std::string::npos) << deep.err;
  EXPECT_TRUE(deep.out.empty()) << deep.out;
  EXPECT_EQ(bench(0).exit_code, 0);
  // topoep's rows route through [G, E] tables: 69 MiB for 1024 experts on 4096 ranks.
  const auto wide_cluster = testing::run_shell(
      "COBALT_MEMORY_LIMIT=50M '" + std::string(COBALT_CLI_PATH) + "' bench --trace " +
          path("wide.safetensors") + " --cluster 64x64 --replica-slots 1 --reps 1",
      dir_);
  EXPECT_EQ(wide_cluster.exit_code, 1) << wide_cluster.err;
  EXPECT_NE(wide_cluster.err.find("bench: topoep's [G, E] tables for 1024 experts on 4096 ranks "
                                  "needs 69 MiB, above the memory budget of 50 MiB"),
            std::string::npos)
      << wide_cluster.err;
  // A step re-chunked to 2^22 tokens x top-1: ~200 MiB of the timed operations' work (a top-8
  // step of 2^24 tokens took 6.4 GB unchecked).
  const auto big_step = testing::run_shell(
      "COBALT_MEMORY_LIMIT=50M '" + std::string(COBALT_CLI_PATH) + "' bench --trace " +
          path("wide.safetensors") + " --cluster 2x2 --reps 1 --steps 2 --tokens-per-step " +
          std::to_string(int64_t{1} << 22),
      dir_);
  EXPECT_EQ(big_step.exit_code, 1) << big_step.err;
  EXPECT_NE(big_step.err.find("the timed operations on step 0 (4194304 tokens x top-1) needs 200 "
                              "MiB, above the memory budget of 50 MiB"),
            std::string::npos)
      << big_step.err;
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
