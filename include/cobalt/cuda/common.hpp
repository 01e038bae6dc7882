// Plain C++ interface of Cobalt's CUDA kernels (src/cuda/, built when nvcc is found; docs/gpu.md).
//
// Conventions shared by every header in cobalt/cuda/:
//   * every pointer argument is a device pointer (cudaMalloc'd, or a torch CUDA tensor's
//     data_ptr()), unless the comment says host;
//   * `Stream` is a cudaStream_t passed as void* (nullptr = the legacy default stream), so these
//     headers compile without the CUDA toolkit; all work is enqueued on that stream and nothing
//     synchronises the host (no host round trip), unless a comment says otherwise;
//   * outputs are fully overwritten (never accumulated), so callers need not zero them;
//   * scratch memory is a caller-provided workspace of at least *_workspace_bytes() bytes (device,
//     256-byte aligned), so repeated calls allocate nothing;
//   * results are bitwise identical to the CPU reference named in each header (same inputs =>
//     same integers), whatever the launch configuration;
//   * argument errors found on the host throw cobalt::Error(kInvalidArgument); CUDA runtime errors
//     throw cobalt::Error(kInternal) naming the call (and are cleared from the thread's
//     last-error state); an error an earlier CUDA call on this thread left pending (in the CUDA
//     runtime cobalt_cuda links statically) is found before anything is enqueued, cleared and
//     thrown as cobalt::Error(kFailedPrecondition) naming it, so no launch is blamed for it
//     (a fault of an earlier kernel that the host has not seen yet can still surface at a later
//     launch: errors of asynchronous work reach the host only when it synchronises).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cobalt::cuda {

using Stream = void*;  // a cudaStream_t

// The derived maps of an ExpertLayout that the assignment kernel reads, in device memory (see
// ExpertLayout::node_masks(), node_offsets(), replica_ranks(); DeviceLayout uploads them).
struct LayoutView {
  int num_experts = 0;
  int num_nodes = 0;
  int num_ranks = 0;                       // G; ranks per node = G / N
  const uint64_t* node_mask = nullptr;     // [E]: bit n set when node n holds e
  const int32_t* node_offsets = nullptr;   // [E * N + 1] into replica_ranks
  const int32_t* replica_ranks = nullptr;  // ranks of (e, n) ascending at [o[e*N+n], o[e*N+n+1])
};

// Whether the CUDA runtime sees at least one device (false without a driver or GPU; never throws).
bool device_available();

// Rounds a workspace size up so sub-buffers stay 256-byte aligned.
constexpr size_t align_workspace(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace cobalt::cuda
