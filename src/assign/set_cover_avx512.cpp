// make_set_list_avx512 (set_cover.hpp): the subset search's candidate list with one byte lane per
// node. Lane n of `sets` holds the uncovered experts node n has (bit i: expert i), so building it
// is one masked OR per expert (the expert's node mask is the lane mask), and a node's set is
// dominated when some lane holds a strict superset of it or a lower lane holds the same set: two
// byte compares against all 64 nodes at once. The list is the non-dominated lanes in node order,
// which is make_set_list's (see SetList), so the search that follows gives the same cover.
//
// Compiled for AVX-512 F/BW by function attributes only (as node_cover_avx512.cpp), so the rest
// of the library keeps its baseline target; callers check set_list_avx512_supported() first.
#include <bit>

#include "cobalt/core/error.hpp"
#include "node_cover_avx512.hpp"
#include "set_cover.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define COBALT_SET_LIST_AVX512 1
#include <immintrin.h>
#endif

namespace cobalt::assign::detail {

#if defined(COBALT_SET_LIST_AVX512)

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_epi32() and warn about it (GCC bug
// 105593); nothing here reads an undefined value.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// The assignment kernel's feature set (F, DQ, VL, BW), so one check serves both.
bool set_list_avx512_supported() { return avx512_kernel_supported(); }

__attribute__((target("avx512f,avx512bw"))) void make_set_list_avx512(
    const uint64_t* uncovered_masks, int num_uncovered, SetList& list) {
  COBALT_CHECK_INTERNAL(num_uncovered >= 0 && num_uncovered <= kSetListAvx512MaxElements,
                        "set cover: {} uncovered experts for the byte-lane list (at most {})",
                        num_uncovered, kSetListAvx512MaxElements);
  __m512i sets = _mm512_setzero_si512();  // [64 nodes] bytes
  for (int i = 0; i < num_uncovered; ++i) {
    sets = _mm512_mask_blend_epi8(
        uncovered_masks[i], sets,
        _mm512_or_si512(sets, _mm512_set1_epi8(static_cast<char>(uint8_t{1} << i))));
  }
  alignas(64) uint8_t bytes[64];
  _mm512_store_si512(bytes, sets);
  const uint64_t candidates = _mm512_test_epi8_mask(sets, sets);
  int size = 0;
  for (uint64_t m = candidates; m; m &= m - 1) {
    const int n = std::countr_zero(m);
    const __m512i c = _mm512_set1_epi8(static_cast<char>(bytes[n]));
    // Lanes holding a superset of node n's set (itself included), and those holding it exactly.
    const uint64_t superset = _mm512_cmpeq_epi8_mask(_mm512_or_si512(sets, c), sets);
    const uint64_t equal = _mm512_cmpeq_epi8_mask(sets, c);
    const uint64_t lower = (uint64_t{1} << n) - 1;
    const bool kept = ((superset & ~equal) | (equal & lower)) == 0;
    list.sets[size] = bytes[n];  // written always, counted when kept
    list.node[size] = n;
    size += kept ? 1 : 0;
  }
  list.size = size;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#else  // no AVX-512 in this build

bool set_list_avx512_supported() { return false; }

void make_set_list_avx512(const uint64_t*, int, SetList&) {
  COBALT_CHECK_INTERNAL(false, "set cover: this build has no AVX-512 set list");
}

#endif

}  // namespace cobalt::assign::detail
