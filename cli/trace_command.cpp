// `cobalt trace gen` (synthetic traces from a workload preset) and `cobalt trace info` (statistics
// of a trace file), DESIGN.md §3.2.
#include <fmt/core.h>

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "cobalt/core/error.hpp"
#include "cobalt/core/ids.hpp"
#include "cobalt/eval/trace_stats.hpp"
#include "cobalt/io/safetensors.hpp"
#include "cobalt/io/trace.hpp"
#include "cobalt/workload/synthetic.hpp"
#include "commands.hpp"
#include "workload_input.hpp"

namespace cobalt::cli {

namespace {

struct GenArgs {
  std::string preset;
  bool list_presets = false;
  std::optional<int> num_steps;
  std::optional<int64_t> tokens_per_step;
  std::optional<int> num_layers;
  std::optional<int> num_sources;
  std::optional<uint64_t> seed;
  int num_threads = 1;
  std::string out;
};

struct InfoArgs {
  std::string file;
  bool json = false;
  int num_ranks = 0;
  int hot_count = 8;
  bool hot_count_given =
      false;  // an explicit --hot-count above E is an error, the default is capped
  int num_threads = 1;
};

void print_presets() {
  for (const auto& p : workload::list_workload_presets()) {
    fmt::print("{:<22} {}\n", p.name, p.description);
  }
}

void run_gen(const GenArgs& args) {
  if (args.list_presets) {
    if (!args.preset.empty() || !args.out.empty()) {
      throw UsageError("trace gen: --list-presets takes no --preset or --out");
    }
    print_presets();
    return;
  }
  if (args.preset.empty())
    throw UsageError("trace gen: --preset NAME is required (see --list-presets)");
  if (args.out.empty()) throw UsageError("trace gen: --out FILE is required");
  require_output_file(args.out, "--out");  // before generating, not after
  if (args.num_threads < 0) throw UsageError("trace gen: --threads must be >= 0 (0 = all cores)");
  workload::PresetOverrides overrides;
  overrides.num_steps = args.num_steps;
  overrides.tokens_per_step = args.tokens_per_step;
  overrides.num_layers = args.num_layers;
  overrides.num_sources = args.num_sources;
  overrides.seed = args.seed;
  workload::WorkloadSpec spec = preset_spec(args.preset, overrides, "trace gen");
  require_generation_memory(spec, "trace gen");
  Progress progress("generating " + spec.name,
                    static_cast<int64_t>(spec.num_layers) * spec.num_steps);
  workload::GenerateOptions options;
  options.num_threads = args.num_threads;
  options.progress = [&progress](int64_t, int64_t) { progress.advance(); };
  const io::TraceData data = workload::generate_trace(spec, options);
  progress.finish();
  io::write_trace(args.out, data);
  fmt::print("wrote {}: preset {}, E={} K={} L={} T={} S={} R={} seed={}\n", args.out, spec.name,
             spec.num_experts, spec.top_k, spec.num_layers, spec.num_tokens(), spec.num_steps,
             spec.num_sources, spec.seed);
}

nlohmann::json optional_json(const std::optional<double>& value) {
  return value ? nlohmann::json(*value) : nlohmann::json(nullptr);
}

std::string optional_text(const std::optional<double>& value, const char* absent) {
  return value ? fmt::format("{:.4f}", *value) : std::string(absent);
}

nlohmann::ordered_json stats_json(const io::TraceReader& trace, const eval::TraceStats& s) {
  nlohmann::ordered_json j;
  j["file"] = trace.path();
  j["num_experts"] = s.num_experts;
  j["top_k"] = s.top_k;
  j["num_layers"] = s.num_layers;
  j["num_tokens"] = s.load_only ? nlohmann::ordered_json(nullptr)  // counts, not tokens
                                : nlohmann::ordered_json(s.num_tokens);
  j["num_steps"] = s.num_steps;
  j["num_sources"] = s.num_sources;
  j["load_only"] = s.load_only;
  j["load_max_mean"] = s.load_max_mean;
  j["load_max_mean_step"] = s.load_max_mean_step;
  j["ochiai_count_weighted"] = optional_json(s.ochiai_count_weighted);
  j["ochiai_top_partner"] = optional_json(s.ochiai_top_partner);
  j["hot_count"] = s.hot_count;
  j["hot_set_churn"] = optional_json(s.hot_set_churn);
  j["static_ep_ranks"] = s.static_ep_ranks;
  j["static_ep_imbalance"] = optional_json(s.static_ep_imbalance);
  j["source_locality"] = optional_json(s.source_locality);
  j["metadata"] = trace.metadata();
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const auto& l : s.layers) {
    nlohmann::ordered_json lj;
    lj["load_max_mean"] = l.load_max_mean;
    lj["load_max_mean_step"] = l.load_max_mean_step;
    lj["ochiai_count_weighted"] = optional_json(l.ochiai_count_weighted);
    lj["ochiai_top_partner"] = optional_json(l.ochiai_top_partner);
    lj["hot_set_churn"] = optional_json(l.hot_set_churn);
    lj["static_ep_imbalance"] = optional_json(l.static_ep_imbalance);
    lj["source_locality"] = optional_json(l.source_locality);
    layers.push_back(std::move(lj));
  }
  j["layers"] = std::move(layers);
  return j;
}

void print_stats_text(const io::TraceReader& trace, const eval::TraceStats& s) {
  fmt::print("trace {}\n", trace.path());
  for (const char* key : {"model", "dataset", "workload"}) {
    const auto it = trace.metadata().find(key);
    // Trace metadata is untrusted text: control characters escaped, long values cut.
    if (it != trace.metadata().end()) {
      fmt::print("  {:<26} {}\n", key, io::printable(it->second, 200));
    }
  }
  fmt::print("  {:<26} E={} K={} L={} T={} S={}{}\n", "shape", s.num_experts, s.top_k, s.num_layers,
             s.load_only ? std::string("n/a") : std::to_string(s.num_tokens), s.num_steps,
             s.load_only ? " (load-only counts)" : "");
  fmt::print("  {:<26} {}\n", "source ranks",
             s.num_sources > 0 ? std::to_string(s.num_sources) : "absent (contiguous default)");
  fmt::print("  {:<26} {:.4f} (whole trace), {:.4f} (per step)\n", "load max/mean", s.load_max_mean,
             s.load_max_mean_step);
  fmt::print(
      "  {:<26} {}\n", "Ochiai count-weighted",
      optional_text(s.ochiai_count_weighted,
                    s.load_only ? "n/a (load-only trace)" : "n/a (no token chooses two experts)"));
  fmt::print("  {:<26} {}\n", "Ochiai top-partner",
             optional_text(s.ochiai_top_partner, "n/a (load-only trace)"));
  fmt::print("  {:<26} {}\n", fmt::format("hot-set churn (top-{})", s.hot_count),
             optional_text(s.hot_set_churn, "n/a (fewer than 2 steps with tokens)"));
  // n/a for want of ranks (nothing to pass them) or of tokens (every step empty, all counts 0).
  fmt::print("  {:<26} {}\n", fmt::format("static-EP imbalance (G={})", s.static_ep_ranks),
             optional_text(s.static_ep_imbalance, s.static_ep_ranks > 0
                                                      ? "n/a (no step with tokens)"
                                                      : "n/a (no ranks: pass --ranks G)"));
  fmt::print("  {:<26} {}\n", "source locality (TV)",
             optional_text(s.source_locality,
                           s.num_sources > 0 ? "n/a (no tokens)" : "n/a (no source ranks)"));
  fmt::print("  (means over layers; see `--json` for per-layer values)\n");
}

void run_info(const InfoArgs& args) {
  if (args.hot_count < 1) throw UsageError("trace info: --hot-count must be >= 1");
  if (args.num_ranks < 0 || args.num_ranks > kMaxRanks) {
    throw UsageError(
        fmt::format("trace info: --ranks {} out of range [0, {}] (0 = the trace's sources)",
                    args.num_ranks, kMaxRanks));
  }
  if (args.num_threads < 0) throw UsageError("trace info: --threads must be >= 0 (0 = all cores)");
  const io::TraceReader trace(args.file);
  if (args.hot_count_given && args.hot_count > trace.num_experts()) {
    throw UsageError(
        fmt::format("trace info: --hot-count {} out of range [1, {}] (the trace's experts)",
                    args.hot_count, trace.num_experts()));
  }
  eval::TraceStatsOptions options;
  options.hot_count = args.hot_count;
  options.num_ranks = args.num_ranks;
  options.num_threads = args.num_threads;
  Progress progress("reading layers", trace.num_layers());
  options.progress = [&progress](int, int) { progress.advance(); };
  const eval::TraceStats stats = eval::compute_trace_stats(trace, options);
  progress.finish();
  if (args.json) {
    fmt::print(
        "{}\n",
        stats_json(trace, stats).dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  } else {
    print_stats_text(trace, stats);
  }
}

}  // namespace

void register_trace_commands(CLI::App& app) {
  CLI::App* trace =
      app.add_subcommand("trace", "Generate synthetic routing traces and inspect traces");
  trace->require_subcommand(1);

  auto gen_args = std::make_shared<GenArgs>();
  CLI::App* gen = trace->add_subcommand("gen", "Generate a synthetic trace from a workload preset");
  gen->add_option("--preset", gen_args->preset,
                  "Workload preset (see --list-presets; required unless --list-presets)");
  gen->add_flag("--list-presets", gen_args->list_presets, "List the workload presets and exit");
  gen->add_option("--steps", gen_args->num_steps, "Steps S (default: the preset's)")
      ->transform(integer_in(1, kMaxInt));
  gen->add_option("--tokens-per-step", gen_args->tokens_per_step,
                  "Tokens per step over all source ranks (default: the preset's)")
      ->transform(integer_in(1, kMaxInt64));
  gen->add_option("--layers", gen_args->num_layers, "MoE layers L (default: the preset's)")
      ->transform(integer_in(1, 4096));
  gen->add_option("--sources", gen_args->num_sources, "Source ranks R (default: the preset's)")
      ->transform(integer_in(1, 65536));
  gen->add_option("--seed", gen_args->seed, "Random seed (default 0)")->transform(seed_value());
  gen->add_option("--threads", gen_args->num_threads,
                  "Generator threads, 0 = all cores; the output does not depend on it")
      ->capture_default_str()
      ->transform(integer_in(0, kMaxThreads));
  gen->add_option("--out", gen_args->out,
                  "Output trace file (cobalt-trace v1 safetensors; required)")
      ->check(non_empty_path());
  gen->callback([gen_args] { run_gen(*gen_args); });

  auto info_args = std::make_shared<InfoArgs>();
  CLI::App* info = trace->add_subcommand("info", "Print a trace's shape and routing statistics");
  info->add_option("file", info_args->file, "Trace file (cobalt-trace v1)")
      ->required()
      ->check(non_empty_path());
  info->add_flag("--json", info_args->json, "Print JSON instead of text");
  info->add_option("--ranks", info_args->num_ranks,
                   "G for the static-EP imbalance (default: the trace's source ranks)")
      ->transform(
          integer_in(0, kMaxRanks, fmt::format("[0, {}] (0 = the trace's sources)", kMaxRanks)));
  CLI::Option* hot_count =
      info->add_option("--hot-count", info_args->hot_count, "H of the hot-set churn (at most E)")
          ->capture_default_str()
          ->transform(integer_in(1, 65536));
  info->add_option("--threads", info_args->num_threads,
                   "Threads for co-activation counting, 0 = all cores")
      ->capture_default_str()
      ->transform(integer_in(0, kMaxThreads));
  info->callback([info_args, hot_count] {
    info_args->hot_count_given = hot_count->count() > 0;
    run_info(*info_args);
  });
}

}  // namespace cobalt::cli
