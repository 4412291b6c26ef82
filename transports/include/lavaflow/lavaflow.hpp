// SPDX-License-Identifier: MIT
#pragma once
/// @file Everything a user of lava-flow's memory and channels includes: lavaflow::core (memory,
/// Vulkan context, descriptors, fd passing) and lavaflow::transports (channels, routing, the local
/// transports). Adapters (lavaflow/cuda, /opencl, /opengl) and MPI (lavaflow/mpi) have their own.
#include "lavaflow/core/accelerators.hpp"
#include "lavaflow/core/buffer.hpp"
#include "lavaflow/core/cpu_buffer.hpp"
#include "lavaflow/core/duration.hpp"
#include "lavaflow/core/error.hpp"
#include "lavaflow/core/gpu_buffer.hpp"
#include "lavaflow/core/gpu_image.hpp"
#include "lavaflow/core/gpu_semaphore.hpp"
#include "lavaflow/core/location.hpp"
#include "lavaflow/core/pool.hpp"
#include "lavaflow/core/published_stats.hpp"
#include "lavaflow/core/transfer.hpp"
#include "lavaflow/core/unified_buffer.hpp"
#include "lavaflow/core/unique_fd.hpp"
#include "lavaflow/core/unix_socket.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "lavaflow/transports/channel.hpp"
#include "lavaflow/transports/local.hpp"
#include "lavaflow/transports/transport.hpp"
