// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// CPU memory in four strategies behind one interface. Every CPU buffer is a memfd, so it can be
/// shared with another process by fd; the strategies differ in where and how the pages live.

#include <memory>
#include <optional>
#include <string>
#include <vulkan/vulkan.hpp>

#include "lavaflow/core/buffer.hpp"

namespace lavaflow {

class VulkanContext;

enum class CpuStrategy : std::uint8_t {
  Auto,          ///< let lava-flow choose (see choose_cpu_strategy)
  SharedMemory,  ///< memfd, 4 KiB pages
  NumaBound,     ///< memfd bound (mbind) to one NUMA node
  HugePages,     ///< memfd with MFD_HUGETLB
  GpuPinned,     ///< memfd imported into Vulkan as host memory (VK_EXT_external_memory_host)
};
[[nodiscard]] std::string_view to_string(CpuStrategy s) noexcept;
[[nodiscard]] BufferKind kind_of(CpuStrategy s) noexcept;
/// The strategy behind a CPU buffer kind (the inverse of kind_of; SharedMemory for other kinds).
[[nodiscard]] CpuStrategy strategy_of(BufferKind k) noexcept;

/// What this machine offers to the CPU strategies.
struct CpuTopology {
  bool numa_library = false;  ///< built with libnuma and numa_available() succeeded
  int numa_nodes = 1;
  std::uint64_t huge_page_size = 0;  ///< default huge page size in bytes (0: none)
  std::uint64_t huge_pages_total = 0;
  std::uint64_t huge_pages_free = 0;
  int cpus = 1;

  [[nodiscard]] static CpuTopology detect();
};

struct CpuBufferOptions {
  std::uint64_t size = 0;
  CpuStrategy strategy = CpuStrategy::Auto;
  /// NUMA node for NumaBound; -1: the node of the calling CPU.
  int numa_node = -1;
  /// The GPU that should read the memory directly (GpuPinned; Auto prefers GpuPinned when set).
  const VulkanContext* gpu = nullptr;
  /// When the requested strategy is unavailable: false falls back to SharedMemory with the reason
  /// recorded; true returns an Unsupported error instead.
  bool strict = false;
};

struct StrategyChoice {
  CpuStrategy strategy = CpuStrategy::SharedMemory;
  std::string reason;
};

/// Decides the strategy for `options` on `topo` (resolves Auto, and falls back when the requested
/// strategy cannot work here), with the reason in words. Does not allocate.
[[nodiscard]] StrategyChoice choose_cpu_strategy(const CpuTopology& topo, const CpuBufferOptions& options);

class CpuBuffer final : public Buffer {
 public:
  [[nodiscard]] static Result<CpuBuffer> allocate(const CpuBufferOptions& options);
  /// Same, with a topology supplied by the caller (tests; avoids re-reading /sys and /proc).
  [[nodiscard]] static Result<CpuBuffer> allocate(const CpuBufferOptions& options, const CpuTopology& topo);
  /// Maps a CPU buffer exported by another process. Checks that the fd is a memfd at least as
  /// large as the descriptor says and sealed against shrinking. Consumes `fd` on success only.
  [[nodiscard]] static Result<CpuBuffer> import(const ExportDescriptor& desc, UniqueFd&& fd);

  CpuBuffer(CpuBuffer&&) noexcept;
  CpuBuffer& operator=(CpuBuffer&&) noexcept;
  ~CpuBuffer() override;

  [[nodiscard]] std::uint64_t size() const override;
  [[nodiscard]] BufferKind kind() const override;
  [[nodiscard]] std::byte* host_ptr() const override;
  [[nodiscard]] Result<Export> export_handle() const override;

  [[nodiscard]] CpuStrategy strategy() const;
  /// Why this strategy (including any fallback).
  [[nodiscard]] const std::string& reason() const;
  /// For GpuPinned: the Vulkan buffer over the same pages; null handle otherwise.
  [[nodiscard]] vk::Buffer gpu_buffer() const;

  struct Impl;  ///< internal

 private:
  explicit CpuBuffer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace lavaflow
