#include "workload_input.hpp"

#include <fmt/format.h>

#include "cobalt/core/error.hpp"
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
  input.data = std::make_unique<io::TraceData>(workload::generate_trace(spec));
  input.source = eval::make_step_source(*input.data);
  return input;
}

const std::map<std::string, std::string>& workload_metadata(const WorkloadInput& input) {
  return input.reader ? input.reader->metadata() : input.data->metadata;
}

}  // namespace cobalt::cli
