// SPDX-License-Identifier: MIT
#pragma once
// CUDA device memory for the GPU-tier jobs: allocated, filled and read back in one line each.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

namespace lftest {

/// Device memory that frees itself; null when cudaMalloc failed.
struct DeviceBytes {
  std::byte* p = nullptr;
  std::size_t n = 0;

  explicit DeviceBytes(std::size_t bytes, const std::vector<std::byte>& init = {}) : n(bytes) {
    void* raw = nullptr;
    if (cudaMalloc(&raw, std::max<std::size_t>(n, 1)) == cudaSuccess) p = static_cast<std::byte*>(raw);
    if (!init.empty()) write(init);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  ~DeviceBytes() { (void)cudaFree(p); }

  /// Copies `bytes` in and waits: a copy from pageable memory may return before its DMA lands,
  /// and the streams the tests use do not wait for the legacy stream.
  void write(const std::vector<std::byte>& bytes) const {
    if (p && cudaMemcpy(p, bytes.data(), bytes.size(), cudaMemcpyHostToDevice) == cudaSuccess)
      (void)cudaDeviceSynchronize();
  }
  [[nodiscard]] std::vector<std::byte> read(std::size_t bytes) const {
    std::vector<std::byte> out(bytes);
    if (p) (void)cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost);
    return out;
  }
  [[nodiscard]] std::vector<std::byte> read() const { return read(n); }
  [[nodiscard]] std::span<std::byte> span() const { return {p, n}; }
};

}  // namespace lftest
