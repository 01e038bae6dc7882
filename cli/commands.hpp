// Subcommand registration for the `cobalt` CLI. Each register_* adds a subcommand whose callback
// does the work; errors propagate as exceptions and main() maps them to exit codes:
//   0 ok, 1 runtime error (cobalt::Error, I/O), 2 usage error (CLI11 parse errors, UsageError).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include "cobalt/core/error.hpp"
#include "cobalt/core/expert_layout.hpp"

namespace cobalt::cli {

// A bad combination or value of command-line options that CLI11 cannot check by itself.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Runs fn; a cobalt::Error(kInvalidArgument) it throws (a bad option value) becomes a UsageError.
template <typename Fn>
auto as_usage_error(Fn&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument) throw;
    throw UsageError(e.what());
  }
}

// Option validators with one-line messages naming the valid range (CLI11's NonNegativeNumber and
// PositiveNumber print "in range 0.000000 to 1.79...e308", the latter even for 0).
const CLI::Validator& non_negative();    // a finite number >= 0
const CLI::Validator& positive();        // a finite number > 0
const CLI::Validator& seed_value();      // an integer in [0, 2^64 - 1] (no wrap of -1)
const CLI::Validator& non_empty_path();  // a path that is not "" (an empty --json was ignored)

// Throws UsageError unless `path`'s directory exists, so a long run does not end in an error
// writing its output. `option` names the flag in the message.
void require_output_directory(const std::string& path, const std::string& option);
// require_output_directory, and the target is not a directory, block device or socket (files are
// replaced atomically, FIFOs and character devices written in place: io/atomic_file.hpp) and not
// the file at `input_path` (the trace being read).
void require_output_file(const std::string& path, const std::string& option,
                         const std::string& input_path = "");

// Option groups shared by simulate and bench: --trace / --preset (exclusive), --steps,
// --tokens-per-step; --rho / --replica-slots (exclusive).
void add_workload_options(CLI::App* cmd, std::string& trace_path, std::string& preset,
                          std::optional<int>& steps, std::optional<int64_t>& tokens_per_step);
void add_budget_options(CLI::App* cmd, double& rho, std::optional<int>& replica_slots);
// Slots per rank from --replica-slots when given, else --rho; an impossible value is a usage
// error. (slots_for_rho / slots_for_extra: cobalt/core/expert_layout.hpp.)
int slots_per_rank(int num_experts, int num_ranks, double rho,
                   const std::optional<int>& replica_slots);

void register_trace_commands(CLI::App& app);
void register_simulate_command(CLI::App& app);
void register_plan_command(CLI::App& app);
void register_eplb_command(CLI::App& app);
void register_bench_command(CLI::App& app);

// Progress output on stderr for long runs: "\r<label> [#####.....] 42%". Silent unless stderr is a
// terminal or COBALT_PROGRESS=1.
class Progress {
 public:
  Progress(std::string label, int64_t total);
  void advance(int64_t amount = 1);
  void finish();

 private:
  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  int last_percent_ = -1;
  bool enabled_;
};

}  // namespace cobalt::cli
