// SPDX-License-Identifier: MIT
#pragma once
#include <string>

namespace lavaflow::cuda::detail {
/// The CUDA device's PCI address as sysfs spells it ("0000:3b:00.0"); empty when CUDA cannot say.
std::string pci_address(int ordinal);
}  // namespace lavaflow::cuda::detail
