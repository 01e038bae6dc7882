// `cobalt bench`, run as the built binary: the table and the JSON of one timed batch, and exit
// codes with one-line messages for bad options (2 usage error, 1 runtime error).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "cobalt/io/trace.hpp"
#include "testing/cli.hpp"

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
  ASSERT_EQ(doc["operations"].size(), 10u);
  for (const auto& op : doc["operations"]) {
    const std::string name = op["name"].get<std::string>();
    EXPECT_NE(r.out.find(name), std::string::npos) << name;
    EXPECT_EQ(op["reps"].get<int>(), 2) << name;
    EXPECT_LE(op["min_ms"].get<double>(), op["median_ms"].get<double>()) << name;
  }
  EXPECT_EQ(doc["operations"][5]["name"].get<std::string>(), "assign");
  EXPECT_GT(doc["operations"][5]["copy_ratio"].get<double>(), 0.0);
  EXPECT_EQ(doc["operations"][5]["items"].get<double>(), 2048);
}

TEST_F(BenchCli, BadOptionsExitWithOneLine) {
  const std::string preset = "bench --preset coactivated-late --steps 2 --tokens-per-step 512 ";
  auto r = run(preset + "--step 2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--step 2 out of range [0, 2)"), std::string::npos) << r.err;
  r = run(preset + "--layer 5");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--layer 5 out of range"), std::string::npos) << r.err;
  r = run(preset + "--cluster 2x");
  EXPECT_EQ(r.exit_code, 2);
  r = run(preset + "--reps 0");
  EXPECT_EQ(r.exit_code, 2);
  r = run("bench --preset no-such-preset");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown workload preset 'no-such-preset'"), std::string::npos) << r.err;
  r = run("bench");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("exactly one of --trace FILE or --preset NAME"), std::string::npos) << r.err;
  // A replica budget that cannot hold every expert: a runtime error naming the rho it needs.
  r = run(preset + "--cluster 3x5 --rho 0");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("replica budget too small"), std::string::npos) << r.err;
  // Output checked before the run.
  r = run(preset + "--json " + path("missing/dir/out.json"));
  EXPECT_EQ(r.exit_code, 2);
  for (const auto& stream : {r.out, r.err}) {
    EXPECT_LE(std::count(stream.begin(), stream.end(), '\n'), 1) << stream;
  }
}

TEST_F(BenchCli, LoadOnlyTraceIsAUsageError) {
  io::TraceData d;
  d.num_experts = 16;
  d.top_k = 2;
  d.num_layers = 1;
  d.num_sources = 8;
  d.num_count_steps = 2;
  for (int i = 0; i < 2 * 8 * 16; ++i) d.counts.push_back(i % 5);
  io::write_trace(path("counts.safetensors"), d);
  const auto r = run("bench --trace " + path("counts.safetensors") + " --cluster 2x4");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("load-only"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace cobalt
