// SPDX-License-Identifier: MIT
#pragma once
// CUDA runtime helpers that the adapter's sources share.
#include <cuda_runtime_api.h>

#include "lavaflow/core/detail/format.hpp"
#include "lavaflow/cuda/cuda.hpp"

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

/// A CUDA failure of `what`, inside `call`.
inline Status cuda_step(cudaError_t e, const char* what, const char* call) {
  if (e == cudaSuccess) return {};
  return std::unexpected(to_error(e, what).within(call));
}

/// Makes `device` current and checks that `stream` is one of its streams (the null stream is its
/// default stream).
inline Status stream_of(cudaStream_t stream, int device, const char* what, const char* call) {
  LF_TRY_STATUS(cuda_step(cudaSetDevice(device), "cudaSetDevice", call));
  int on = -1;
  LF_TRY_STATUS(cuda_step(cudaStreamGetDevice(stream, &on), "cudaStreamGetDevice", call));
  if (on != device)
    return fail(Errc::InvalidArgument, call,
                str_format("the stream belongs to CUDA device {}; {} is on device {}", on, what, device));
  return {};
}

}  // namespace lavaflow::cuda::detail
