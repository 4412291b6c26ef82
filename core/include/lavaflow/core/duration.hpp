// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// How long a blocking call may wait. Every blocking call in lava-flow takes one.
#include <chrono>

namespace lavaflow {

using Duration = std::chrono::nanoseconds;
inline constexpr Duration kForever = Duration::max();

}  // namespace lavaflow
