// SPDX-License-Identifier: MIT
#pragma once
/// @file Everything of lavaflow::core in one include.
#include "lavaflow/core/buffer.hpp"
#include "lavaflow/core/channel.hpp"
#include "lavaflow/core/cpu_buffer.hpp"
#include "lavaflow/core/error.hpp"
#include "lavaflow/core/duration.hpp"
#include "lavaflow/core/gpu_buffer.hpp"
#include "lavaflow/core/gpu_image.hpp"
#include "lavaflow/core/gpu_semaphore.hpp"
#include "lavaflow/core/location.hpp"
#include "lavaflow/core/transfer.hpp"
#include "lavaflow/core/unique_fd.hpp"
#include "lavaflow/core/unix_socket.hpp"
#include "lavaflow/core/vulkan_context.hpp"
#include "lavaflow/core/wire.hpp"
