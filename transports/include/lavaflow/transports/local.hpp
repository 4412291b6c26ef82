// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The local transports: Vulkan IPC (ring buffers are exportable Vulkan allocations, imported into
/// the consumer's own Vulkan context) and CPU shared memory (memfd ring buffers).

#include <string>

#include "lavaflow/core/vulkan_context.hpp"
#include "lavaflow/transports/transport.hpp"

namespace lavaflow {

/// Vulkan IPC: needs a local peer that has the producer's device (same device and driver UUID).
[[nodiscard]] std::shared_ptr<const Transport> vulkan_transport();
/// CPU shared memory: needs a local peer.
[[nodiscard]] std::shared_ptr<const Transport> shm_transport();
/// Both, in preference order: Vulkan IPC, then shared memory.
[[nodiscard]] TransportSet local_transports();

/// What a hand-off between two processes' GPU work on `device` costs: empty for a CPU device; for
/// a GPU, that it time-slices between processes (a context switch per hand-off) and, on NVIDIA,
/// whether the CUDA MPS server (found through its control pipe) lets CUDA work run side by side.
[[nodiscard]] std::string gpu_sharing_note(const DeviceCapabilities& device);

}  // namespace lavaflow
