// Inputs shared by the benchmarks: skewed routing with K distinct experts per token.
#pragma once

#include <cstdint>
#include <vector>

#include "cobalt/core/ids.hpp"
#include "cobalt/core/rng.hpp"

namespace cobalt::bench {

struct Routing {
  std::vector<ExpertId> ids;  // [T, K]
  std::vector<RankId> src;    // [T], contiguous blocks over the ranks
};

// Expert e drawn as floor(u1 * u2 * E) (skewed towards low ids), K distinct per token.
inline Routing make_routing(int64_t num_tokens, int top_k, int num_experts, int num_ranks,
                            uint64_t seed = 7) {
  SplitMix64 rng(seed);
  Routing w;
  w.ids.resize(num_tokens * top_k);
  w.src.resize(num_tokens);
  for (int64_t t = 0; t < num_tokens; ++t) {
    ExpertId* row = w.ids.data() + t * top_k;
    for (int k = 0; k < top_k;) {
      const ExpertId e = static_cast<ExpertId>(rng.unit() * rng.unit() * num_experts);
      bool seen = false;
      for (int j = 0; j < k; ++j) seen = seen || row[j] == e;
      if (!seen) row[k++] = e;
    }
    w.src[t] = static_cast<RankId>(t * num_ranks / num_tokens);
  }
  return w;
}

}  // namespace cobalt::bench
