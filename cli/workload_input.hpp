// Shared by the commands that replay routing: resolve `--trace FILE | --preset NAME` into a
// StepSource.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "cobalt/eval/cost_model.hpp"
#include "cobalt/eval/step_source.hpp"
#include "cobalt/io/trace.hpp"
#include "cobalt/workload/presets.hpp"
#include "cobalt/workload/spec.hpp"

namespace cobalt::cli {

// Owns whichever backing store the source views (a mapped file or generated data).
struct WorkloadInput {
  std::unique_ptr<io::TraceReader> reader;
  std::unique_ptr<io::TraceData> data;
  std::unique_ptr<eval::StepSource> source;
};

// A preset spec from the command line: unknown names and bad overrides are usage errors (exit 2).
workload::WorkloadSpec preset_spec(const std::string& name,
                                   const workload::PresetOverrides& overrides,
                                   const std::string& command);

// Throws cobalt::Error(kFailedPrecondition) when generating `spec` would need more memory than the
// budget (core/memory.hpp): its I32 expert ids [L, T, K] and source ranks [T].
void require_generation_memory(const workload::WorkloadSpec& spec, const std::string& command);

// Exactly one of trace_path / preset must be non-empty (UsageError otherwise). `adjust` may edit
// the preset's spec before generation (e.g. a smaller instance). `chunks` re-chunks or cycles a
// trace file's steps (eval/step_source.hpp; presets take their sizes from `overrides` instead);
// chunk options that do not fit the trace are usage errors. A preset is generated on every core
// (the trace does not depend on the thread count, and generation precedes anything timed).
WorkloadInput load_workload(const std::string& trace_path, const std::string& preset,
                            const workload::PresetOverrides& overrides, const std::string& command,
                            const std::function<void(workload::WorkloadSpec&)>& adjust = {},
                            const eval::ChunkOptions& chunks = {});

// The metadata of the loaded trace (the file's extra keys or the generated trace's).
const std::map<std::string, std::string>& workload_metadata(const WorkloadInput& input);

// The model preset for the cost model's sizes and why it was chosen: `name` when given (an
// unknown name is a usage error), else the trace metadata's model, else a preset with the
// workload's E and K, else glm-4.5-air.
std::pair<eval::ModelPreset, std::string> choose_model(const std::string& name,
                                                       const WorkloadInput& input);

}  // namespace cobalt::cli
