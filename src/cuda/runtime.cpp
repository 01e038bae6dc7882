// Host-side runtime helpers of the CUDA kernels (host compiler; CUDA runtime API only).
#include "detail/runtime.hpp"

#include <cuda_runtime.h>

#include <deque>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "cobalt/core/error.hpp"
#include "cobalt/cuda/common.hpp"
#include "cobalt/cuda/device_layout.hpp"

namespace cobalt::cuda {
namespace detail {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    // The exception delivers the error: clear it from the thread's last-error state (a sticky
    // error stays with the context anyway), so the next launcher's require_no_pending_error does
    // not take it for someone else's.
    (void)cudaGetLastError();
    fail(ErrorCode::kInternal, "CUDA: {}: {}", what, cudaGetErrorString(status));
  }
}

void require(bool ok, const char* message) {
  if (!ok) fail(ErrorCode::kInvalidArgument, "{}", message);
}

void require_no_pending_error(const char* what) {
  const cudaError_t pending = cudaGetLastError();  // reads, and clears unless sticky
  if (pending == cudaSuccess) return;
  if (cudaPeekAtLastError() != cudaSuccess) {
    // It stays: the runtime cannot be used here (no driver or device) or the context is lost (a
    // sticky error such as an illegal address). The launch would fail with the same error.
    fail(ErrorCode::kInternal, "CUDA: {}: {} ({})", what, cudaGetErrorString(pending),
         cudaGetErrorName(pending));
  }
  fail(ErrorCode::kFailedPrecondition,
       "CUDA: {} launched nothing: an earlier CUDA call on this thread left an error pending ({}: "
       "{}); it is reported here and cleared, so a retry runs (check the call that left it)",
       what, cudaGetErrorName(pending), cudaGetErrorString(pending));
}

const DeviceInfo& current_device_info() {
  static std::mutex mutex;
  static std::deque<DeviceInfo> cache;  // push_back keeps references valid
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  std::lock_guard<std::mutex> lock(mutex);
  for (const DeviceInfo& info : cache) {
    if (info.device == device) return info;
  }
  DeviceInfo info;
  info.device = device;
  check(cudaDeviceGetAttribute(&info.num_sms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute (SM count)");
  check(cudaDeviceGetAttribute(&info.max_shared_per_block_optin,
                               cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
        "cudaDeviceGetAttribute (shared memory)");
  check(cudaDeviceGetAttribute(&info.max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor,
                               device),
        "cudaDeviceGetAttribute (threads per SM)");
  cache.push_back(info);
  return cache.back();
}

void allow_dynamic_shared(const void* kernel, size_t bytes, const char* what) {
  // The default per-block limit covers static and dynamic shared memory together.
  constexpr size_t kDefaultLimit = 48 * 1024;
  if (bytes == 0) return;
  const DeviceInfo& info = current_device_info();
  struct Limits {
    size_t static_bytes = 0;
    size_t dynamic_limit = 0;  // 0 until the attribute is raised
  };
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, Limits> limits;  // (kernel, device)
  std::lock_guard<std::mutex> lock(mutex);
  auto it = limits.find({kernel, info.device});
  if (it == limits.end()) {
    cudaFuncAttributes attributes{};
    check(cudaFuncGetAttributes(&attributes, kernel), what);
    it = limits.emplace(std::make_pair(kernel, info.device), Limits{attributes.sharedSizeBytes, 0})
             .first;
  }
  Limits& kernel_limits = it->second;
  if (bytes + kernel_limits.static_bytes <= kDefaultLimit) return;
  if (kernel_limits.dynamic_limit == 0) {
    // Raise the kernel's limit once to everything the device allows next to its static shared
    // memory; a process-wide attribute set per call would race between host threads.
    const size_t limit =
        static_cast<size_t>(info.max_shared_per_block_optin) - kernel_limits.static_bytes;
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(limit)),
          what);
    kernel_limits.dynamic_limit = limit;
  }
  if (bytes > kernel_limits.dynamic_limit) {
    fail(ErrorCode::kInvalidArgument,
         "cuda: {} needs {} bytes of shared memory per block, the device allows {}", what, bytes,
         kernel_limits.dynamic_limit);
  }
}

int max_active_blocks_per_sm(const void* kernel, int block_threads, size_t shared_bytes,
                             const char* what) {
  const int device = current_device_info().device;
  using Key = std::tuple<const void*, int, int, size_t>;  // (kernel, device, threads, bytes)
  static std::mutex mutex;
  static std::map<Key, int> cache;
  std::lock_guard<std::mutex> lock(mutex);
  const Key key{kernel, device, block_threads, shared_bytes};
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  int per_sm = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, block_threads, shared_bytes),
        what);
  cache.emplace(key, per_sm);
  return per_sm;
}

}  // namespace detail

bool device_available() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky-free error state
    return false;
  }
  return count > 0;
}

DeviceLayout::DeviceLayout(const ExpertLayout& layout, Stream stream) {
  const auto masks = layout.node_masks();
  const auto offsets = layout.node_offsets();
  const auto ranks = layout.replica_ranks();
  const size_t mask_bytes = detail::carve_size<uint64_t>(masks.size());
  const size_t offset_bytes = detail::carve_size<int32_t>(offsets.size());
  const size_t rank_bytes = detail::carve_size<int32_t>(ranks.size());
  detail::check(cudaMalloc(&storage_, mask_bytes + offset_bytes + rank_bytes),
                "cudaMalloc (DeviceLayout)");
  char* base = static_cast<char*>(storage_);
  auto* d_masks = reinterpret_cast<uint64_t*>(base);
  auto* d_offsets = reinterpret_cast<int32_t*>(base + mask_bytes);
  auto* d_ranks = reinterpret_cast<int32_t*>(base + mask_bytes + offset_bytes);
  cudaStream_t s = detail::as_stream(stream);
  try {
    detail::check(
        cudaMemcpyAsync(d_masks, masks.data(), masks.size_bytes(), cudaMemcpyHostToDevice, s),
        "cudaMemcpyAsync (layout masks)");
    detail::check(
        cudaMemcpyAsync(d_offsets, offsets.data(), offsets.size_bytes(), cudaMemcpyHostToDevice, s),
        "cudaMemcpyAsync (layout offsets)");
    detail::check(
        cudaMemcpyAsync(d_ranks, ranks.data(), ranks.size_bytes(), cudaMemcpyHostToDevice, s),
        "cudaMemcpyAsync (layout ranks)");
    detail::check(cudaStreamSynchronize(s), "cudaStreamSynchronize (DeviceLayout)");
  } catch (...) {
    release();  // the destructor does not run for a constructor that throws
    throw;
  }
  view_.num_experts = layout.num_experts();
  view_.num_nodes = layout.num_nodes();
  view_.num_ranks = layout.num_ranks();
  view_.node_mask = d_masks;
  view_.node_offsets = d_offsets;
  view_.replica_ranks = d_ranks;
}

void DeviceLayout::release() {
  if (storage_ != nullptr) (void)cudaFree(storage_);
  storage_ = nullptr;
  view_ = LayoutView{};
}

DeviceLayout::~DeviceLayout() { release(); }

DeviceLayout::DeviceLayout(DeviceLayout&& other) noexcept
    : view_(other.view_), storage_(other.storage_) {
  other.storage_ = nullptr;
  other.view_ = LayoutView{};
}

DeviceLayout& DeviceLayout::operator=(DeviceLayout&& other) noexcept {
  if (this != &other) {
    release();
    view_ = other.view_;
    storage_ = other.storage_;
    other.storage_ = nullptr;
    other.view_ = LayoutView{};
  }
  return *this;
}

}  // namespace cobalt::cuda
