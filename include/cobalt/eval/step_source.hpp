// StepSource: where a replay's routing comes from — a trace file (memory-mapped, read step by step)
// or an in-memory trace (e.g. a synthetic preset). Source ranks are mapped onto the simulated G
// ranks: source r of R maps to rank floor(r * G / R) (neighbouring sources stay on one node); a
// trace without sources splits each (replayed) step's tokens into G contiguous blocks.
//
// Steps (ChunkOptions; the trace's T tokens are read in file order, the same tokens in every
// layer):
//   neither option        the trace's own steps (step_offsets).
//   num_steps S only      re-chunked: step s = tokens [floor(s T / S), floor((s+1) T / S)), every
//                         token exactly once (requires S <= T).
//   tokens_per_step T_s   re-chunked: S = max(1, floor(T / T_s)) steps of T_s tokens (the tail
//                         shorter than T_s is left out; T_s > T cycles, see below).
//   both                  cycled: step s = tokens [s T_s, (s+1) T_s) of the trace repeated end to
//                         end (token i is token i mod T), so a short trace is replayed more than
//                         once and a long one is cut.
// Load-only traces (counts [S, L, R, E], no tokens) cannot be re-chunked: num_steps S' replays
// step s' as the trace's step s' mod S (cycled or cut) and tokens_per_step is rejected.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cobalt/core/routing_batch.hpp"
#include "cobalt/io/trace.hpp"

namespace cobalt::eval {

// Owns the buffers a batch views; reuse one per thread to avoid reallocation.
struct StepScratch {
  std::vector<ExpertId> ids;
  std::vector<ExpertId> piece;  // one contiguous piece of a step that wraps around the trace
  std::vector<RankId> raw_src;
  std::vector<RankId> raw_piece;
  std::vector<RankId> src;
  std::vector<int32_t> counts;
};

struct ChunkOptions {
  std::optional<int> num_steps;
  std::optional<int64_t> tokens_per_step;
};

// How the replayed steps relate to the trace (for reports).
struct ChunkInfo {
  std::string mode = "trace";  // "trace" (own steps), "rechunked" or "cycled"
  int trace_steps = 0;
  int64_t trace_tokens = 0;  // 0 for load-only traces
  double passes = 1.0;       // replayed tokens (or steps) / trace tokens (or steps)
};

class StepSource {
 public:
  virtual ~StepSource() = default;
  virtual int num_experts() const = 0;
  virtual int top_k() const = 0;
  virtual int num_layers() const = 0;
  virtual int num_steps() const = 0;
  virtual const ChunkInfo& chunk_info() const = 0;
  // False for load-only (counts) sources: batch() throws, loads() works.
  virtual bool has_tokens() const { return true; }
  // Tokens of a step (token sources; 0 for load-only sources).
  virtual int64_t num_tokens(int step) const = 0;
  // Routing of (step, layer) with sources mapped onto num_ranks ranks; views into scratch or the
  // trace. Throws kFailedPrecondition for load-only sources.
  virtual RoutingBatch batch(int step, int layer, int num_ranks, StepScratch& scratch) const = 0;
  // Tasks from each rank to each expert of (step, layer): out [G, E] with G = num_ranks (sources
  // mapped onto the ranks). Load-only sources only; token sources throw kFailedPrecondition.
  virtual void loads(int step, int layer, int num_ranks, std::span<int64_t> out,
                     StepScratch& scratch) const;
};

// The reader / data must outlive the source. Throws kInvalidArgument for chunk options that do not
// fit the trace (num_steps > T, options < 1, tokens_per_step on a load-only trace).
std::unique_ptr<StepSource> make_step_source(const io::TraceReader& reader,
                                             const ChunkOptions& chunks = {});
std::unique_ptr<StepSource> make_step_source(const io::TraceData& data,
                                             const ChunkOptions& chunks = {});

// Maps sources [T] of R sources onto G ranks: floor(r * G / R).
void map_sources(std::span<const RankId> raw, int num_sources, int num_ranks,
                 std::span<RankId> out);

}  // namespace cobalt::eval
