#include "topk_rows_check.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cobalt/core/error.hpp"

namespace cobalt::detail {
namespace {

// Rows per block: the accept test stops at the first block with a bad entry (a bad batch is
// refused after little work) without a branch per entry.
constexpr size_t kRowsPerBlock = 2048;

// Four ids per vector (GCC / Clang vector extensions; SSE on x86-64, NEON on Arm): one row of
// K = 4, half a row of K = 8, ids 0-3 or 2-5 of K = 6.
using Lanes = int32_t __attribute__((vector_size(16)));

Lanes load_lanes(const ExpertId* ids) {
  Lanes lanes;
  std::memcpy(&lanes, ids, sizeof(lanes));
  return lanes;
}

// Lanes equal to the lane one or two places on (with wrap-around): every pair of the four.
Lanes pairs_equal_within(Lanes v) {
  return (v == __builtin_shufflevector(v, v, 1, 2, 3, 0)) |
         (v == __builtin_shufflevector(v, v, 2, 3, 0, 1));
}

// Lanes out of [0, limit).
Lanes out_of_range(Lanes v, Lanes limit) { return (v < 0) | (v >= limit); }

// K = 4, 6 and 8: each row's pairs compared in vectors (6, 15 and 28 pairs), 2-6x the scalar
// loop (the compiler's own vectorisation of that loop across rows is slower than none).
template <int kTopK>
bool topk_rows_valid_lanes(const ExpertId* ids, size_t num_tokens, int num_experts) {
  static_assert(kTopK == 4 || kTopK == 6 || kTopK == 8);
  const Lanes limit = {num_experts, num_experts, num_experts, num_experts};
  const Lanes first_two = {-1, -1, 0, 0};
  for (size_t begin = 0; begin < num_tokens; begin += kRowsPerBlock) {
    const size_t end = std::min(num_tokens, begin + kRowsPerBlock);
    Lanes bad = {0, 0, 0, 0};
    for (size_t t = begin; t < end; ++t) {
      const ExpertId* row = ids + t * kTopK;
      const Lanes lo = load_lanes(row);
      bad |= out_of_range(lo, limit) | pairs_equal_within(lo);
      if constexpr (kTopK == 6) {
        // ids 2..5 (overlapping lo): their pairs; then ids 0, 1 against 4, 5 in lanes 0 and 1
        // (lanes 2 and 3 would compare ids 2 and 3 with themselves).
        const Lanes hi = load_lanes(row + 2);
        bad |= out_of_range(hi, limit) | pairs_equal_within(hi);
        bad |= ((lo == __builtin_shufflevector(hi, hi, 2, 3, 0, 1)) |
                (lo == __builtin_shufflevector(hi, hi, 3, 2, 1, 0))) &
               first_two;
      } else if constexpr (kTopK == 8) {
        Lanes hi = load_lanes(row + 4);
        bad |= out_of_range(hi, limit) | pairs_equal_within(hi);
        for (int turn = 0; turn < 4; ++turn) {  // the 16 pairs across the halves
          bad |= lo == hi;
          hi = __builtin_shufflevector(hi, hi, 1, 2, 3, 0);
        }
      }
    }
    if ((bad[0] | bad[1] | bad[2] | bad[3]) != 0) return false;
  }
  return true;
}

// Other K: kTopK > 0 the row length as a constant (unrolled); 0: top_k.
template <int kTopK>
bool topk_rows_valid_impl(const ExpertId* ids, size_t num_tokens, int top_k, int num_experts) {
  const int k_count = kTopK > 0 ? kTopK : top_k;
  const auto limit = static_cast<uint32_t>(num_experts);
  for (size_t begin = 0; begin < num_tokens; begin += kRowsPerBlock) {
    const size_t end = std::min(num_tokens, begin + kRowsPerBlock);
    uint32_t bad = 0;
    for (size_t t = begin; t < end; ++t) {
      const ExpertId* row = ids + t * static_cast<size_t>(k_count);
      for (int k = 0; k < k_count; ++k) {
        // A negative id wraps to >= 2^31 > limit.
        bad |= static_cast<uint32_t>(static_cast<uint32_t>(row[k]) >= limit);
        for (int j = 0; j < k; ++j) bad |= static_cast<uint32_t>(row[j] == row[k]);
      }
    }
    if (bad != 0) return false;
  }
  return true;
}

}  // namespace

bool topk_rows_valid(std::span<const ExpertId> topk_ids, int top_k, int num_experts) {
  const size_t num_tokens = topk_ids.size() / static_cast<size_t>(top_k);
  const ExpertId* ids = topk_ids.data();
  switch (top_k) {
    case 1:
      return topk_rows_valid_impl<1>(ids, num_tokens, top_k, num_experts);
    case 2:
      return topk_rows_valid_impl<2>(ids, num_tokens, top_k, num_experts);
    case 4:
      return topk_rows_valid_lanes<4>(ids, num_tokens, num_experts);
    case 6:
      return topk_rows_valid_lanes<6>(ids, num_tokens, num_experts);
    case 8:
      return topk_rows_valid_lanes<8>(ids, num_tokens, num_experts);
    default:
      return topk_rows_valid_impl<0>(ids, num_tokens, top_k, num_experts);
  }
}

bool ranks_valid(std::span<const RankId> ranks, int num_ranks) {
  const auto limit = static_cast<uint32_t>(num_ranks);
  uint32_t bad = 0;
  for (const RankId rank : ranks)
    bad |= static_cast<uint32_t>(static_cast<uint32_t>(rank) >= limit);
  return bad == 0;
}

void validate_topk_rows_reference(std::span<const ExpertId> topk_ids, int top_k, int num_experts,
                                  const char* what) {
  const size_t num_tokens = topk_ids.size() / static_cast<size_t>(top_k);
  for (size_t t = 0; t < num_tokens; ++t) {
    const ExpertId* row = topk_ids.data() + t * top_k;
    for (int k = 0; k < top_k; ++k) {
      COBALT_CHECK_ARG(row[k] >= 0 && row[k] < num_experts,
                       "{}: token {} slot {} has expert id {} out of range [0, {})", what, t, k,
                       row[k], num_experts);
      for (int j = 0; j < k; ++j) {
        COBALT_CHECK_ARG(row[j] != row[k], "{}: token {} selects expert {} twice (slots {} and {})",
                         what, t, row[k], j, k);
      }
    }
  }
}

}  // namespace cobalt::detail
