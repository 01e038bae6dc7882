// Subcommand registration for the `cobalt` CLI. Each register_* adds a subcommand whose callback
// does the work; errors propagate as exceptions and main() maps them to exit codes:
//   0 ok, 1 runtime error (cobalt::Error; cobalt::IoError is reported as "I/O error"), 2 usage
//   error (CLI11 parse errors, UsageError).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cobalt/core/error.hpp"
#include "cobalt/core/expert_layout.hpp"
#include "cobalt/plan/node_plan.hpp"

namespace cobalt::cli {

// Writes `text` to stderr and ignores a failure (a closed or full stderr must not turn a message,
// least of all the final error report, into an exception or an abort).
void write_stderr(std::string_view text) noexcept;

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
  } catch (const IoError&) {
    throw;  // a failed file operation is not a bad option value
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kInvalidArgument) throw;
    throw UsageError(e.what());
  }
}

// Option validators with one-line messages naming the valid range (CLI11's NonNegativeNumber and
// PositiveNumber print "in range 0.000000 to 1.79...e308", the latter even for 0). The number
// ones read decimal text only and rewrite an accepted value to its exact hex form, so attach them
// with ->transform(): the option then stores exactly the double that was checked.
const CLI::Validator& non_negative();         // a finite number >= 0
const CLI::Validator& positive();             // a finite number > 0
const CLI::Validator& non_empty_path();       // a path that is not "" (an empty --json was ignored)
const CLI::Validator& non_empty_directory();  // the same for a directory (--dump)
const CLI::Validator& non_empty_name();       // a name that is not "" (--preset "")
const CLI::Validator& non_empty_value();      // any other value that is not "" (--cluster "")

inline constexpr int64_t kMaxInt = std::numeric_limits<int>::max();
inline constexpr uint64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
inline constexpr int kMaxThreads = 1024;             // --threads of every command
inline constexpr double kMaxTimeLimitSeconds = 1e6;  // plan --time-limit (about 11.6 days)
using plan::kMaxEps;  // --eps of every command: [0, kMaxEps], as the library takes
// A finite decimal number in [lo, hi] ("(" when lo_open, ")" when hi_open).
CLI::Validator number_in(double lo, double hi, bool lo_open = false, bool hi_open = false);

// Integer options: a decimal integer in [lo, hi] ("range_text" replaces "[lo, hi]" in messages).
// CLI11 reads integers with strtoll(..., 0): "010" is octal 8, "0x10" hexadecimal, "08" an error.
// This validator accepts only an optional sign and decimal digits and passes the canonical form on
// ("010" -> "10"), so it must be added with ->transform(), not ->check() (which discards edits).
CLI::Validator integer_in(int64_t lo, uint64_t hi, const std::string& range_text = "");
// integer_in(0, 2^64 - 1): a seed (no wrap of -1). Add with ->transform().
const CLI::Validator& seed_value();
// Gives every integer option of `app` and of its subcommands that has no integer_in transform one
// for its type's whole range, so that no integer option reads octal or hexadecimal. Called once
// after every option is registered.
void decimal_integer_options(CLI::App& app);

// Throws UsageError unless `path`'s directory exists, so a long run does not end in an error
// writing its output. `option` names the flag in the message.
void require_output_directory(const std::string& path, const std::string& option);
// require_output_directory, and the target is not a directory, block device or socket (files are
// replaced atomically, FIFOs and character devices written in place: io/atomic_file.hpp), not the
// file at `input_path` (the trace being read), and its directory is writable (a temporary file is
// created there and removed; an existing writable file in a read-only directory is written in
// place).
void require_output_file(const std::string& path, const std::string& option,
                         const std::string& input_path = "");
// --dump DIR of `policies`: DIR is a directory or can be created (its parent exists), a file can be
// created where the dump's temporary directory goes (DIR, or its parent for a new DIR), and no
// file the dump writes is the input trace or a file other than an earlier dump
// (eval::dump_target_problem). Throws UsageError naming the problem.
void require_dump_directory(const std::string& dir, const std::vector<std::string>& policies,
                            const std::string& input_path);
// Throws UsageError when two of `files` ({option, path}; empty paths skipped, FIFOs and character
// devices such as /dev/stdout allowed twice) are the same file, or one is the directory
// `dump_dir` or a file the dump writes there (`dump_names`).
void require_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& files,
                              const std::string& dump_dir = "",
                              const std::vector<std::string>& dump_names = {});

// Option groups shared by simulate and bench: --trace / --preset (exclusive), --steps,
// --tokens-per-step; --rho / --replica-slots (exclusive).
void add_workload_options(CLI::App* cmd, std::string& trace_path, std::string& preset,
                          std::optional<int>& steps, std::optional<int64_t>& tokens_per_step);
void add_budget_options(CLI::App* cmd, double& rho, std::optional<int>& replica_slots);
// Slots per rank from --replica-slots when given, else --rho; an impossible value is a usage
// error. (slots_for_rho / slots_for_extra: cobalt/core/expert_layout.hpp.)
int slots_per_rank(int num_experts, int num_ranks, double rho,
                   const std::optional<int>& replica_slots);
// --cluster's value: NxM, or the name of a cluster preset (DESIGN.md §5 names them so), which
// stands for its shape. A malformed value is a usage error naming both forms.
Topology parse_cluster(const std::string& cluster);
// The cluster preset `cluster` names, or none when it is NxM.
std::optional<std::string> cluster_preset_named(const std::string& cluster);

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
