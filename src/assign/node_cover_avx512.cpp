#include "node_cover_avx512.hpp"

#include <algorithm>
#include <array>
#include <bit>

#include "cobalt/core/error.hpp"
#include "cobalt/core/rng.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define COBALT_AVX512_KERNEL 1
#include <immintrin.h>
#endif

namespace cobalt::assign::detail {

#if defined(COBALT_AVX512_KERNEL)

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_epi32() and warn about it at every use
// (GCC bug 105593, fixed in GCC 13), as "may be" or, once inlined, "is" uninitialized; nothing
// here reads an undefined value.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

// Function attributes, not a per-file -mavx512f: inline functions from headers instantiated in
// this file (std::, rng.hpp) keep the baseline target, so the linker can never pick an AVX-512 copy
// of them for the rest of the library.
// The kernel's scalar step (the cover) must stay scalar: GCC's loop vectoriser turns its K loads
// into lane inserts and extracts, 2.5x slower at N = 4 (measured), so src/CMakeLists.txt compiles
// this file with -fno-tree-vectorize (explicit intrinsics are not affected).
// BMI2 (pdep) draws the cover; every CPU with AVX-512 has it, and avx512_kernel_supported checks
// it.
#define COBALT_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,bmi2")))

namespace {

COBALT_AVX512 inline __m512i splat(uint64_t value) {
  return _mm512_set1_epi64(static_cast<long long>(value));
}

// mix64 (rng.hpp) in every lane.
COBALT_AVX512 inline __m512i mix64_x8(__m512i x) {
  x = _mm512_add_epi64(x, splat(0x9e3779b97f4a7c15ULL));
  x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 30)),
                         splat(0xbf58476d1ce4e5b9ULL));
  x = _mm512_mullo_epi64(_mm512_xor_si512(x, _mm512_srli_epi64(x, 27)),
                         splat(0x94d049bb133111ebULL));
  return _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
}

// uniform_below (rng.hpp) in every lane, n < 2^32 in each lane: with h = hi * 2^32 + lo,
// floor(h * n / 2^64) = floor((hi * n + floor(lo * n / 2^32)) / 2^32), and the sum fits 64 bits.
COBALT_AVX512 inline __m512i uniform_below_x8(__m512i hash, __m512i n) {
  const __m512i high = _mm512_mul_epu32(_mm512_srli_epi64(hash, 32), n);
  const __m512i low = _mm512_mul_epu32(hash, n);
  return _mm512_srli_epi64(_mm512_add_epi64(high, _mm512_srli_epi64(low, 32)), 32);
}

// For option masks of N <= 8 nodes (each lane's low byte) and a draw `choice` below their popcount:
// the node of the choice-th set bit. With p_j the number of set bits at positions <= j (a prefix
// sum over the lane's bytes after spreading bit j to byte j), that node is #{j : p_j <= choice};
// bytes j >= N hold the full popcount, which exceeds every choice, so they never count.
struct SpreadOptions {
  __m512i prefix_counts;  // byte j of each lane: p_j
  __m512i popcount;       // each lane: p_7
};

COBALT_AVX512 inline __m512i broadcast_low_byte(__m512i x) {
  const __m512i low_byte_of_lane =
      _mm512_broadcast_i32x4(_mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8));
  return _mm512_shuffle_epi8(x, low_byte_of_lane);
}

COBALT_AVX512 inline SpreadOptions spread_options(__m512i options) {
  __m512i bits = _mm512_and_si512(broadcast_low_byte(options), splat(0x8040201008040201ULL));
  bits = _mm512_min_epu8(bits, _mm512_set1_epi8(1));
  bits = _mm512_add_epi64(bits, _mm512_slli_epi64(bits, 8));
  bits = _mm512_add_epi64(bits, _mm512_slli_epi64(bits, 16));
  bits = _mm512_add_epi64(bits, _mm512_slli_epi64(bits, 32));
  return {bits, _mm512_srli_epi64(bits, 56)};
}

COBALT_AVX512 inline __m512i nth_set_node(const SpreadOptions& spread, __m512i choice) {
  // (choice + 1 - p_j) saturated at 0 is > 0 exactly when p_j <= choice; min with 1, sum bytes.
  const __m512i limit = broadcast_low_byte(_mm512_add_epi64(choice, splat(1)));
  const __m512i counted =
      _mm512_min_epu8(_mm512_subs_epu8(limit, spread.prefix_counts), _mm512_set1_epi8(1));
  return _mm512_sad_epu8(counted, _mm512_setzero_si512());
}

// OrderedMaskTable::drawn_cover, the same cover bit for bit, without branches on the tie: the
// draw is always made (uniform_below(h, 1) == 0, so a unique minimum cover is kept) and the r-th
// set position is found by pdep instead of clearing r bits in a loop. (The branches of the portable
// form mispredict on the 20-34% of remote tokens whose minimum cover ties.)
template <int kWords>
COBALT_AVX512 inline uint64_t drawn_cover_bmi2(const OrderedMaskTable& table, const uint64_t* masks,
                                               int num_masks, int src_node, uint64_t token_h) {
  std::array<uint64_t, kWords> feasible;
  const uint64_t* base = table.without_node(src_node);
  for (int w = 0; w < kWords; ++w) feasible[w] = base[w];
  for (int k = 0; k < num_masks; ++k) {
    const uint64_t local = uint64_t{0} - ((masks[k] >> src_node) & 1);  // all ones when local
    const uint64_t* h = table.hits(masks[k]);
    for (int w = 0; w < kWords; ++w) feasible[w] &= h[w] | local;
  }
  int first_word = 0;
  while (first_word + 1 < kWords && feasible[first_word] == 0) ++first_word;
  const uint64_t first = table.mask_at(first_word * 64 + std::countr_zero(feasible[first_word]));
  const uint64_t* same_size = table.popcount_class(std::popcount(first));
  std::array<uint32_t, kWords> in_word;
  uint32_t count = 0;
  for (int w = 0; w < kWords; ++w) {
    feasible[w] &= same_size[w];
    in_word[w] = static_cast<uint32_t>(std::popcount(feasible[w]));
    count += in_word[w];
  }
  uint32_t r = uniform_below(cover_hash_from_token(token_h), count);
  int w = 0;
  while (w + 1 < kWords && r >= in_word[w]) r -= in_word[w++];
  return table.mask_at(w * 64 + std::countr_zero(_pdep_u64(uint64_t{1} << r, feasible[w])));
}

template <int kWords>
COBALT_AVX512 void assign_range(const AssignInputs& in, const OrderedMaskTable& table,
                                int64_t begin, int64_t end) {
  const int top_k = in.top_k;
  const ExpertId* const ids_base = in.ids;
  const RankId* const src = in.src;
  const NodeId* const node_of_rank = in.node_of_rank;
  const uint64_t* const node_mask = in.node_mask;
  const int32_t* const node_offsets = in.node_offsets;
  const RankId* const replica_ranks = in.replica_ranks;
  RankId* const exec_rank = in.exec_rank;
  const uint64_t prefix = in.prefix;
  const int64_t token_offset = in.token_offset;
  const __mmask8 lanes = static_cast<__mmask8>((1u << top_k) - 1);
  // Lane k holds task k's salt k * 0x8cb92ba72f3d8dd7 (task_hash_from_token).
  const __m512i task_salt =
      _mm512_mullo_epi64(_mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7), splat(0x8cb92ba72f3d8dd7ULL));
  const __m512i zero = _mm512_setzero_si512();
  const __m256i num_nodes = _mm256_set1_epi32(in.num_nodes);
  const __m512i low_dwords = splat(0xffffffffULL);
  // Two passes over blocks of tokens, so that each pass's chain of dependent gathers is short
  // and the core overlaps many tokens: (1) cover, node and the (expert, node) index; (2) the
  // replica offsets, the rank draw and the store.
  constexpr int kBlock = 32;
  alignas(64) __m256i offsets_index[kBlock];
  alignas(64) __m512i rank_hash[kBlock];
  std::array<uint64_t, kAvx512MaxTopK> masks;
  for (int64_t block_begin = begin; block_begin < end; block_begin += kBlock) {
    const int block_size = static_cast<int>(std::min<int64_t>(kBlock, end - block_begin));
    for (int i = 0; i < block_size; ++i) {
      const int64_t t = block_begin + i;
      const ExpertId* row = ids_base + t * top_k;
      const int src_node = node_of_rank[src[t]];
      // Step 1 on scalar registers (the cover's inputs are a short chain of loads there),
      // OrderedMaskTable::drawn_cover's; the vector step gathers the same masks.
      for (int k = 0; k < top_k; ++k) masks[k] = node_mask[row[k]];
      const uint64_t token_h =
          token_hash(prefix, static_cast<uint64_t>(token_offset) + static_cast<uint64_t>(t));
      const uint64_t cover =
          drawn_cover_bmi2<kWords>(table, masks.data(), top_k, src_node, token_h);

      const __m256i ids = _mm256_maskz_loadu_epi32(lanes, row);
      const __m512i lane_masks = _mm512_mask_i32gather_epi64(zero, lanes, ids, node_mask, 8);
      const __m512i src_bit = splat(uint64_t{1} << src_node);
      const __mmask8 local = _mm512_mask_test_epi64_mask(lanes, lane_masks, src_bit);
      // Step 2: each task's node: its source node when local, else uniform within cover & mask.
      const __m512i hash = mix64_x8(_mm512_xor_si512(splat(token_h), task_salt));
      const __m512i options =
          _mm512_mask_blend_epi64(local, _mm512_and_si512(splat(cover), lane_masks), src_bit);
      const SpreadOptions spread = spread_options(options);
      const __m512i node = nth_set_node(spread, uniform_below_x8(hash, spread.popcount));
      offsets_index[i] =
          _mm256_add_epi32(_mm256_mullo_epi32(ids, num_nodes), _mm512_cvtepi64_epi32(node));
      rank_hash[i] = mix64_x8(hash);
    }
    // Then its rank, uniform within the (expert, node) replicas.
    for (int i = 0; i < block_size; ++i) {
      // One 64-bit gather reads node_offsets[idx] (low half) and node_offsets[idx + 1] (high).
      const __m512i offsets =
          _mm512_mask_i32gather_epi64(zero, lanes, offsets_index[i], node_offsets, 4);
      const __m512i first = _mm512_and_si512(offsets, low_dwords);
      const __m512i count = _mm512_sub_epi64(_mm512_srli_epi64(offsets, 32), first);
      const __m512i replica = _mm512_add_epi64(first, uniform_below_x8(rank_hash[i], count));
      const __m256i ranks = _mm256_mmask_i32gather_epi32(
          _mm256_setzero_si256(), lanes, _mm512_cvtepi64_epi32(replica), replica_ranks, 4);
      _mm256_mask_storeu_epi32(exec_rank + (block_begin + i) * top_k, lanes, ranks);
    }
  }
}

}  // namespace

bool avx512_kernel_supported() {
  static const bool supported = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("bmi2");
  }();
  return supported;
}

void assign_range_avx512(const AssignInputs& in, const OrderedMaskTable& table, int64_t begin,
                         int64_t end) {
  COBALT_CHECK_INTERNAL(avx512_kernel_supported() && in.top_k >= 1 && in.top_k <= kAvx512MaxTopK &&
                            table.num_nodes() == in.num_nodes,
                        "assignment: AVX-512 kernel called with K = {}, N = {} (table N = {})",
                        in.top_k, in.num_nodes, table.num_nodes());
  switch (table.num_words()) {
    case 1:
      return assign_range<1>(in, table, begin, end);
    case 2:
      return assign_range<2>(in, table, begin, end);
    default:
      return assign_range<4>(in, table, begin, end);
  }
}

namespace {

COBALT_AVX512 void uniform_below_lanes(const uint64_t* hash, const uint64_t* n, uint64_t* out) {
  _mm512_storeu_si512(out, uniform_below_x8(_mm512_loadu_si512(hash), _mm512_loadu_si512(n)));
}

}  // namespace

// A plain function around the AVX-512 one, like assign_range_avx512: the check runs before any
// AVX-512 instruction can.
void uniform_below_avx512(const uint64_t* hash, const uint64_t* n, uint64_t* out) {
  COBALT_CHECK_INTERNAL(avx512_kernel_supported(), "uniform_below_avx512: no AVX-512 on this CPU");
  uniform_below_lanes(hash, n, out);
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#else  // no kernel in this build

bool avx512_kernel_supported() { return false; }

void assign_range_avx512(const AssignInputs&, const OrderedMaskTable&, int64_t, int64_t) {
  COBALT_CHECK_INTERNAL(false, "assignment: this build has no AVX-512 kernel");
}

void uniform_below_avx512(const uint64_t*, const uint64_t*, uint64_t*) {
  COBALT_CHECK_INTERNAL(false, "uniform_below_avx512: this build has no AVX-512 kernel");
}

#endif

}  // namespace cobalt::assign::detail
