// SPDX-License-Identifier: MIT
#pragma once
// lavaflow-info's CUDA / OpenCL / GL section and the interop matrix: for each exporter → importer
// pair on this machine, whether memory and semaphores can be shared, and if not, why.
#include <string>
#include <vector>

#include "lavaflow/lavaflow.hpp"

namespace lfinfo {

struct ApiDevice {
  std::string api;  ///< "CUDA", "OpenCL", "OpenGL"
  std::string name;
  std::string detail;  ///< extensions / capabilities in words
};

struct MatrixRow {
  std::string exporter, importer;
  bool memory = false;
  std::string memory_how;  ///< how, or why not
  bool semaphore = false;
  std::string semaphore_how;
};

struct InteropReport {
  std::vector<std::string> notes;  ///< APIs not built or not usable here, with the reason
  std::vector<ApiDevice> devices;
  std::vector<MatrixRow> matrix;
};

[[nodiscard]] InteropReport interop_report(const std::vector<lavaflow::DeviceCapabilities>& vulkan);

/// The accelerator list: Vulkan's devices with what every built adapter adds, merged by UUID;
/// an adapter that could not list its devices leaves its reason in `notes`.
[[nodiscard]] lavaflow::Accelerators accelerators(const std::vector<lavaflow::DeviceCapabilities>& vulkan,
                                                  std::vector<std::string>& notes);

}  // namespace lfinfo
