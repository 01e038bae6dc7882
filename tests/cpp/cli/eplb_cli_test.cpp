// `cobalt eplb`, run as the built binary (COBALT_CLI_PATH): the EPLB README example end to end,
// and exit codes for bad input (2 usage error, 1 runtime error) with one-line messages.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "cobalt/plan/eplb.hpp"
#include "testing/cli.hpp"

namespace cobalt {
namespace {

namespace fs = std::filesystem;

using testing::RunResult;

class EplbCli : public testing::CliTest {};

constexpr const char* kReadmeWeights =
    "[[90,132,40,61,104,165,39,4,73,56,183,86],[20,107,104,64,19,197,187,157,172,86,16,27]]";

TEST_F(EplbCli, ReadmeExample) {
  const auto weights = write("w.json", kReadmeWeights);
  const auto r =
      run("eplb --weights '" + weights.string() + "' --replicas 16 --groups 4 --nodes 2 --gpus 8");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto doc = nlohmann::json::parse(r.out);
  EXPECT_EQ(doc["phy2log"], nlohmann::json::parse("[[5,6,5,7,8,4,3,4,10,9,10,2,0,1,11,1],"
                                                  "[7,10,6,8,6,11,8,9,2,4,5,1,5,0,3,1]]"));
  // log2phy / logcnt: as the library computes them, and consistent with phy2log.
  const std::vector<double> w = {90, 132, 40,  61, 104, 165, 39,  4,   73,  56, 183, 86,
                                 20, 107, 104, 64, 19,  197, 187, 157, 172, 86, 16,  27};
  const auto lib = plan::rebalance_experts(w, 2, 12, 16, 4, 2, 8);
  ASSERT_EQ(doc["logcnt"].size(), 2u);
  ASSERT_EQ(doc["log2phy"].size(), 2u);
  for (int l = 0; l < 2; ++l) {
    for (int e = 0; e < 12; ++e) {
      const int cnt = doc["logcnt"][l][e].get<int>();
      EXPECT_EQ(cnt, lib.logcnt_at(l, e));
      ASSERT_EQ(doc["log2phy"][l][e].size(), static_cast<size_t>(lib.max_replicas));
      for (int k = 0; k < lib.max_replicas; ++k) {
        const int p = doc["log2phy"][l][e][k].get<int>();
        if (k < cnt) {
          EXPECT_EQ(doc["phy2log"][l][p].get<int>(), e);
        } else {
          EXPECT_EQ(p, -1);
        }
      }
    }
  }
}

TEST_F(EplbCli, BadInputExitCodes) {
  const auto weights = write("w.json", kReadmeWeights);
  const std::string w = "--weights '" + weights.string() + "'";
  // Option values that cannot work together: usage error.
  auto r = run("eplb " + w + " --replicas 18 --groups 4 --nodes 2 --gpus 8");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--replicas (18) must be a multiple of --gpus (8)"), std::string::npos)
      << r.err;
  r = run("eplb " + w + " --replicas 16 --groups 4 --nodes 3 --gpus 8");
  EXPECT_EQ(r.exit_code, 2);
  r = run("eplb " + w + " --replicas 16 --groups 4 --nodes 2");  // --gpus missing
  EXPECT_EQ(r.exit_code, 2);
  // The option that is out of range, and its range (it named --gpus 1 as out of [1, 8192]).
  r = run("eplb " + w + " --replicas 2147483647 --groups 1 --nodes 1 --gpus 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--replicas 2147483647 on --gpus 1: 2147483647 replicas per GPU, out of "
                       "range [1, 65536]"),
            std::string::npos)
      << r.err;
  // Runtime errors: loads that do not fit, unreadable or malformed files.
  r = run("eplb " + w + " --replicas 8 --groups 4 --nodes 2 --gpus 8");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("replicas (8) must be >= the number of experts (12)"), std::string::npos)
      << r.err;
  const auto ragged = write("ragged.json", "[[1,2,3],[1,2]]");
  r = run("eplb --weights '" + ragged.string() + "' --replicas 4 --groups 1 --nodes 1 --gpus 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("row 1 has 2 loads"), std::string::npos) << r.err;
  std::string wide = "[[1";
  for (int e = 1; e < 70000; ++e) wide += ",1";
  r = run("eplb --weights '" + write("wide.json", wide + "]]").string() +
          "' --replicas 70000 --groups 1 --nodes 1 --gpus 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("70000 experts per layer, out of range [1, 65536]"), std::string::npos)
      << r.err;
  const auto broken = write("broken.json", "[[1,2,");
  r = run("eplb --weights '" + broken.string() + "' --replicas 4 --groups 1 --nodes 1 --gpus 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("invalid JSON: parse error"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("json.exception"), std::string::npos) << r.err;  // the library's own tag
  // A number beyond double range: named, not printed digit by digit.
  const auto huge = write("huge.json", "[[1, " + std::string(400, '9') + "]]");
  r = run("eplb --weights '" + huge.string() + "' --replicas 4 --groups 1 --nodes 1 --gpus 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("a number literal is beyond double range"), std::string::npos) << r.err;
  EXPECT_LT(r.err.size(), 400u) << r.err;
  r = run("eplb --weights '" + (dir_ / "missing.json").string() +
          "' --replicas 4 --groups 1 --nodes 1 --gpus 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cannot open weights file"), std::string::npos) << r.err;
  // A directory was read as a file: "basic_filebuf::underflow error reading the file".
  r = run("eplb --weights '" + dir_.string() + "' --replicas 4 --groups 1 --nodes 1 --gpus 2");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("weights file '" + dir_.string() + "' is a directory (give a JSON file)"),
            std::string::npos)
      << r.err;
}

// The output grows with --replicas (phy2log [L, R], log2phy [L, E, most replicas of one expert]):
// checked against the memory budget instead of building it and being killed; the JSON is
// streamed, byte for byte what the JSON library wrote.
TEST_F(EplbCli, ReplicaCountsBeyondTheMemoryBudgetAreRefused) {
  const auto weights = write("w.json", kReadmeWeights);
  const std::string w = "--weights '" + weights.string() + "'";
  const auto ok = run("eplb " + w + " --replicas 16 --groups 4 --nodes 2 --gpus 8");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out, nlohmann::json::parse(ok.out).dump() + "\n");
  const auto r =
      testing::run_shell("COBALT_MEMORY_LIMIT=64M '" + std::string(COBALT_CLI_PATH) + "' eplb " +
                             w + " --replicas 8388608 --groups 4 --nodes 2 --gpus 8192",
                         dir_);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("eplb: 2 layers x 8388608 replicas needs 768 MiB"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("lower --replicas"), std::string::npos) << r.err;
  EXPECT_TRUE(r.out.empty());
  // One expert with all the load: log2phy holds E x (R - E + 1) ids, checked once known.
  std::string loads = "[[1";
  for (int e = 1; e < 64; ++e) loads += ",0";
  const auto hot = write("hot.json", loads + "]]");
  const auto h = testing::run_shell("COBALT_MEMORY_LIMIT=128M '" + std::string(COBALT_CLI_PATH) +
                                        "' eplb --weights '" + hot.string() +
                                        "' --replicas 1048576 --groups 1 --nodes 1 --gpus 8192",
                                    dir_);
  EXPECT_EQ(h.exit_code, 1) << h.err;
  EXPECT_NE(h.err.find("eplb: log2phy of 1 layers x 64 experts x 1048513 replicas of the most "
                       "replicated expert needs 256 MiB"),
            std::string::npos)
      << h.err;
}

}  // namespace
}  // namespace cobalt
