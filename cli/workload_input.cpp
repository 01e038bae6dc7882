#include "workload_input.hpp"

#include <fmt/format.h>

#include "cobalt/core/error.hpp"
#include "cobalt/core/memory.hpp"
#include "cobalt/core/text.hpp"
#include "cobalt/workload/synthetic.hpp"
#include "commands.hpp"

namespace cobalt::cli {

workload::WorkloadSpec preset_spec(const std::string& name,
                                   const workload::PresetOverrides& overrides,
                                   const std::string& command) {
  try {
    return workload::workload_preset(name, overrides);
  } catch (const Error& e) {
    // An unknown preset or an out-of-range override came from the command line: a usage error.
    throw UsageError(fmt::format("{}: {}", command, e.what()));
  }
}

void require_generation_memory(const workload::WorkloadSpec& spec, const std::string& command) {
  const double tokens =
      static_cast<double>(spec.num_steps) * static_cast<double>(spec.tokens_per_step);
  // I32 expert ids [L, T, K] and source ranks [T].
  const double bytes = 4.0 * tokens * (static_cast<double>(spec.num_layers) * spec.top_k + 1);
  require_memory(
      bytes,
      fmt::format("{}: the generated trace ({} layers x {} steps x {} tokens x top-{})", command,
                  spec.num_layers, spec.num_steps, spec.tokens_per_step, spec.top_k),
      "lower --steps, --tokens-per-step or --layers");
}

WorkloadInput load_workload(const std::string& trace_path, const std::string& preset,
                            const workload::PresetOverrides& overrides, const std::string& command,
                            const std::function<void(workload::WorkloadSpec&)>& adjust,
                            const eval::ChunkOptions& chunks) {
  if (trace_path.empty() == preset.empty()) {
    throw UsageError(fmt::format("{}: give exactly one of --trace FILE or --preset NAME", command));
  }
  WorkloadInput input;
  if (!trace_path.empty()) {
    input.reader = std::make_unique<io::TraceReader>(trace_path);
    try {
      input.source = eval::make_step_source(*input.reader, chunks);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument) throw;
      throw UsageError(fmt::format("{}: {}", command, e.what()));
    }
    return input;
  }
  workload::WorkloadSpec spec = preset_spec(preset, overrides, command);
  if (adjust) adjust(spec);
  require_generation_memory(spec, command);
  workload::GenerateOptions generate;
  generate.num_threads = 0;  // every core (see the header)
  Progress progress("generating " + spec.name,
                    static_cast<int64_t>(spec.num_layers) * spec.num_steps);
  generate.progress = [&progress](int64_t, int64_t) { progress.advance(); };
  input.data = std::make_unique<io::TraceData>(workload::generate_trace(spec, generate));
  progress.finish();
  input.source = eval::make_step_source(*input.data);
  return input;
}

const std::map<std::string, std::string>& workload_metadata(const WorkloadInput& input) {
  return input.reader ? input.reader->metadata() : input.data->metadata;
}

std::pair<eval::ModelPreset, std::string> choose_model(const std::string& name,
                                                       const WorkloadInput& input) {
  if (!name.empty()) return {as_usage_error([&] { return eval::model_preset(name); }), "--model"};
  const auto& meta = workload_metadata(input);
  const auto it = meta.find("model");
  const std::string from_trace = it == meta.end() ? "" : it->second;
  const auto guess =
      eval::guess_model_preset(from_trace, input.source->num_experts(), input.source->top_k());
  if (guess) {
    const auto& preset = eval::model_preset(*guess);
    const bool by_name =
        !from_trace.empty() && eval::guess_model_preset(from_trace, 0, 0).has_value();
    return {preset, by_name ? fmt::format("trace metadata model '{}'", printable(from_trace))
                            : "same E and K as the workload"};
  }
  return {eval::model_preset("glm-4.5-air"), "default"};
}

}  // namespace cobalt::cli
