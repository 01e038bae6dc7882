// Algorithm 1 (N <= 8 nodes, K <= 8) with one token's K tasks in the eight 64-bit lanes of an
// AVX-512 register. The cover is found on scalar registers (OrderedMaskTable::drawn_cover); the
// node masks, the replica offsets and the chosen ranks are gathered, the counter-based hashes are
// computed for all tasks at once (64-bit lane multiplies), and the multiply-shift draws use a
// 32x32-bit decomposition of the 64-bit high product, which is exact. The result is bit for bit
// the portable loop's (assign_range_with_table in node_cover.cpp) and the reference's.
//
// Compiled for AVX-512 F/DQ/VL/BW (the AVX-512 part of x86-64-v4; nothing else of v4 is used) by
// function attributes only, so the rest of the library keeps its baseline target; callers must
// check avx512_kernel_supported() first. On other architectures or compilers both functions exist
// and the kernel is never chosen (calling it throws kInternal).
#pragma once

#include <cstdint>

#include "assign_inputs.hpp"
#include "ordered_mask_table.hpp"

namespace cobalt::assign::detail {

// True when this build has the kernel and this CPU and OS run AVX-512 F, DQ, VL and BW and BMI2
// (which every AVX-512 CPU has; the OS saving the zmm state included). Computed once.
bool avx512_kernel_supported();

// Largest K the kernel takes: one token's tasks fill at most one register of eight lanes.
inline constexpr int kAvx512MaxTopK = 8;

// Tokens [begin, end) of `in` (in.top_k <= kAvx512MaxTopK, table.num_nodes() == in.num_nodes).
// Requires avx512_kernel_supported().
void assign_range_avx512(const AssignInputs& in, const OrderedMaskTable& table, int64_t begin,
                         int64_t end);

// The kernel's draw, exposed for its tests: out[i] = uniform_below(hash[i], n[i]) (rng.hpp) for
// eight lanes, n[i] < 2^32, by the kernel's 32x32-bit decomposition. Requires
// avx512_kernel_supported().
void uniform_below_avx512(const uint64_t* hash, const uint64_t* n, uint64_t* out);

}  // namespace cobalt::assign::detail
