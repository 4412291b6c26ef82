// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// Vulkan semaphores shared as opaque POSIX fds: binary (GL, OpenCL) or timeline (CUDA, Vulkan),
/// so GPU work in different APIs and processes is ordered without CPU waits.

#include <cstdint>
#include <memory>
#include <string_view>

#include "lavaflow/core/duration.hpp"
#include "lavaflow/core/error.hpp"
#include "lavaflow/core/unique_fd.hpp"
#include "lavaflow/core/vulkan_context.hpp"

namespace lavaflow {

enum class SemaphoreKind : std::uint8_t { Binary = 1, Timeline = 2 };
[[nodiscard]] std::string_view to_string(SemaphoreKind k) noexcept;

class GpuSemaphore {
 public:
  /// A new semaphore that can be exported as an opaque fd (timeline: starts at `initial`).
  [[nodiscard]] static Result<GpuSemaphore> create(const VulkanContext& ctx, SemaphoreKind kind,
                                                   std::uint64_t initial = 0);
  /// Imports a semaphore exported elsewhere (permanently: both sides share one payload). Consumes
  /// `fd` on success only, and keeps it so export_fd() can hand the semaphore on.
  [[nodiscard]] static Result<GpuSemaphore> import(const VulkanContext& ctx, SemaphoreKind kind, UniqueFd&& fd);
  /// Whether `ctx` can export (or import) `kind` semaphores as opaque fds, and if not, why.
  [[nodiscard]] static Status supported(const VulkanContext& ctx, SemaphoreKind kind, bool import);

  GpuSemaphore(GpuSemaphore&&) noexcept;
  GpuSemaphore& operator=(GpuSemaphore&&) noexcept;
  ~GpuSemaphore();

  /// A new fd referring to this semaphore.
  [[nodiscard]] Result<UniqueFd> export_fd() const;
  [[nodiscard]] vk::Semaphore semaphore() const;
  [[nodiscard]] SemaphoreKind kind() const;

  /// Timeline only: waits on the host until the value reaches `value` (Timeout after `timeout`).
  [[nodiscard]] Status wait(std::uint64_t value, Duration timeout) const;
  /// Timeline only: sets the value from the host.
  [[nodiscard]] Status signal(std::uint64_t value) const;
  /// Timeline only: the current value.
  [[nodiscard]] Result<std::uint64_t> value() const;

 private:
  struct Impl;
  explicit GpuSemaphore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lavaflow
