// Index types. Experts, ranks and nodes are small dense integers; tokens can exceed 2^31 only in
// aggregate, so per-batch token indices are int64.
#pragma once

#include <cstdint>

namespace cobalt {

using ExpertId = int32_t;  // in [0, num_experts)
using RankId = int32_t;    // in [0, num_ranks)
using NodeId = int32_t;    // in [0, num_nodes)
using TokenIdx = int64_t;  // in [0, num_tokens)

inline constexpr ExpertId kEmptySlot = -1;   // an unused replica slot in an ExpertLayout
inline constexpr int kMaxNodes = 64;         // node sets are 64-bit masks
inline constexpr int kMaxRanks = 8192;       // ranks of one expert-parallel group
inline constexpr int kMaxExperts = 65536;    // experts of one MoE layer
inline constexpr int kMaxSources = 1 << 20;  // data-parallel source ranks of a trace

}  // namespace cobalt
