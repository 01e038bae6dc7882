// StepSource: where a replay's routing comes from — a trace file (memory-mapped, read step by step)
// or an in-memory trace (e.g. a synthetic preset). Source ranks are mapped onto the simulated G
// ranks: source r of R maps to rank floor(r * G / R) (neighbouring sources stay on one node); a
// trace without sources splits each step's tokens into G contiguous blocks.
#pragma once

#include <memory>
#include <vector>

#include "cobalt/core/routing_batch.hpp"
#include "cobalt/io/trace.hpp"

namespace cobalt::eval {

// Owns the buffers a batch views; reuse one per thread to avoid reallocation.
struct StepScratch {
  std::vector<ExpertId> ids;
  std::vector<RankId> raw_src;
  std::vector<RankId> src;
};

class StepSource {
 public:
  virtual ~StepSource() = default;
  virtual int num_experts() const = 0;
  virtual int top_k() const = 0;
  virtual int num_layers() const = 0;
  virtual int num_steps() const = 0;
  virtual int64_t num_tokens(int step) const = 0;
  // Routing of (step, layer) with sources mapped onto num_ranks ranks; views into scratch or the
  // trace.
  virtual RoutingBatch batch(int step, int layer, int num_ranks, StepScratch& scratch) const = 0;
};

// The reader / data must outlive the source. Throws kInvalidArgument for load-only traces.
std::unique_ptr<StepSource> make_step_source(const io::TraceReader& reader);
std::unique_ptr<StepSource> make_step_source(const io::TraceData& data);

// Maps sources [T] of R sources onto G ranks: floor(r * G / R).
void map_sources(std::span<const RankId> raw, int num_sources, int num_ranks,
                 std::span<RankId> out);

}  // namespace cobalt::eval
