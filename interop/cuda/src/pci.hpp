// SPDX-License-Identifier: MIT
#pragma once
#include <string>

#include "lavaflow/core/error.hpp"

namespace lavaflow::cuda::detail {
/// cudaGetDeviceCount, its error cleared from the runtime's sticky state.
Result<int> device_count();
/// The CUDA device's PCI address as sysfs spells it ("0000:3b:00.0"); empty when CUDA cannot say.
std::string pci_address(int ordinal);
}  // namespace lavaflow::cuda::detail
