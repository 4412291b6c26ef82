// SPDX-License-Identifier: MIT
#pragma once
// What the mesh's CUDA targets (lavaflow::mesh_cuda, lavaflow::mesh_nccl) share: CUDA errors in
// the error model, and a current device for a scope. Private to them: lavaflow::mesh itself has no
// CUDA.
#include <cuda_runtime_api.h>

#include <string>
#include <string_view>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/core/error.hpp"

namespace lavaflow::mesh {

inline Status cuda_ok(cudaError_t e, std::string_view call) {
  if (e == cudaSuccess) return {};
  (void)cudaGetLastError();  // a non-sticky error must not be reported again by the next call
  return fail(e == cudaErrorMemoryAllocation ? Errc::OutOfMemory : Errc::Driver, std::string(call),
              str_format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e)));
}

/// Makes `device` current for the scope and puts the previous one back on every way out: the
/// calling thread is the user's, and its current device is the user's too.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      previous_ = -1;
    }
    if (previous_ != device) set_ = cuda_ok(cudaSetDevice(device), "cudaSetDevice");
    changed_ = previous_ != device && set_;
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  ~DeviceScope() {
    if (changed_ && previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  /// Whether the device could be made current.
  [[nodiscard]] const Status& status() const { return set_; }

 private:
  int previous_ = -1;
  bool changed_ = false;
  Status set_;
};

/// Makes this thread's stream capture mode relaxed for the scope: calls that are refused while
/// another thread captures in the global mode (an event query, say) are then allowed here, where
/// they touch no captured stream.
class CaptureModeScope {
 public:
  CaptureModeScope() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  CaptureModeScope(const CaptureModeScope&) = delete;
  CaptureModeScope& operator=(const CaptureModeScope&) = delete;
  ~CaptureModeScope() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

}  // namespace lavaflow::mesh
