// TokenSample: the planner's sample of a layer's recent steps (internal to src/policy/). Cobalt's
// true-objective check scores candidate layouts by the cross-node transfers V of Algorithm 1 on
// these tokens, and layout pricing scales their cost to one step.
//
// It keeps up to kSteps steps, each as an evenly strided sample of up to kTokensPerStep of its
// tokens (every source rank represented when the batch is sorted by source), oldest first. The
// micro-batches of one step share that step's sample: fold() keeps one sample of the same size,
// made of strided parts of the sample so far and of the micro-batch in proportion to their tokens
// (bit for bit the whole step's sample while the step has at most kTokensPerStep tokens).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "cobalt/core/routing_batch.hpp"

namespace cobalt::policy::detail {

class TokenSample {
 public:
  static constexpr int64_t kTokensPerStep = 4096;
  static constexpr size_t kSteps = 4;

  // A new step's batch: its sample replaces the oldest step's when kSteps are kept.
  void record(const RoutingBatch& batch);
  // Another micro-batch of the last recorded step (record() when there is none yet).
  void fold(const RoutingBatch& batch);

  std::span<const ExpertId> ids() const { return ids_; }        // [T', K]
  std::span<const RankId> sources() const { return sources_; }  // [T']
  bool empty() const { return sources_.empty(); }
  // Tokens of one real step per sampled token: (mean tokens of a sampled step) / (sampled
  // tokens); 1 when empty.
  double step_scale() const;

 private:
  // n tokens of `batch`, evenly strided, appended.
  void append_strided(const RoutingBatch& batch, int64_t n);

  std::vector<ExpertId> ids_;
  std::vector<RankId> sources_;
  std::vector<int64_t> step_sizes_;   // sampled tokens per step, oldest first
  std::vector<int64_t> step_tokens_;  // tokens of each sampled step, all its micro-batches
};

}  // namespace cobalt::policy::detail
