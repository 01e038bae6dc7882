// The SimulateCli fixture of simulate_cli_test.cpp and simulate_dump_cli_test.cpp: runs the built
// `cobalt` binary (COBALT_CLI_PATH) in a scratch directory, reads its JSON, and recomputes a
// dump's metrics independently (recompute_metrics.py, numpy). In a named namespace: one fixture
// type for the test suite across both files.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "testing/cli.hpp"

namespace cobalt::testing {

inline std::filesystem::path shared_traces() {
  return std::filesystem::path(COBALT_SHARED_DIR) / "data" / "traces";
}
// Beside this header.
inline std::filesystem::path recompute_script() {
  return std::filesystem::path(__FILE__).parent_path() / "recompute_metrics.py";
}

inline bool have_numpy() {
  return std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
}

class SimulateCli : public CliTest {
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

}  // namespace cobalt::testing
