// Host-side helpers of the CUDA wrappers (implemented in runtime.cpp, compiled by the host
// compiler; the .cu files include only this and <cuda_runtime.h>).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "detail/simt.hpp"  // carve_size

namespace cobalt::cuda::detail {

// Throws cobalt::Error(kInternal) "CUDA: WHAT: <error string>" unless status is cudaSuccess, after
// clearing the thread's last-error state (the exception reports it).
void check(cudaError_t status, const char* what);
// Throws cobalt::Error(kInvalidArgument) with `message` unless ok.
void require(bool ok, const char* message);
// Every launcher calls this after its argument checks and before it enqueues anything, so the
// cudaGetLastError() after each of its launches reports that launch's own error, not one it
// inherited. An error an earlier CUDA call or launch on this host thread (in this copy of the
// runtime: cobalt_cuda links it statically) left pending is read and cleared, and thrown as
// cobalt::Error(kFailedPrecondition) naming it; one that cannot be cleared (no usable driver or
// device; a lost context) as kInternal. `what` names the launcher.
void require_no_pending_error(const char* what);

// Properties of the current device, cached per device id.
struct DeviceInfo {
  int device = 0;
  int num_sms = 0;
  int max_shared_per_block_optin = 0;  // bytes
  int max_threads_per_sm = 0;
};
const DeviceInfo& current_device_info();

// Lets `kernel` launch with `bytes` of dynamic shared memory: above the 48 KB default, raises the
// kernel's limit on the current device once (thread-safe) to the device's opt-in maximum minus
// the kernel's static shared memory. Throws kInvalidArgument (naming `what`) when `bytes` exceeds
// that, kInternal when the runtime refuses.
void allow_dynamic_shared(const void* kernel, size_t bytes, const char* what);

// cudaOccupancyMaxActiveBlocksPerMultiprocessor for (kernel, block threads, dynamic shared bytes)
// on the current device, asked once and cached (thread-safe): a launcher that sizes its grid by
// occupancy pays a map lookup per call instead of a runtime query.
int max_active_blocks_per_sm(const void* kernel, int block_threads, size_t shared_bytes,
                             const char* what);

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Throws kInvalidArgument with `message` unless p is a multiple of `alignment` bytes.
inline void require_aligned(const void* p, size_t alignment, const char* message) {
  require(reinterpret_cast<uintptr_t>(p) % alignment == 0, message);
}

// Carves 256-byte aligned sub-buffers out of a workspace (whose base must be 256-byte aligned).
class WorkspaceCarver {
 public:
  WorkspaceCarver(void* base, size_t bytes) : base_(static_cast<char*>(base)), bytes_(bytes) {
    require_aligned(base, 256, "cuda: the workspace must be 256-byte aligned");
  }
  template <typename T>
  T* take(size_t count) {
    const size_t size = carve_size<T>(count);
    require(used_ + size <= bytes_, "cuda: workspace too small (see *_workspace_bytes)");
    T* p = reinterpret_cast<T*>(base_ + used_);
    used_ += size;
    return p;
  }
  size_t used() const { return used_; }

 private:
  char* base_;
  size_t bytes_;
  size_t used_ = 0;
};

}  // namespace cobalt::cuda::detail
