// Host-side helpers of the CUDA wrappers (implemented in runtime.cpp, compiled by the host
// compiler; the .cu files include only this and <cuda_runtime.h>).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "detail/simt.hpp"  // carve_size

namespace cobalt::cuda::detail {

// Throws cobalt::Error(kInternal) "CUDA: WHAT: <error string>" unless status is cudaSuccess.
void check(cudaError_t status, const char* what);
// Throws cobalt::Error(kInvalidArgument) with `message` unless ok.
void require(bool ok, const char* message);

// Properties of the current device, cached per device id.
struct DeviceInfo {
  int device = 0;
  int num_sms = 0;
  int max_shared_per_block_optin = 0;  // bytes
  int max_threads_per_sm = 0;
};
const DeviceInfo& current_device_info();

inline cudaStream_t as_stream(void* stream) { return static_cast<cudaStream_t>(stream); }

// Carves 256-byte aligned sub-buffers out of a workspace.
class WorkspaceCarver {
 public:
  WorkspaceCarver(void* base, size_t bytes) : base_(static_cast<char*>(base)), bytes_(bytes) {}
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
