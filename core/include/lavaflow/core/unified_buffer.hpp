// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// One logical array with a host side and a device side. Reading or writing a side makes it
/// current first — the bytes move only when the other side was written since (lazily), as a GPU
/// copy on the context's queue ordered by the buffer's own timeline semaphore — and a write marks
/// the other side stale. On devices whose device-local memory is host-visible (integrated GPUs,
/// CPU drivers such as lavapipe) both sides are one memory and nothing ever moves.

#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>

#include "lavaflow/core/buffer.hpp"
#include "lavaflow/core/duration.hpp"
#include "lavaflow/core/error.hpp"
#include "lavaflow/core/vulkan_context.hpp"

namespace lavaflow {

class MemoryPool;
class GpuSemaphore;

enum class Access : std::uint8_t { Read, Write, ReadWrite };

struct UnifiedOptions {
  /// Where both sides come from: rented from this pool (device-local and host-visible kinds),
  /// else allocated for this buffer. The pool must have been made for the same context's device.
  MemoryPool* pool = nullptr;
  /// One memory for both sides when the device-local memory is host-visible (the default); false
  /// keeps a separate host copy anyway (to measure or test the transfers on such a device).
  bool share_when_host_visible = true;
  /// Bound on every wait for the GPU (a transfer, or device work that promised a signal).
  Duration timeout = std::chrono::seconds(10);
};

/// A point on the buffer's timeline: GPU work waits on it, or signals it.
struct UnifiedSync {
  vk::Semaphore semaphore;
  std::uint64_t value = 0;
};

/// The device side, for GPU work: the buffer range, what that work must wait for (the upload that
/// made it current) and the value it must signal when it is done with the range. Every device()
/// access promises that signal (on the GPU, or from the host through UnifiedBytes::signal): the
/// next transfer or host access waits for it.
struct DeviceAccess {
  vk::Buffer buffer;
  std::uint64_t offset = 0;
  std::uint64_t size = 0;
  UnifiedSync wait;
  UnifiedSync signal;
};

/// Which side holds the newest bytes.
enum class Newest : std::uint8_t { Both, Host, Device };

/// The untyped form (UnifiedBuffer<T> below is the typed one).
class UnifiedBytes {
 public:
  [[nodiscard]] static Result<UnifiedBytes> create(const VulkanContext& ctx, std::uint64_t bytes,
                                                   const UnifiedOptions& options = {});
  UnifiedBytes(UnifiedBytes&&) noexcept;
  UnifiedBytes& operator=(UnifiedBytes&&) noexcept;
  /// Waits (bounded) for transfers and promised device work, so no GPU still uses the memory.
  ~UnifiedBytes();

  [[nodiscard]] std::uint64_t size() const;
  /// Both sides are one memory (no transfers ever).
  [[nodiscard]] bool shared() const;
  [[nodiscard]] Newest newest() const;

  /// The host side, current: downloads first when the device side is newer (waiting for device
  /// work that promised a signal). Write access makes the device side stale.
  [[nodiscard]] Result<std::span<std::byte>> host(Access access = Access::ReadWrite);
  /// The device side, current: queues an upload first when the host side is newer (the returned
  /// wait covers it). Write access makes the host side stale.
  [[nodiscard]] Result<DeviceAccess> device(Access access = Access::ReadWrite);
  /// Signals a device access's value from the host (its GPU work was finished some other way,
  /// e.g. with a fence the caller waited on).
  [[nodiscard]] Status signal(const DeviceAccess& access);

  /// Queues the upload now (ahead of need); no-op when the device side is current.
  [[nodiscard]] Status to_device();
  /// Downloads now and waits; no-op when the host side is current.
  [[nodiscard]] Status to_host();
  /// Waits for every queued transfer and every promised device signal.
  [[nodiscard]] Status synchronize();

  /// The device side as a lava-flow buffer: what another API imports (cuda::Interop::import_buffer)
  /// to work on it; DeviceAccess::offset is relative to its VkBuffer, not to this range.
  [[nodiscard]] const Buffer& device_buffer() const;
  /// The timeline the accesses wait on and signal, as a semaphore other APIs can import (CUDA:
  /// Interop::import_semaphore); null where the driver cannot export timelines (then only Vulkan
  /// work, or a host signal, can keep an access's promise).
  [[nodiscard]] const GpuSemaphore* shareable_timeline() const;

  /// GPU copies made so far in each direction.
  [[nodiscard]] std::uint64_t uploads() const;
  [[nodiscard]] std::uint64_t downloads() const;
  /// Write accesses given out so far, host and device: a copy kept elsewhere (another GPU's,
  /// cuda::PeerSide) is current while this count is what it was when the copy was made.
  [[nodiscard]] std::uint64_t writes() const;

 private:
  struct Impl;
  explicit UnifiedBytes(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// `count` elements of a trivially copyable T, on the host and on the device.
template <class T>
requires std::is_trivially_copyable_v<T>
class UnifiedBuffer {
 public:
  [[nodiscard]] static Result<UnifiedBuffer> create(const VulkanContext& ctx, std::size_t count,
                                                    const UnifiedOptions& options = {}) {
    if (count > SIZE_MAX / sizeof(T)) return fail(Errc::InvalidArgument, "UnifiedBuffer::create", "count too large");
    LF_TRY(auto bytes, UnifiedBytes::create(ctx, count * sizeof(T), options));
    return UnifiedBuffer(std::move(bytes), count);
  }
  [[nodiscard]] std::size_t count() const { return count_; }
  /// The host elements, current (see UnifiedBytes::host).
  [[nodiscard]] Result<std::span<T>> host(Access access = Access::ReadWrite) {
    LF_TRY(auto b, bytes_.host(access));
    return std::span<T>(reinterpret_cast<T*>(b.data()), count_);
  }
  [[nodiscard]] Result<DeviceAccess> device(Access access = Access::ReadWrite) { return bytes_.device(access); }
  [[nodiscard]] UnifiedBytes& bytes() { return bytes_; }

 private:
  UnifiedBuffer(UnifiedBytes b, std::size_t count) : bytes_(std::move(b)), count_(count) {}
  UnifiedBytes bytes_;
  std::size_t count_;
};

}  // namespace lavaflow
