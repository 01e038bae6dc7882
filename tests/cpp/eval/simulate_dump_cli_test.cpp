// `cobalt simulate --dump` run as the built binary (COBALT_CLI_PATH): the files' contract shapes,
// an independent recomputation of every metric from them (recompute_metrics.py, numpy), the
// routing file as a replayable trace, and the all-or-nothing replacement of an earlier dump.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cobalt/io/safetensors.hpp"
#include "simulate_cli_fixture.hpp"
#include "testing/cli.hpp"

namespace cobalt {
namespace {

namespace fs = std::filesystem;

using testing::read_file;
using testing::run_shell;
using testing::shared_traces;
using testing::SimulateCli;

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

// routing.safetensors is a cobalt-trace: trace info reads it, and replaying it on the same
// cluster gives the run's metrics again (its sources are the G ranks, its steps the run's).
TEST_F(SimulateCli, DumpedRoutingIsATraceThatReplaysTheRun) {
  const std::string policies =
      " --cluster 2x4 --policies static,cobalt,cobalt+ "
      "--planner-time-scale 0 --warmup-steps 1 --json ";
  auto r = run("simulate --preset skewed --steps 4 --tokens-per-step 700 --layers 2" + policies +
               path("first.json") + " --dump " + path("d"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string routing = path("d") + "/routing.safetensors";
  r = run("trace info --json '" + routing + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto info = nlohmann::json::parse(r.out);
  EXPECT_EQ(info["num_steps"], 4);
  EXPECT_EQ(info["num_tokens"], 2800);
  EXPECT_EQ(info["num_layers"], 2);
  EXPECT_EQ(info["num_sources"], 8);
  r = run("simulate --trace '" + routing + "'" + policies + path("again.json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto first = json("first.json"), again = json("again.json");
  ASSERT_EQ(first["policies"].size(), again["policies"].size());
  for (size_t i = 0; i < first["policies"].size(); ++i) {
    for (const char* field : {"cross_node_tokens", "imbalance_mean", "migration_bytes"}) {
      EXPECT_EQ(first["policies"][i][field], again["policies"][i][field])
          << first["policies"][i]["name"] << " " << field;
    }
  }
  // A second dump into the same directory still recognises it as a dump's file.
  EXPECT_EQ(run("simulate --preset skewed --steps 2 --tokens-per-step 100 --cluster 2x4 "
                "--policies static --dump " +
                path("d"))
                .exit_code,
            0);
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

// Every (name, content) of the regular files in `dir`, and the names of hidden entries there.
std::map<std::string, std::string> files_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file()) out[entry.path().filename().string()] = read_file(entry.path());
  }
  return out;
}

std::vector<std::string> leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.find("cobalt") != std::string::npos && name[0] == '.') out.push_back(name);
  }
  return out;
}

// --dump DIR replaced DIR/routing.safetensors even when it was the input trace, and any user
// file named like a dump file; --json / --report could name the same file as each other or as a
// dump file. All are refused before the run now, and nothing is touched.
TEST_F(SimulateCli, DumpNeverReplacesTheInputTraceOrAnotherFile) {
  const std::string gen = "trace gen --preset uniform --steps 2 --tokens-per-step 64 --out ";
  fs::create_directories(dir_ / "d");
  ASSERT_EQ(run(gen + path("d/routing.safetensors")).exit_code, 0);
  const std::string trace_bytes = read_file(dir_ / "d" / "routing.safetensors");
  const std::string sim = "simulate --cluster 2x2 --policies static ";
  auto expect_refused = [&](const std::string& args, const std::string& words) {
    const auto r = run(sim + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(words), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;  // refused before the run
  };
  // The trace itself, through a hard link and through a symlink.
  expect_refused("--trace " + path("d/routing.safetensors") + " --dump " + path("d"),
                 "is the input trace");
  fs::create_directories(dir_ / "h");
  fs::create_hard_link(dir_ / "d" / "routing.safetensors", dir_ / "h" / "routing.safetensors");
  expect_refused("--trace " + path("d/routing.safetensors") + " --dump " + path("h"),
                 "is the input trace");
  fs::create_directories(dir_ / "s");
  fs::create_symlink(dir_ / "d" / "routing.safetensors", dir_ / "s" / "routing.safetensors");
  expect_refused("--trace " + path("d/routing.safetensors") + " --dump " + path("s"),
                 "is the input trace");
  EXPECT_EQ(read_file(dir_ / "d" / "routing.safetensors"), trace_bytes);
  // A copy of a dump's routing file (a trace) under another name in the dump directory, replayed
  // into it: the dump's tidying up removed it as a stale dump file.
  ASSERT_EQ(
      run(sim + "--preset uniform --steps 2 --tokens-per-step 64 --dump " + path("r")).exit_code,
      0);
  fs::copy_file(dir_ / "r" / "routing.safetensors", dir_ / "r" / "run1.safetensors");
  const auto replay = run(sim + "--trace " + path("r/run1.safetensors") + " --dump " + path("r"));
  EXPECT_EQ(replay.exit_code, 0) << replay.err;
  EXPECT_TRUE(fs::exists(dir_ / "r" / "run1.safetensors"));
  // A user's file named like a policy's dump file.
  fs::create_directories(dir_ / "u");
  std::ofstream(dir_ / "u" / "static.safetensors") << "mine";
  const std::string preset = "--preset uniform --steps 2 --tokens-per-step 64 ";
  expect_refused(preset + "--dump " + path("u"), "is not an earlier cobalt dump");
  EXPECT_EQ(read_file(dir_ / "u" / "static.safetensors"), "mine");
  // A regular file as the dump directory: a usage error like --json DIR.
  expect_refused(preset + "--dump " + path("u/static.safetensors"), "is not a directory");
  // Outputs that are the same file, or a dump file.
  expect_refused(preset + "--json " + path("o.json") + " --report " + path("o.json"),
                 "are the same file");
  expect_refused(preset + "--report " + path("x") + " --dump " + path("x"),
                 "is the --dump directory");
  expect_refused(preset + "--json " + path("e/static.safetensors") + " --dump " + path("e"),
                 "does not exist");
  fs::create_directories(dir_ / "e");
  expect_refused(preset + "--json " + path("e/static.safetensors") + " --dump " + path("e"),
                 "writes a file of that name");
  EXPECT_FALSE(fs::exists(dir_ / "o.json"));
  EXPECT_FALSE(fs::exists(dir_ / "x"));
  // /dev/stdout twice is fine (written in place, in order).
  const auto both = run(sim + preset + "--json /dev/stdout --report /dev/stdout");
  EXPECT_EQ(both.exit_code, 0) << both.err;
  EXPECT_NE(both.out.find("\"best_policy\""), std::string::npos);
  EXPECT_NE(both.out.find("<svg"), std::string::npos);
}

// A run that fails part-way (here: a file size limit hit by the first policy's file) leaves an
// earlier dump exactly as it was, creates no new directory, and leaves no temporary directory.
TEST_F(SimulateCli, AFailedRunKeepsTheEarlierDumpWhole) {
  // 200 one-token steps on 2x4 with 12 slots per rank: the routing file is ~13 KB, a policy file
  // ~170 KB (its layouts), so a 30-60 KB limit (60 blocks: 512 bytes in dash, 1 KiB in bash)
  // fails the run after the routing file was written.
  const std::string base =
      "simulate --preset uniform --steps 200 --tokens-per-step 1 --cluster 2x4 "
      "--policies static,cobalt ";
  ASSERT_EQ(run(base + "--dump " + path("d")).exit_code, 0);
  const auto before = files_of(dir_ / "d");
  ASSERT_EQ(before.size(), 3u);
  EXPECT_EQ(fs::status(dir_ / "d").permissions() & fs::perms::others_read,
            fs::perms::others_read);  // a new dump directory has the usual permissions
  auto failing = [&](const std::string& dump) {
    return run_shell("ulimit -f 60; trap '' XFSZ; '" + std::string(COBALT_CLI_PATH) + "' " + base +
                         "--seed 7 --dump " + dump,
                     dir_);
  };
  const auto r = failing(path("d"));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("I/O error"), std::string::npos) << r.err;
  EXPECT_EQ(files_of(dir_ / "d"), before);
  EXPECT_TRUE(leftovers(dir_ / "d").empty());
  const auto fresh = failing(path("new"));
  EXPECT_EQ(fresh.exit_code, 1) << fresh.err;
  EXPECT_FALSE(fs::exists(dir_ / "new"));
  EXPECT_TRUE(leftovers(dir_).empty());
  // And a complete run replaces the dump (its routing differs with the seed).
  ASSERT_EQ(run(base + "--seed 7 --dump " + path("d")).exit_code, 0);
  const auto after = files_of(dir_ / "d");
  EXPECT_EQ(after.size(), 3u);
  EXPECT_NE(after.at("routing.safetensors"), before.at("routing.safetensors"));
  EXPECT_TRUE(leftovers(dir_ / "d").empty());
}

// One output failing (the report, here on a full device) does not cost the others: the JSON and
// the finished dump are written, and the error names what was written.
TEST_F(SimulateCli, AFailedOutputKeepsTheOthers) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  const auto r =
      run("simulate --preset uniform --steps 3 --tokens-per-step 64 --cluster 2x2 --policies "
          "static --json " +
          path("o.json") + " --report /dev/full --dump " + path("d"));
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("--report"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("; written: --json, --dump"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;  // one line
  EXPECT_TRUE(fs::exists(dir_ / "o.json"));
  EXPECT_TRUE(fs::exists(dir_ / "d" / "static.safetensors"));
}

// The process-id scope dump.cpp writes into temporary directory names: the first 16 hex digits of
// the kernel's boot id, then the PID namespace's inode; empty when /proc does not say.
std::string process_id_scope() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string boot_id, hex;
  if (!(boot >> boot_id)) return "";
  for (char c : boot_id) {
    if (std::isxdigit(static_cast<unsigned char>(c))) hex += c;
  }
  struct stat ns {};
  if (hex.size() < 16 || ::stat("/proc/self/ns/pid", &ns) != 0) return "";
  return hex.substr(0, 16) + "-" + std::to_string(static_cast<uint64_t>(ns.st_ino));
}

// A killed run leaves its temporary directory behind (as large as the dump); the next dump into
// the same place removes those of processes that no longer exist, and only those.
TEST_F(SimulateCli, ADumpRemovesTheTemporaryDirectoriesOfKilledRuns) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // `child` no longer exists
  const std::string scope = process_id_scope();
  if (scope.empty()) GTEST_SKIP() << "no /proc boot id or PID namespace";
  const std::string stem = ".d.cobalt-dump-tmp." + scope + "-";
  const fs::path stale = dir_ / (stem + std::to_string(child) + "-0-1");
  const fs::path live = dir_ / (stem + std::to_string(::getpid()) + "-0-1");
  // Another machine or PID namespace: the same process id says nothing there.
  const fs::path other_host =
      dir_ / (".d.cobalt-dump-tmp.0123456789abcdef-1-" + std::to_string(child) + "-0-1");
  for (const fs::path& p : {stale, live, other_host}) {
    fs::create_directories(p);
    std::ofstream(p / "static.safetensors") << "partial";
  }
  const auto r =
      run("simulate --preset uniform --steps 2 --tokens-per-step 64 --cluster 2x2 "
          "--policies static --dump " +
          path("d"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other_host));
  EXPECT_TRUE(fs::exists(dir_ / "d" / "routing.safetensors"));
}

}  // namespace
}  // namespace cobalt
