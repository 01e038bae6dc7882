// The `cobalt trace` subcommands, run as the built binary (COBALT_CLI_PATH): gen + info --json
// against the library's own statistics, exit codes (0 ok, 1 runtime error, 2 usage error) with
// one-line messages, and `trace info` on the shared real traces (skipped when absent).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "cobalt/core/memory.hpp"
#include "cobalt/eval/trace_stats.hpp"
#include "cobalt/io/trace.hpp"
#include "cobalt/workload/presets.hpp"
#include "testing/cli.hpp"
#include "testing/random_inputs.hpp"

namespace cobalt {
namespace {

namespace fs = std::filesystem;

using testing::read_file;
using testing::RunResult;
using CliTest = testing::CliTest;

// One line: text followed by exactly one newline.
bool is_one_line(const std::string& text) {
  return !text.empty() && text.back() == '\n' && text.find('\n') == text.size() - 1;
}

void expect_optional_eq(const nlohmann::json& j, const std::optional<double>& v, const char* what) {
  if (v) {
    ASSERT_TRUE(j.is_number()) << what;
    EXPECT_NEAR(j.get<double>(), *v, 1e-9 * std::max(1.0, std::abs(*v))) << what;
  } else {
    EXPECT_TRUE(j.is_null()) << what;
  }
}

// info --json agrees with compute_trace_stats on the same file.
void expect_json_matches(const nlohmann::json& j, const std::string& file) {
  const io::TraceReader reader(file);
  const auto s = eval::compute_trace_stats(reader);
  EXPECT_EQ(j.at("num_experts").get<int>(), reader.num_experts());
  EXPECT_EQ(j.at("top_k").get<int>(), reader.top_k());
  EXPECT_EQ(j.at("num_layers").get<int>(), reader.num_layers());
  EXPECT_EQ(j.at("num_tokens").get<int64_t>(), reader.num_tokens());
  EXPECT_EQ(j.at("num_steps").get<int>(), reader.num_steps());
  EXPECT_EQ(j.at("num_sources").get<int>(), reader.has_source_rank() ? reader.num_sources() : 0);
  EXPECT_NEAR(j.at("load_max_mean").get<double>(), s.load_max_mean, 1e-9);
  EXPECT_NEAR(j.at("load_max_mean_step").get<double>(), s.load_max_mean_step, 1e-9);
  expect_optional_eq(j.at("ochiai_count_weighted"), s.ochiai_count_weighted, "count-weighted");
  expect_optional_eq(j.at("ochiai_top_partner"), s.ochiai_top_partner, "top-partner");
  expect_optional_eq(j.at("hot_set_churn"), s.hot_set_churn, "churn");
  expect_optional_eq(j.at("static_ep_imbalance"), s.static_ep_imbalance, "static EP");
  expect_optional_eq(j.at("source_locality"), s.source_locality, "source locality");
  EXPECT_EQ(j.at("layers").size(), static_cast<size_t>(reader.num_layers()));
}

TEST_F(CliTest, GenThenInfoJson) {
  const std::string trace = path("realistic.safetensors");
  const auto gen =
      run("trace gen --preset realistic --steps 3 --tokens-per-step 2048 --layers 2 "
          "--seed 7 --out '" +
          trace + "'");
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_NE(gen.out.find("wrote"), std::string::npos) << gen.out;
  const auto info = run("trace info --json '" + trace + "'");
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const auto j = nlohmann::json::parse(info.out);
  EXPECT_EQ(j.at("num_experts").get<int>(), 64);
  EXPECT_EQ(j.at("top_k").get<int>(), 8);
  EXPECT_EQ(j.at("num_layers").get<int>(), 2);
  EXPECT_EQ(j.at("num_tokens").get<int64_t>(), 3 * 2048);
  EXPECT_EQ(j.at("num_steps").get<int>(), 3);
  EXPECT_EQ(j.at("num_sources").get<int>(), workload::workload_preset("realistic").num_sources);
  EXPECT_EQ(j.at("metadata").at("workload").get<std::string>(), "realistic");
  EXPECT_EQ(j.at("metadata").at("seed").get<std::string>(), "7");
  expect_json_matches(j, trace);

  // The same arguments give the same file; text output names the statistics.
  const std::string again = path("again.safetensors");
  ASSERT_EQ(run("trace gen --preset realistic --steps 3 --tokens-per-step 2048 --layers 2 --seed 7 "
                "--threads 2 --out '" +
                again + "'")
                .exit_code,
            0);
  EXPECT_EQ(read_file(trace), read_file(again));
  const auto text = run("trace info '" + trace + "'");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  for (const char* key : {"load max/mean", "Ochiai count-weighted", "Ochiai top-partner",
                          "hot-set churn", "source ranks"}) {
    EXPECT_NE(text.out.find(key), std::string::npos) << key << "\n" << text.out;
  }
  // An explicit --hot-count must fit the trace's 64 experts (above E the churn is trivially 0).
  const auto too_hot = run("trace info --hot-count 65 '" + trace + "'");
  EXPECT_EQ(too_hot.exit_code, 2) << too_hot.err;
  EXPECT_NE(too_hot.err.find("--hot-count 65 out of range [1, 64]"), std::string::npos)
      << too_hot.err;
  EXPECT_EQ(run("trace info --hot-count 64 '" + trace + "'").exit_code, 0);
}

TEST_F(CliTest, ListPresets) {
  const auto r = run("trace gen --list-presets");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& p : workload::list_workload_presets()) {
    EXPECT_NE(r.out.find(p.name), std::string::npos) << p.name;
  }
}

TEST_F(CliTest, UsageErrorsExitTwoWithOneLine) {
  const std::string out = "'" + path("x.safetensors") + "'";
  const std::vector<std::string> cases = {"trace gen --preset no-such-preset --out " + out,
                                          "trace gen --out " + out,
                                          "trace gen --preset uniform",
                                          "trace gen --preset uniform --steps 0 --out " + out,
                                          "trace gen --list-presets --preset uniform",
                                          "trace info --hot-count 0 " + out,
                                          "trace bogus",
                                          "frobnicate",
                                          "plan --preset uniform --cluster 0x4",
                                          "trace gen --preset uniform --seed -1 --out " + out,
                                          "plan --trace " + out + " --experts 8",
                                          "simulate --rho -1 --preset uniform",
                                          "simulate --preset uniform --json ''",
                                          "simulate --preset uniform --report ''",
                                          "plan --preset uniform --out ''",
                                          "trace gen --preset uniform --out ''"};
  for (const std::string& args : cases) {
    const auto r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_TRUE(is_one_line(r.err)) << args << "\n" << r.err;
  }
  EXPECT_NE(run("trace bogus").err.find("unknown subcommand 'bogus' (valid: gen, info)"),
            std::string::npos);
  // An unknown option is named as such, even in a command whose required options are missing
  // (CLI11 checks those first and said "--weights is required").
  for (const auto& [args, words] : std::vector<std::pair<std::string, std::string>>{
           {"eplb --bogus", "unknown option '--bogus' for 'cobalt eplb'"},
           {"eplb --weigths w.json",
            "unknown option '--weigths' for 'cobalt eplb' (did you mean "
            "--weights?)"},
           {"trace info --bogus=1", "unknown option '--bogus' for 'cobalt trace info'"},
           {"simulate --preset uniform --polices static", "(did you mean --policies?)"},
           {"--bogus", "unknown option '--bogus' for 'cobalt'"},
           // An option's value is skipped even when it starts with '-' (CLI11 takes it).
           {"trace gen --preset uniform --out -x.st --bogus",
            "unknown option '--bogus' for 'cobalt trace gen'"},
           {"eplb --weights -w.json", "--replicas is required"},
           // A parent's option is unknown after the subcommand, as CLI11 has it.
           {"eplb --version", "unknown option '--version' for 'cobalt eplb'"},
           {"eplb -nan", "unknown option '-nan' for 'cobalt eplb'"}}) {
    const auto r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find(words), std::string::npos) << args << "\n" << r.err;
  }
  // A negative number is a value or a positional argument, not an option: CLI11's message stays.
  const auto negative = run("trace info x -5");
  EXPECT_EQ(negative.exit_code, 2);
  EXPECT_NE(negative.err.find("not expected: -5"), std::string::npos) << negative.err;
  // CLI11's own range text printed 1.79e308 as the upper bound; ours names the range.
  EXPECT_NE(run("simulate --rho -1 --preset uniform").err.find("(a finite number >= 0)"),
            std::string::npos);
  const auto unknown = run("trace gen --preset no-such-preset --out " + out);
  EXPECT_NE(unknown.err.find("unknown workload preset 'no-such-preset'"), std::string::npos)
      << unknown.err;
  EXPECT_NE(unknown.err.find("paper-topoep-640x8"), std::string::npos) << unknown.err;
  EXPECT_FALSE(fs::exists(path("x.safetensors")));
}

TEST_F(CliTest, MalformedTraceExitsOne) {
  const std::string bad = path("bad.safetensors");
  std::ofstream(bad) << "this is not a safetensors file";
  const auto r = run("trace info '" + bad + "'");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(is_one_line(r.err)) << r.err;
  EXPECT_NE(r.err.find(bad), std::string::npos) << r.err;
  const auto missing = run("trace info '" + path("missing.safetensors") + "'");
  EXPECT_EQ(missing.exit_code, 1) << missing.err;
}

// A tiny file declaring 65536 experts: the dense statistics would need 64 GiB; refused up front
// with one line instead of an allocation failure or the OOM killer.
// A MILP too large to build (E = 1024 on 64 nodes): alone it is a failed precondition (exit 1,
// one line); with both backends the heuristic's plan stands and the JSON says why CBC did not run.
TEST_F(CliTest, PlanWithAModelTooLargeForTheMilp) {
  const std::string plan =
      "plan --preset scale-1024 --cluster 64x8 --steps 1 --tokens-per-step 20000 --restarts 1 "
      "--time-limit 1 ";
  const auto alone = run(plan + "--backend milp");
  EXPECT_EQ(alone.exit_code, 1) << alone.err;
  EXPECT_NE(alone.err.find("use the heuristic backend"), std::string::npos) << alone.err;
  const auto both = run(plan + "--backend both --out '" + path("p.json") + "'");
  ASSERT_EQ(both.exit_code, 0) << both.err;
  const auto report = nlohmann::json::parse(std::ifstream(path("p.json")));
  EXPECT_EQ(report["milp"]["status"], "too_large");
  EXPECT_EQ(report["layout"]["num_experts"], 1024);
}

// CBC running out of memory in its process was reported as status "error" with no reason. The
// JSON and stderr now say why, and the heuristic's plan is the layout. (An address-space limit
// makes the solver's allocations fail; AddressSanitizer cannot run under one.)
TEST_F(CliTest, AMilpThatRunsOutOfMemorySaysWhy) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer reserves more address space than the limit allows";
#else
  const auto r = testing::run_shell(
      "ulimit -v 300000 && '" + std::string(COBALT_CLI_PATH) +
          "' plan --preset skewed --experts 512 --cluster 8x8 --backend milp --time-limit 5 "
          "--steps 3 --tokens-per-step 4096 --restarts 2 --out '" +
          path("p.json") + "'",
      dir_);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto report = nlohmann::json::parse(std::ifstream(path("p.json")));
  EXPECT_EQ(report["milp"]["status"], "error");
  const std::string why = report["milp"].value("error", "");
  EXPECT_NE(why.find("out of memory"), std::string::npos) << why;
  EXPECT_NE(r.err.find("CBC gave no answer (" + why + "); the layout is the heuristic's plan"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(report["layout"]["num_experts"], 512);
#endif
}

TEST_F(CliTest, DeclaredSizesBeyondMemoryAreRefusedUpFront) {
  if (physical_memory_bytes() >= 16.0 * 65536.0 * 65536.0) GTEST_SKIP() << "machine has >= 64 GiB";
  io::TraceData d;
  d.num_experts = 65536;
  d.top_k = 1;
  d.num_layers = 1;
  d.num_tokens = 1;
  d.topk_ids = {65535};
  io::write_trace(path("wide.safetensors"), d);
  const auto r = run("trace info '" + path("wide.safetensors") + "'");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(is_one_line(r.err)) << r.err;
  EXPECT_NE(r.err.find("needs 64.0 GiB"), std::string::npos) << r.err;
}

// Messages the fuzzer found unclear: a 20-million-dimension shape printed in full (60 MB on one
// line), "valid range [2, 0]" for an 8-byte file, "not of the form NxM" for a number too large,
// "give exactly one of --trace or --preset" for --trace "".
TEST_F(CliTest, ClearMessagesForOddInputs) {
  // A topk_ids entry whose shape has 100000 dimensions.
  std::string shape = "[1";
  for (int i = 1; i < 100000; ++i) shape += ",1";
  shape += "]";
  const std::string header =
      "{\"__metadata__\":{\"format\":\"cobalt-trace\",\"version\":\"1\",\"num_experts\":\"8\","
      "\"top_k\":\"1\"},\"topk_ids\":{\"dtype\":\"I32\",\"shape\":" +
      shape + ",\"data_offsets\":[0,4]}}";
  std::string file(8, '\0');
  const uint64_t len = header.size();
  std::memcpy(file.data(), &len, 8);
  file += header + std::string(4, '\0');
  std::ofstream(path("wide.safetensors"), std::ios::binary) << file;
  auto r = run("trace info '" + path("wide.safetensors") + "'");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(is_one_line(r.err));
  EXPECT_LT(r.err.size(), 500u) << r.err.substr(0, 500);
  EXPECT_NE(r.err.find("[1, 1, 1, 1, 1, 1, 1, 1, ... (100000 dimensions)]"), std::string::npos)
      << r.err.substr(0, 500);

  std::ofstream(path("eight.safetensors"), std::ios::binary) << std::string(8, '\0');
  r = run("trace info '" + path("eight.safetensors") + "'");
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(r.err.find("[2, 0]"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("file is 8 bytes, too short for a header"), std::string::npos) << r.err;

  r = run("simulate --preset uniform --cluster 4294967298x1");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("nodes 4294967298 out of range [1, 64]"), std::string::npos) << r.err;
  r = run("simulate --preset uniform --cluster 2x99999999999");
  EXPECT_NE(r.err.find("ranks per node 99999999999 out of range [1, 8192]"), std::string::npos)
      << r.err;

  for (const char* args : {"simulate --trace ''", "bench --trace ''", "plan --trace ''"}) {
    r = run(args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("--trace: empty path"), std::string::npos) << args << "\n" << r.err;
  }
  r = run("simulate --preset ''");
  EXPECT_NE(r.err.find("--preset: empty name"), std::string::npos) << r.err;

  // A load-only trace is a usage error in plan, as in bench (it was a failed precondition).
  io::write_trace(path("counts.safetensors"), testing::load_only_trace(2, 4, 8, 2));
  r = run("plan --trace '" + path("counts.safetensors") + "' --cluster 2x2");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("plan: the trace is load-only"), std::string::npos) << r.err;

  // CBC's time limit: (0, 1e6] seconds (1e10 overflowed the watchdog's deadline).
  r =
      run("plan --preset uniform --steps 2 --tokens-per-step 256 --cluster 2x2 --backend milp "
          "--experts 4 --time-limit 1e10");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--time-limit: value 1e10 out of range (0, 1000000]"), std::string::npos)
      << r.err;

  // eps: [0, 1e6] in every command (1e308 overflowed the planner's rank cap, an error that
  // blamed the loads).
  for (const std::string command : {"plan", "simulate", "bench"}) {
    r = run(command + " --preset uniform --steps 2 --tokens-per-step 64 --cluster 2x2 --eps 1e308");
    EXPECT_EQ(r.exit_code, 2) << command << ": " << r.err;
    EXPECT_NE(r.err.find("--eps: value 1e308 out of range [0, 1000000]"), std::string::npos)
        << command << ": " << r.err;
  }

  // A value that is not a number says so (it said "out of range").
  for (const std::string value : {"1,5", "''", "abc"}) {
    r = run("plan --preset uniform --steps 2 --tokens-per-step 64 --cluster 2x2 --rho " + value);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_NE(r.err.find("is not a number (valid: (a finite number >= 0))"), std::string::npos)
        << value << ": " << r.err;
  }
  // An empty trace path is a usage error like every other empty path (it was "cannot open").
  r = run("trace info ''");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("empty path"), std::string::npos) << r.err;
  // An empty value is refused, not read as "the default" (bench refused it already).
  for (const std::string option : {"--cluster", "--cluster-preset", "--model"}) {
    r = run("simulate --preset uniform --steps 2 --tokens-per-step 64 " + option + " ''");
    EXPECT_EQ(r.exit_code, 2) << option << ": " << r.err;
    EXPECT_NE(r.err.find("empty value"), std::string::npos) << option << ": " << r.err;
  }
  // 'all' with other names contradicted the list of valid names it printed.
  r =
      run("simulate --preset uniform --steps 2 --tokens-per-step 64 --cluster 2x2 --policies "
          "all,static");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("'all' stands alone"), std::string::npos) << r.err;
}

// A failed write to standard output exits 1 (README), --help and --version included.
TEST_F(CliTest, HelpToAFullDeviceFails) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  for (const char* args : {"--help", "simulate --help", "--version"}) {
    const auto r = testing::run_shell(
        "('" + std::string(COBALT_CLI_PATH) + "' " + args + " > /dev/full)", dir_);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.err;
    EXPECT_NE(r.err.find("cannot write to standard output"), std::string::npos) << r.err;
  }
}

TEST_F(CliTest, HelpExitsZero) {
  for (const char* args : {"--help", "trace --help", "trace gen --help", "trace info --help"}) {
    const auto r = run(args);
    EXPECT_EQ(r.exit_code, 0) << args << "\n" << r.err;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << args << "\n" << r.out;
  }
}

// The shared real traces: info works and their co-activation lies in the ranges DESIGN.md §3.3
// reports for real pretrained models (count-weighted 0.14-0.33, top-partner 0.31-0.62).
TEST_F(CliTest, InfoOnSharedRealTraces) {
  const fs::path traces = fs::path(COBALT_SHARED_DIR) / "data" / "traces";
  if (!fs::is_directory(traces)) GTEST_SKIP() << "no shared traces at " << traces;
  int seen = 0;
  for (const auto& entry : fs::directory_iterator(traces)) {
    if (entry.path().extension() != ".safetensors") continue;
    ++seen;
    const std::string file = entry.path().string();
    const auto r = run("trace info --json '" + file + "'");
    ASSERT_EQ(r.exit_code, 0) << file << "\n" << r.err;
    const auto j = nlohmann::json::parse(r.out);
    expect_json_matches(j, file);
    EXPECT_GE(j.at("ochiai_count_weighted").get<double>(), 0.14) << file;
    EXPECT_LE(j.at("ochiai_count_weighted").get<double>(), 0.33) << file;
    EXPECT_GE(j.at("ochiai_top_partner").get<double>(), 0.31) << file;
    EXPECT_LE(j.at("ochiai_top_partner").get<double>(), 0.62) << file;
  }
  if (seen == 0) GTEST_SKIP() << "no .safetensors in " << traces;
}

// Whether `text` is valid UTF-8 (the shortest forms not checked) and every "\x" escape in it is
// whole (two hex digits follow).
bool whole_utf8_and_escapes(const std::string& text) {
  for (size_t i = 0; i < text.size();) {
    const auto byte = static_cast<unsigned char>(text[i]);
    const size_t length = byte < 0x80   ? 1
                          : byte < 0xc0 ? 0
                          : byte < 0xe0 ? 2
                          : byte < 0xf0 ? 3
                          : byte < 0xf8 ? 4
                                        : 0;
    if (length == 0 || i + length > text.size()) return false;
    for (size_t k = 1; k < length; ++k) {
      if ((static_cast<unsigned char>(text[i + k]) & 0xc0) != 0x80) return false;
    }
    if (text.compare(i, 2, "\\x") == 0 &&
        (i + 4 > text.size() || !std::isxdigit(static_cast<unsigned char>(text[i + 2])) ||
         !std::isxdigit(static_cast<unsigned char>(text[i + 3])))) {
      return false;
    }
    i += length;
  }
  return true;
}

// Arguments echoed in an error (names, a cluster, a policy list) cannot break the one-line rule:
// a newline or a terminal escape is shown as \xNN, and a 5000-character value is cut between
// characters (an e-acute is two bytes; a newline's escape four).
TEST_F(CliTest, EchoedArgumentsStayOnOneLine) {
  std::string accents, newlines(700, '\n');
  for (int i = 0; i < 2000; ++i) accents += "\xc3\xa9";
  const std::string gen = "trace gen --preset realistic --steps 2 --tokens-per-step 64 ";
  const std::string simulate = "simulate --preset realistic --steps 2 --tokens-per-step 64 ";
  const std::string long_name(5000, 'y');
  struct Case {
    std::string args, words;
  };
  for (const Case& c : {
           Case{simulate + "--cluster '2x4\n'", "cluster '2x4\\x0a' is neither"},
           Case{simulate + "--policies '\x1b[31mred'", "unknown policy '\\x1b[31mred'"},
           Case{simulate + "--model '" + long_name + "'", "unknown model 'yyy"},
           Case{simulate + "--policies " + long_name, "unknown policy 'yyy"},
           Case{simulate + "--cluster " + long_name, "cluster 'yyy"},
           Case{gen + "--out " + path(long_name), "I/O error"},
           Case{"trace gen --preset '" + long_name + "\n' --out " + path("x.safetensors"),
                "unknown workload preset 'yyy"},
           Case{gen + "--out '" + path("a" + accents) + "/x.safetensors'", "characters cut"},
           Case{gen + "--out '" + path("a" + newlines) + "/x.safetensors'", "characters cut"},
       }) {
    const auto r = run(c.args);
    EXPECT_NE(r.exit_code, 0) << c.args.substr(0, 120);
    EXPECT_TRUE(is_one_line(r.err)) << r.err.substr(0, 300);
    EXPECT_LT(r.err.size(), 4 * 1300u) << r.err.substr(0, 300);  // 1200 characters, <= 4 bytes
    EXPECT_EQ(r.err.find('\x1b'), std::string::npos) << r.err.substr(0, 300);
    EXPECT_NE(r.err.find(c.words), std::string::npos) << r.err.substr(0, 300);
    EXPECT_TRUE(whole_utf8_and_escapes(r.err)) << r.err.substr(0, 300);
  }
}

}  // namespace
}  // namespace cobalt
