// SPDX-License-Identifier: MIT
#pragma once

namespace lfbench {

struct PoolBenchOptions {
  bool quick = false;
  bool json = false;
};

/// `lavaflow-bench pool`: the memory pool against malloc and fresh Vulkan allocations.
int bench_pool(const PoolBenchOptions& options);

}  // namespace lfbench
