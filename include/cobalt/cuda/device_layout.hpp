// DeviceLayout: an ExpertLayout's lookup maps copied to device memory (owning; move-only).
#pragma once

#include "cobalt/core/expert_layout.hpp"
#include "cobalt/cuda/common.hpp"

namespace cobalt::cuda {

class DeviceLayout {
 public:
  DeviceLayout() = default;
  // Allocates device memory and copies the maps on `stream`, then waits for the copy (so `layout`
  // need not outlive the call). Not for the per-step path: upload once per layout change.
  explicit DeviceLayout(const ExpertLayout& layout, Stream stream = nullptr);
  ~DeviceLayout();
  DeviceLayout(DeviceLayout&& other) noexcept;
  DeviceLayout& operator=(DeviceLayout&& other) noexcept;
  DeviceLayout(const DeviceLayout&) = delete;
  DeviceLayout& operator=(const DeviceLayout&) = delete;

  const LayoutView& view() const { return view_; }

 private:
  void release();
  LayoutView view_;
  void* storage_ = nullptr;  // one allocation holding the three arrays
};

}  // namespace cobalt::cuda
