// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// lavaflow::opencl — OpenCL on lava-flow memory without copies. Two paths:
/// - external memory: `cl_khr_external_memory_opaque_fd` imports Vulkan memory exported as an
///   opaque fd (GPU drivers); every use is bracketed by acquire/release (see `Access`);
/// - host pointer: on a CPU OpenCL device without that extension (PoCL), memory that is mapped in
///   this process (CPU shared memory, host-visible Vulkan memory) is used in place through
///   CL_MEM_USE_HOST_PTR — still zero copy, because the CPU device computes on those very bytes.
/// Semaphores: `cl_khr_external_semaphore_opaque_fd` (binary).

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "lavaflow/core/accelerators.hpp"
#include "lavaflow/core/buffer.hpp"
#include "lavaflow/core/error.hpp"
#include "lavaflow/core/gpu_semaphore.hpp"
#include "lavaflow/core/location.hpp"
#include "lavaflow/core/unique_fd.hpp"
#include "lavaflow/transports/channel.hpp"

namespace lavaflow::cl {

/// An OpenCL error code's name, e.g. "CL_INVALID_VALUE".
[[nodiscard]] std::string_view error_name(cl_int code) noexcept;

/// What one OpenCL device offers for sharing.
struct DeviceInfo {
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  std::string platform_name, name, version, driver_version;
  bool cpu = false;         ///< CL_DEVICE_TYPE_CPU
  bool uuid_known = false;  ///< cl_khr_device_uuid
  Uuid device_uuid{}, driver_uuid{};
  bool external_memory_fd = false;  ///< cl_khr_external_memory_opaque_fd
  bool external_semaphore_fd = false;
  bool host_pointer_path = false;  ///< CPU device: mapped lava-flow memory usable in place
};

/// Every OpenCL device of every platform (empty when there is no ICD).
[[nodiscard]] Result<std::vector<DeviceInfo>> devices();
[[nodiscard]] Result<DeviceInfo> describe(cl_device_id device);
/// Adds the OpenCL devices to the accelerator list (merged by UUID where cl_khr_device_uuid gives one).
[[nodiscard]] Status add_devices(Accelerators& accelerators);

enum class ImportPath : std::uint8_t { ExternalMemory, HostPointer };
[[nodiscard]] std::string_view to_string(ImportPath p) noexcept;

/// An imported buffer (owns one cl_mem reference).
class Memory {
 public:
  Memory(Memory&&) noexcept;
  Memory& operator=(Memory&&) noexcept;
  ~Memory();
  [[nodiscard]] cl_mem get() const { return mem_; }
  [[nodiscard]] ImportPath path() const { return path_; }
  [[nodiscard]] std::uint64_t size() const { return size_; }

 private:
  friend class Interop;
  Memory(cl_mem m, ImportPath p, std::uint64_t size) : mem_(m), path_(p), size_(size) {}
  cl_mem mem_ = nullptr;
  ImportPath path_ = ImportPath::ExternalMemory;
  std::uint64_t size_ = 0;
};

/// An imported binary semaphore.
class Semaphore {
 public:
  Semaphore(Semaphore&&) noexcept;
  Semaphore& operator=(Semaphore&&) noexcept;
  ~Semaphore();
  [[nodiscard]] cl_semaphore_khr get() const { return sem_; }

 private:
  friend class Interop;
  Semaphore(cl_semaphore_khr s, clReleaseSemaphoreKHR_fn release) : sem_(s), release_(release) {}
  cl_semaphore_khr sem_ = nullptr;
  clReleaseSemaphoreKHR_fn release_ = nullptr;
};

class Interop;

/// The scope in which OpenCL may use imported memory: acquired at construction (enqueued on the
/// queue), released when `release()` is called or the scope ends. Host-pointer memory needs no
/// hand-off; the scope is then free.
class Access {
 public:
  Access(Access&&) noexcept;
  Access& operator=(Access&&) = delete;
  ~Access();
  /// Enqueues the release; reports the OpenCL error, if any.
  [[nodiscard]] Status release();

 private:
  friend class Interop;
  Access(clEnqueueReleaseExternalMemObjectsKHR_fn release_fn, cl_command_queue q, std::vector<cl_mem> objects)
      : release_(release_fn), queue_(q), objects_(std::move(objects)) {}
  clEnqueueReleaseExternalMemObjectsKHR_fn release_ = nullptr;
  cl_command_queue queue_ = nullptr;
  std::vector<cl_mem> objects_;
};

/// The importer for one OpenCL context and device.
class Interop {
 public:
  /// Wraps (and retains) a user's context and device.
  [[nodiscard]] static Result<Interop> create(cl_context context, cl_device_id device);
  Interop(Interop&&) noexcept;
  Interop& operator=(Interop&&) noexcept;
  ~Interop();

  [[nodiscard]] const DeviceInfo& device() const { return info_; }
  [[nodiscard]] cl_context context() const { return context_; }

  /// Imports a lava-flow buffer by the best path this device has: external memory for Vulkan
  /// memory from the same device, else the host pointer on a CPU device. Unsupported, naming why,
  /// when neither applies (device-local memory on a device without the extension, …).
  [[nodiscard]] Result<Memory> import_buffer(const lavaflow::Buffer& buffer,
                                             cl_mem_flags flags = CL_MEM_READ_WRITE) const;
  /// External-memory import of an exported range. Consumes `fd` on success only.
  [[nodiscard]] Result<Memory> import_buffer(const ExportDescriptor& desc, UniqueFd&& fd,
                                             cl_mem_flags flags = CL_MEM_READ_WRITE) const;
  /// Imports a binary semaphore. Consumes `fd` on success only.
  [[nodiscard]] Result<Semaphore> import_semaphore(UniqueFd&& fd) const;
  /// Enqueues a wait on (or a signal of) an imported semaphore.
  [[nodiscard]] Status wait(cl_command_queue queue, const Semaphore& s) const;
  [[nodiscard]] Status signal(cl_command_queue queue, const Semaphore& s) const;

  /// Acquires `memory` for OpenCL on `queue` (enqueued), released when the Access ends.
  [[nodiscard]] Result<Access> acquire(cl_command_queue queue, std::span<const Memory* const> memory) const;

 private:
  struct Fns;
  Interop(cl_context c, cl_device_id d, DeviceInfo info, std::shared_ptr<const Fns> fns);
  cl_context context_ = nullptr;
  cl_device_id device_ = nullptr;
  DeviceInfo info_;
  std::shared_ptr<const Fns> fns_;
};

/// A channel consumer's OpenCL view: each ring buffer imported once and reused. Given the
/// consumer, it also orders each message's hand-off on the GPU where OpenCL and the consumer's
/// Vulkan device share binary semaphores: the consumer's Vulkan queue turns the channel's timeline
/// point into a semaphore OpenCL waits on (wait), and OpenCL's signal into the message's GPU
/// release (release), so no CPU waits for either GPU. Elsewhere wait() waits on the CPU and
/// release() finishes the queue. (Open the consumer with host_wait_for_gpu = false.)
class ChannelImports {
 public:
  explicit ChannelImports(const Interop& cl, cl_mem_flags flags = CL_MEM_READ_WRITE) : cl_(&cl), flags_(flags) {}
  ChannelImports(const Interop& cl, const Consumer& consumer, cl_mem_flags flags = CL_MEM_READ_WRITE)
      : cl_(&cl), flags_(flags), consumer_(&consumer) {}
  /// Waits for the consumer's Vulkan queue to be done with the shared semaphores (finish the
  /// OpenCL queues that used them first); destroy it before the consumer.
  ~ChannelImports();
  ChannelImports(const ChannelImports&) = delete;
  ChannelImports& operator=(const ChannelImports&) = delete;
  [[nodiscard]] Result<const Memory*> buffer(const Received& message);
  /// Work enqueued on `queue` after this sees the message complete (no-op when the producer did not
  /// order it on its GPU).
  [[nodiscard]] Status wait(cl_command_queue queue, const Received& message);
  /// Ends OpenCL's use of the message after the work enqueued on `queue` so far; the message can
  /// then be dropped at once.
  [[nodiscard]] Status release(cl_command_queue queue, Received& message);
  [[nodiscard]] std::size_t imported() const { return cache_.size(); }
  /// Whether wait() and release() go through semaphores (else through the CPU).
  [[nodiscard]] bool gpu_handoff() const { return cl_ready_.has_value(); }

 private:
  Status setup();
  const Interop* cl_;
  cl_mem_flags flags_;
  const Consumer* consumer_ = nullptr;
  std::unordered_map<const lavaflow::Buffer*, Memory> cache_;
  bool tried_ = false;
  std::optional<GpuSemaphore> vk_ready_, vk_done_;  // Vulkan → OpenCL (data), OpenCL → Vulkan (release)
  std::optional<Semaphore> cl_ready_, cl_done_;
};

}  // namespace lavaflow::cl
