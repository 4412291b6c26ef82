// SPDX-License-Identifier: MIT
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "lavaflow/core/error.hpp"

namespace lfbench {

struct Row {
  std::string name;  // lavaflow-shm, lavaflow-vulkan, floor-cacheline, futex-pingpong, uds-pingpong, mpi-pingpong
  std::string mode;  // poll | block
  std::uint64_t size = 0;
  bool touched = false;  // consumer read every byte
  std::size_t samples = 0;
  double p50_ns = 0, p99_ns = 0, max_ns = 0, avg_ns = 0;
  double p25_ns = 0, p75_ns = 0;  // the spread `lavaflow-bench compare` tells noise from a change by
  double msgs_per_s = 0;          // pipelined, when measured
};

struct Config {
  int cpu_a = 0, cpu_b = 1;
  int iterations = 20000;
  int warmup = 2000;
  std::uint64_t stream_messages = 1'000'000;
  std::vector<std::uint64_t> sizes{64, 4096, 65536, 1 << 20, 16 << 20};
  std::uint64_t max_size = 16 << 20;
};

/// All rows of `lavaflow-bench local`: baselines, then each transport × wait mode × size.
lavaflow::Result<std::vector<Row>> run_local(const Config& cfg, const std::string& self);
/// The echo half (`lavaflow-bench _echo …`), run in a second process.
int echo_main(int argc, char** argv);

}  // namespace lfbench
