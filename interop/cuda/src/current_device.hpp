// SPDX-License-Identifier: MIT
#pragma once
#include <cuda_runtime_api.h>

namespace lavaflow::cuda::detail {

/// Restores the calling thread's current device when it goes: calls that make another device
/// current leave the caller's as they found it.
class KeepCurrentDevice {
 public:
  KeepCurrentDevice() { had_ = cudaGetDevice(&device_) == cudaSuccess; }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;
  ~KeepCurrentDevice() {
    if (had_) (void)cudaSetDevice(device_);
  }

 private:
  int device_ = 0;
  bool had_ = false;
};

}  // namespace lavaflow::cuda::detail
